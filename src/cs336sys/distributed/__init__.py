"""Everything distributed, each concern in its own module; the model never knows it is distributed.

    process_group   joining a process group (NCCL on GPUs, gloo on the CPU), always with a timeout
    spawn           run a function on N ranks in fresh processes (tests, tools); fails fast, names the rank
    allreduce       all-reduce timing on the current rank, maximum across ranks, algorithm and bus bandwidth
    ddp_base        what every DDP wrapper shares: broadcast, gradient groups and buckets, no_sync, averaging
    ddp             the DDP wrappers: naive, flat, overlapped per parameter, bucketed (and build_ddp by name)
    sharded_optimizer  optimizer state sharding: each rank steps its share, owners broadcast the updates
    fsdp            fully-sharded data parallel: when layers are gathered, prefetched, reduced
    fsdp_layer      one sharded layer: which layers, flat padded shard, gather, reduce-scatter, saved-tensor hooks
    experiments     the DDP experiments (all-reduce, DDP steps, profiled steps) the pipeline runs
    sharding_experiments  the optimizer-sharding and FSDP experiments

(The job runner imports `process_group`, so this file is part of every experiment's code hash:
an edit here re-runs every experiment.)
"""
