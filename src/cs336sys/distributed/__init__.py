"""Everything distributed, each concern in its own module; the model never knows it is distributed.

    process_group   joining a process group (NCCL on GPUs, gloo on the CPU), always with a timeout
    spawn           run a function on N ranks in fresh processes (tests, tools); fails fast, names the rank
    allreduce       all-reduce timing on the current rank, maximum across ranks, algorithm and bus bandwidth
    ddp_base        what every DDP wrapper shares: broadcast, gradient groups and buckets, no_sync, averaging
    ddp             the DDP wrappers: naive, flat, overlapped per parameter, bucketed (and build_ddp by name)
    ddp_views       bucketed DDP whose gradients are views of the buckets (no copies in or out)
    sharded_optimizer  optimizer state sharding: each rank steps its share, owners broadcast the updates
    fsdp_unit       one FSDP unit: a flat padded fp32 shard, its gather and reduce-scatter, saved-tensor hooks
    fsdp            fully-sharded data parallel by module hooks, a unit per layer or per k blocks
    fsdp_blocks     the same units run explicitly, block by block (the leaderboard step)
    experiments     the DDP experiments (all-reduce, DDP steps, profiled steps) the pipeline runs
    sharding_experiments  the optimizer-sharding and FSDP experiments
"""
