# Problems distributed_communication_single_node (12) and the DDP problems (13-19): all-reduce
# benchmark (NCCL over the GPUs, gloo over CPU processes), DDP variants' training steps against no
# communication and PyTorch's DistributedDataParallel in the same job, and one profiled step of
# each variant for the overlap timeline.

AR = GRID["allreduce"]
DDP = GRID["ddp"]

# jobs not measured yet (no host with that many GPUs lent): left out; `--config grid=next` runs them
AR_PENDING = set(AR.get("pending", []))
for backend, device, worlds in (("nccl", "cuda", AR["nccl_world_sizes"]), ("gloo", "cpu", AR["gloo_world_sizes"])):
    if device == "cuda" and DEVICE != "cuda":
        continue  # the CPU smoke grid has no NCCL
    for world in worlds:
        if f"{backend}-{world}" in AR_PENDING:
            continue
        points = [point("allreduce", AR, size_bytes=b, device=device) for b in AR["sizes_bytes"]]
        experiment_job(
            "allreduce",
            f"{backend}-{world}",
            points,
            [f"results/allreduce/{backend}-{world}/{p['size_bytes']}.json" for p in points],
            gpus=world if device == "cuda" else 0,
            ranks=world,
        )


def ddp_points(size, dtype, grid=DDP, view_sizes=(), buckets=None, **extra):
    variants = [(v, None) for v in grid["variants"]]
    variants += [("bucketed", float(b)) for b in (grid["bucket_sizes_mb"] if buckets is None else buckets)]
    variants += [("bucket_view", float(b)) for b in view_sizes]
    variants += [("torch_ddp", float(b)) for b in grid["torch_ddp_bucket_sizes_mb"]]
    return [point("ddp_step", DDP, size=size, variant=v, bucket_size_mb=b, dtype=dtype, **extra) for v, b in variants]


def ddp_name(p):
    return p["variant"] + (f"-{p['bucket_size_mb']:g}MB" if p["bucket_size_mb"] is not None else "")


def round_name(p):
    return f"r{p.get('round', 0)}"


def steps_of(grid, size, dtype):
    """Timed steps a round: the block's, or its `long_steps` for a (size, dtype) whose step is over a second."""
    return grid.get("long_steps", {}).get(f"{size}-{dtype}", setting("ddp_step", grid, "steps"))


def in_rounds(points, rounds):
    """Every point once a round, the rounds one after another (ABC ABC ABC): the variants a job compares
    alternate in time, so a drift of the machine falls on all of them."""
    return [p | {"round": r} for r in range(rounds) for p in points]


# One job per (size, dtype, world size) runs every variant in interleaved rounds; the jobs listed under
# `one_round` keep the points and names they were measured with before rounds (one round of 6 steps).
ONE_ROUND = DDP.get("one_round", {"jobs": []})
# jobs not measured yet (a session's GPU time ran out): left out of the grid; `--config grid=next` runs them
DDP_PENDING = set(DDP.get("pending", []))
for size in DDP["sizes"]:
    for dtype in DDP["dtypes"]:
        for world in DDP["world_sizes"]:
            if world == 2 and f"{size}-{dtype}" in ONE_ROUND["jobs"]:
                points = ddp_points(size, dtype, buckets=ONE_ROUND["bucket_sizes_mb"], steps=ONE_ROUND["steps"])
                job, names = f"{size}-{dtype}", [ddp_name(p) for p in points]
            else:
                points = in_rounds(ddp_points(size, dtype, steps=steps_of(DDP, size, dtype)), DDP["rounds"])
                job, names = f"{size}-{dtype}-ws{world}", [f"{ddp_name(p)}-{round_name(p)}" for p in points]
            if job in DDP_PENDING:
                continue
            experiment_job(
                "ddp_step",
                job,
                points,
                [f"results/ddp_step/{job}/{name}.json" for name in names],
                gpus=world,
            )

# Host overhead: the gradient-as-bucket-view wrapper (bucket_view) beside ours and PyTorch's, each (size,
# dtype, world size) a job of its own with its own baselines (series "host": the section shows them
# apart from the grid's jobs, and their time is not the grid's). World size 1: single-rank proxies,
# one GPU in a process group of one: every hook, bucket and all-reduce launch, no transfer.
HOST = DDP["host"]
HOST_TIMINGS = []
for size in HOST["sizes"]:
    for dtype in HOST["dtypes"]:
        for world in HOST["world_sizes"]:
            points = ddp_points(
                size,
                dtype,
                HOST,
                HOST["view_bucket_sizes_mb"],
                series="host",
                single_rank_proxy=world == 1,
                steps=setting("ddp_step", HOST, "steps"),
            )
            job = f"host-{size}-{dtype}-" + ("proxy1" if world == 1 else f"ws{world}")
            experiment_job(
                "ddp_step", job, points, [f"results/ddp_step/{job}/{ddp_name(p)}.json" for p in points], gpus=world
            )
            HOST_TIMINGS.append(f"benchmarks/ddp_step/{job}.tsv")

TRACE = DDP["trace"]
TRACE_BUCKET_MB = setting("ddp_trace", TRACE, "bucket_size_mb")
if "bucketed" in TRACE["variants"] and TRACE_BUCKET_MB is None:
    raise WorkflowError("ddp.trace.bucket_size_mb: the bucketed variant's trace needs a bucket size (MiB)")
TRACE_POINTS = [
    point(
        "ddp_trace",
        TRACE,
        variant=v,
        context_length=setting("ddp_step", DDP, "context_length"),
        batch_size=setting("ddp_step", DDP, "batch_size"),
        bucket_size_mb=float(TRACE_BUCKET_MB) if v == "bucketed" else None,
    )
    for v in TRACE["variants"]
]
experiment_job(
    "ddp_trace",
    "",
    TRACE_POINTS,
    [f"results/ddp_trace/{ddp_name(p)}.json" for p in TRACE_POINTS],
    gpus=min(DDP["world_sizes"]),
    rendered=True,
)

section(
    "ddp",
    results_of("allreduce", "ddp_step", "ddp_trace")
    # each job's wall time: the grid's machine time (the host series' jobs are not the grid's)
    + [t for t in timings_of("allreduce", "ddp_step", "ddp_trace") if t not in HOST_TIMINGS],
    extra={"allreduce_reference": AR.get("reference"), "pending": sorted(DDP_PENDING)},
)
