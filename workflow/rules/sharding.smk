# Problems optimizer_state_sharding_accounting (22) and fsdp_accounting (24): memory and step time
# of sharded optimizer state (ours and ZeroRedundancyOptimizer) and of FSDP (ours and FSDP2), each
# job comparing its variants on the same GPUs; ours with other units of gathering, and on one GPU
# (a proxy for its host-side overhead); one profiled FSDP step for the gather timeline.

SHARD = GRID["sharding"]

for size in SHARD["sizes"]:
    points = [point("sharding_memory", SHARD, size=size, variant=v) for v in SHARD["optimizer_variants"]]
    experiment_job(
        "sharding_memory",
        size,
        points,
        [f"results/sharding_memory/{size}/{p['variant']}.json" for p in points],
        gpus=SHARD["world_size"],
    )
    points = [
        point("fsdp_step", SHARD, size=size, variant=v, compute_dtype=d)
        for d in SHARD["fsdp_compute_dtypes"]
        for v in SHARD["fsdp_variants"]
    ]
    experiment_job(
        "fsdp_step",
        size,
        points,
        [f"results/fsdp_step/{size}/{p['variant']}-{p['compute_dtype']}.json" for p in points],
        gpus=SHARD["world_size"],
    )

UNITS = SHARD["fsdp_units"]
for size in UNITS["sizes"]:
    points = [
        point("fsdp_step", SHARD, size=size, variant="ours", compute_dtype=d, unit=u)
        for d in UNITS["compute_dtypes"]
        for u in UNITS["units"]
    ]
    experiment_job(
        "fsdp_step",
        f"{size}-units",
        points,
        [f"results/fsdp_step/{size}-units/ours-{p['compute_dtype']}-{p['unit']}.json" for p in points],
        gpus=SHARD["world_size"],
    )

PROXY = SHARD["fsdp_proxy"]
for size in PROXY["sizes"]:
    points = [
        point(
            "fsdp_step",
            SHARD,
            size=size,
            variant="ours",
            compute_dtype=setting("fsdp_step", PROXY, "compute_dtype"),
            unit=u,
            single_rank_proxy=True,
        )
        for u in PROXY["units"]
    ]
    experiment_job(
        "fsdp_step",
        f"{size}-proxy",
        points,
        [f"results/fsdp_step/{size}-proxy/ours-{p['compute_dtype']}-{p['unit']}.json" for p in points],
        gpus=1,
    )

TRACE = SHARD["trace"]
experiment_job(
    "fsdp_trace",
    "",
    [
        # the trace's own warm-up (the settings' default), not the timed steps' one
        point(
            "fsdp_trace",
            TRACE,
            variant="ours",
            context_length=setting("fsdp_step", SHARD, "context_length"),
            batch_size=setting("fsdp_step", SHARD, "batch_size"),
        )
    ],
    [f"results/fsdp_trace/ours-{setting('fsdp_trace', TRACE, 'compute_dtype')}.json"],
    gpus=SHARD["world_size"],
    rendered=True,
)

section(
    "sharding",
    results_of("sharding_memory", "fsdp_step", "fsdp_trace") + timings_of("sharding_memory", "fsdp_step", "fsdp_trace"),
)
