# Problems optimizer_state_sharding_accounting (22) and fsdp_accounting (24): memory and step time
# of sharded optimizer state (ours and ZeroRedundancyOptimizer) and of FSDP (ours and FSDP2), each
# job comparing its variants on the same GPUs; ours with other units of gathering, and on one GPU
# (a proxy for its host-side overhead); one profiled FSDP step for the gather timeline.

SHARD = GRID["sharding"]


def steps_of(experiment, size, dtype):
    """Timed steps a round: the block's, or its `long_steps` for a (size, dtype) whose step is over a second."""
    return SHARD.get("long_steps", {}).get(f"{size}-{dtype}", setting(experiment, SHARD, "steps"))


def in_rounds(points, rounds):
    """Every point once a round, the rounds one after another (ABC ABC ABC): see ddp.smk."""
    return [p | {"round": r} for r in range(rounds) for p in points]


def fsdp_name(p):
    unit = f"-{p['unit']}" if p["variant"] == "ours" else ""  # FSDP2 shards per block, always
    return f"{p['variant']}{unit}-{p['compute_dtype']}-r{p['round']}"


# One job per (size, world size) for each experiment, its variants in interleaved rounds. The optimizer
# sharding jobs listed under `one_round` keep the points and names they were measured with before rounds.
ONE_ROUND = SHARD.get("one_round", {"jobs": []})
# "<experiment>/<job>" not measured yet (a session's GPU time ran out): left out; `--config grid=next` runs them
PENDING = set(SHARD.get("pending", []))


def sharding_memory_job(size, world):
    """The optimizer-sharding job of (size, world size): its name, points and result files."""
    variants = [point("sharding_memory", SHARD, size=size, variant=v) for v in SHARD["optimizer_variants"]]
    if world == 2 and size in ONE_ROUND["jobs"]:
        points = [p | {"steps": ONE_ROUND["steps"]} for p in variants]
        return size, points, [p["variant"] for p in points]
    steps = steps_of("sharding_memory", size, setting("sharding_memory", SHARD, "dtype"))
    points = in_rounds([p | {"steps": steps} for p in variants], SHARD["rounds"])
    return f"{size}-ws{world}", points, [f"{p['variant']}-r{p['round']}" for p in points]


def fsdp_job(size, world):
    """The FSDP job of (size, world size): ours at each unit of gathering beside FSDP2 (one unit per
    block), in each compute dtype, in rounds."""
    variants = [
        point("fsdp_step", SHARD, size=size, variant=v, compute_dtype=d, unit=u, steps=steps_of("fsdp_step", size, d))
        for d in SHARD["fsdp_compute_dtypes"]
        for v in SHARD["fsdp_variants"]
        for u in (SHARD["fsdp_units"] if v == "ours" else ["layer"])
    ]
    points = in_rounds(variants, SHARD["rounds"])
    return f"{size}-ws{world}", points, [fsdp_name(p) for p in points]


for size in SHARD["sizes"]:
    for world in SHARD["world_sizes"]:
        for experiment, make in (("sharding_memory", sharding_memory_job), ("fsdp_step", fsdp_job)):
            job, points, names = make(size, world)
            if f"{experiment}/{job}" in PENDING:
                continue
            results = [f"results/{experiment}/{job}/{name}.json" for name in names]
            experiment_job(experiment, job, points, results, gpus=world)

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
            steps=setting("fsdp_step", PROXY, "steps"),  # the proxy block's, not the 2-rank jobs'
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
    gpus=min(SHARD["world_sizes"]),
    rendered=True,
)

section(
    "sharding",
    results_of("sharding_memory", "fsdp_step", "fsdp_trace") + timings_of("sharding_memory", "fsdp_step", "fsdp_trace"),
    extra={"pending": sorted(PENDING)},
)
