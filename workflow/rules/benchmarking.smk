# Problems benchmarking_script (1), benchmarking_mixed_precision (4c), torch_compile (8b), and the
# matmul ceilings that MFU divides by. One job per (size, compile mode) amortises process start,
# imports and CUDA initialisation over its points; each point still has its own result file.

BENCH = GRID["benchmarking"]
SWEEP = GRID["warmup_sweep"]
PEAK = GRID["peak"]
COMPILED = {b["compile"]: b for b in BENCH.get("compiled", [])}
if len(COMPILED) != len(BENCH.get("compiled", [])):
    raise WorkflowError("benchmarking.compiled: one block per compile method")


def benchmark_points(size, compile_mode):
    block = BENCH if compile_mode == "eager" else {**BENCH, **COMPILED[compile_mode]}
    return [
        point(
            "benchmarking",
            BENCH,
            size=size,
            context_length=ctx,
            mode=mode,
            dtype=dtype,
            compile=compile_mode,
            optimizer="ours",
        )
        for ctx in block["context_lengths"]
        for dtype in block["dtypes"]
        for mode in block["modes"]
    ]


for size in BENCH["sizes"]:
    for compile_mode in ["eager"] + [c for c, b in COMPILED.items() if size in b.get("sizes", BENCH["sizes"])]:
        points = benchmark_points(size, compile_mode)
        experiment_job(
            "benchmarking",
            f"{size}-{compile_mode}",
            points,
            [
                f"results/benchmarking/{p['size']}-{p['compile']}/{p['mode']}-{p['dtype']}-ctx{p['context_length']}.json"
                for p in points
            ],
        )

# One cold process per size runs the modes in order (forward, forward+backward, train step): the
# first mode sees process start-up costs (CUDA context, cuBLAS handles), later modes the first use
# of their new kernels (backward, optimizer) and allocator growth. Per-mode processes would cost
# ~5 s of `import torch` each on the H100 host, a quarter of the whole run's wall time.
for size in SWEEP["sizes"]:
    points = [
        point(
            "warmup",
            SWEEP,
            size=size,
            mode=mode,
            steps=max(SWEEP["warmups"]) + SWEEP["steps"],
            measured_steps=SWEEP["steps"],
            order_in_process=i,
        )
        for i, mode in enumerate(SWEEP["modes"])
    ]
    experiment_job("warmup", size, points, [f"results/warmup/{size}/{p['mode']}.json" for p in points])

PEAK_POINTS = [point("matmul_peak", PEAK, dtype=d) for d in PEAK["dtypes"]]
experiment_job("matmul_peak", "", PEAK_POINTS, [f"results/matmul_peak/{p['dtype']}.json" for p in PEAK_POINTS])

# The optimised-step series: per size, one process runs the configurations in order, each adding one
# technique to the one before ("plain" adds none): cs336sys.training.optimized.
OPT = GRID.get("optimized_step") or {"sizes": []}
PENDING = {(str(size), name) for size, name in OPT.get("pending", [])}  # not measured yet
if unknown := sorted(p for p in PENDING if p[1] not in OPT.get("series", [])):
    raise ValueError(f"optimized_step.pending names configurations not in the series: {unknown}")


def series_points(experiment, size):
    """A size's series as points of `experiment`: each configuration with the techniques of those before it,
    less the pending ones (nor does a pending technique join the configurations after it)."""
    techniques, points = [], []
    for name in OPT.get("series", []):
        if (size, name) in PENDING:
            continue
        techniques = techniques + ([] if name == "plain" else [name])
        points.append(point(experiment, OPT, size=size, configuration=name, techniques=techniques))
    return points


for size in OPT["sizes"]:
    points = series_points("optimized_step", size)
    experiment_job(
        "optimized_step", size, points, [f"results/optimized_step/{size}/{p['configuration']}.json" for p in points]
    )
if not OPT["sizes"]:
    experiment_job("optimized_step", "", [], [])  # declared; the main grid has no points until measured

# The same series in interleaved rounds (cs336sys.bench_optimized_rounds): per size under `rounds`, every
# configuration once a round, `count` rounds in one process, round r starting from the r-th configuration.
OPT_ROUNDS = OPT.get("rounds") or {"sizes": []}
for size in OPT_ROUNDS["sizes"]:
    points = rotated_rounds(series_points("optimized_step_rounds", size), OPT_ROUNDS["count"])
    experiment_job(
        "optimized_step_rounds",
        size,
        points,
        [f"results/optimized_step_rounds/{size}/{p['configuration']}-r{p['round']}.json" for p in points],
    )
if not OPT_ROUNDS["sizes"]:
    experiment_job("optimized_step_rounds", "", [], [])  # declared; points in the overlay next until measured

section(
    "benchmarking",
    # the pipeline-overhead table reads every job's wall-clock record
    results_of("benchmarking", "warmup", "matmul_peak", "optimized_step", "optimized_step_rounds")
    + timings_of("benchmarking", "warmup", "matmul_peak", "mixed_precision_accumulation", "autocast_dtypes"),
)
