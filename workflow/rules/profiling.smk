# Problems nsys_profile (2), memory_profiling (5) and gradient_checkpointing (6, 2026): kernel tables of
# annotated steps, allocator snapshots with their timelines, saved-for-backward accounting, and a sweep
# of checkpoint group sizes. One job per (experiment, size): process start, imports and CUDA
# initialisation are paid once per job; each point still has its own result file.

PROF = GRID["profiling"]
MEM = GRID["memory"]

# [size, context length] not measured yet: left out of that size's job; `--config grid=next` runs them
PROF_PENDING = {(str(size), int(ctx)) for size, ctx in PROF.get("pending", [])}
# (a grid without the size, such as the smoke grid, has nothing pending there)
if unknown := sorted(p for p in PROF_PENDING if p[0] in PROF["sizes"] and p[1] not in PROF["context_lengths"]):
    raise ValueError(f"profiling.pending names context lengths not in the grid: {unknown}")
for size in PROF["sizes"]:
    points = [
        point("kernel_profile", PROF, size=size, context_length=ctx, mode=mode, dtype=dtype)
        for ctx in PROF["context_lengths"]
        if (size, ctx) not in PROF_PENDING
        for mode in PROF["modes"]
        for dtype in PROF["dtypes"]
    ]
    experiment_job(
        "kernel_profile",
        size,
        points,
        [f"results/kernel_profile/{size}/{p['mode']}-{p['dtype']}-ctx{p['context_length']}.json" for p in points],
    )

SNAP = MEM["snapshots"]
for size in SNAP["sizes"]:
    # Short contexts first: a long context's out-of-memory leaves nothing behind for the next point anyway
    # (the runner frees the cache), but the cheap points are done before the slow ones.
    points = [
        point("memory_snapshot", SNAP, size=size, context_length=ctx, mode=mode, dtype=dtype)
        for ctx in sorted(SNAP["context_lengths"])
        for dtype in SNAP["dtypes"]
        for mode in SNAP["modes"]
    ]
    # rendered: each point's summary JSON and timeline PNG are committed beside its result
    experiment_job(
        "memory_snapshot",
        size,
        points,
        [f"results/memory_snapshot/{size}/{p['mode']}-{p['dtype']}-ctx{p['context_length']}.json" for p in points],
        rendered=True,
    )

SAVED = MEM["saved_tensors"]
for size in SAVED["sizes"]:
    points = [
        point("saved_tensors", SAVED, size=size, context_length=ctx, dtype=dtype)
        for ctx in SAVED["context_lengths"]
        for dtype in SAVED["dtypes"]
    ]
    experiment_job(
        "saved_tensors",
        size,
        points,
        [f"results/saved_tensors/{size}/{p['dtype']}-ctx{p['context_length']}.json" for p in points],
    )

CKPT = MEM["checkpointing"]
CKPT_NAME = "{}-{}-ctx{}-b{}".format(
    *(setting("checkpointing", CKPT, k) for k in ("size", "dtype", "context_length", "batch_size"))
)
CKPT_POINTS = [point("checkpointing", CKPT, checkpoint_blocks=k) for k in CKPT["group_sizes"]]
experiment_job(
    "checkpointing",
    CKPT_NAME,
    CKPT_POINTS,
    [f"results/checkpointing/{CKPT_NAME}/k{p['checkpoint_blocks']}.json" for p in CKPT_POINTS],
)

section(
    "profiling",
    results_of("kernel_profile") + timings_of("kernel_profile"),
    extra={"pending": [f"{size} at {ctx}" for size, ctx in sorted(PROF_PENDING) if size in PROF["sizes"]]},
)
section(
    "memory",
    results_of("memory_snapshot", "saved_tensors", "checkpointing")
    + timings_of("memory_snapshot", "saved_tensors", "checkpointing"),
)
