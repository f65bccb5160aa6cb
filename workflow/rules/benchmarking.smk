# Problems benchmarking_script (1), benchmarking_mixed_precision (4c), torch_compile (8b), and the
# matmul ceilings that MFU divides by. One job per (size, compile mode) amortises process start,
# imports and CUDA initialisation over its points; each point still has its own result file.

BENCH = GRID["benchmarking"]
SWEEP = GRID["warmup_sweep"]
PEAK = GRID["peak"]
COMPILED = BENCH.get("compiled", {})


def benchmark_points(size, compile_mode):
    if compile_mode == "eager":
        ctxs, dtypes, modes = BENCH["context_lengths"], BENCH["dtypes"], BENCH["modes"]
    else:
        ctxs, dtypes, modes = COMPILED["context_lengths"], COMPILED["dtypes"], COMPILED["modes"]
    return [
        dict(size=size, context_length=ctx, mode=mode, dtype=dtype, compile=compile_mode,
             warmup=BENCH["warmup"], steps=BENCH["steps"], optimizer="ours", device=DEVICE)
        for ctx in ctxs for dtype in dtypes for mode in modes
    ]


def benchmark_output(p):
    return f"results/benchmarking/{p['size']}/{p['mode']}-{p['dtype']}-{p['compile']}-ctx{p['context_length']}.json"


BENCH_JOBS = {
    (size, c): benchmark_points(size, c)
    for size in BENCH["sizes"]
    for c in ["eager"] + ([COMPILED["compile"]] if COMPILED else [])
}

for (size, compile_mode), points in BENCH_JOBS.items():

    rule:
        name:
            f"benchmarking_{slug(size)}_{compile_mode}"
        output:
            [benchmark_output(p) for p in points],
        params:
            problem="benchmarking",
            function="cs336sys.bench:run_point",
            points=points_json(points),
            code=experiment_code("cs336sys.bench:run_point"),
        log:
            f"logs/benchmarking/{size}-{compile_mode}.log",
        benchmark:
            f"benchmarks/benchmarking/{size}-{compile_mode}.tsv"
        resources:
            gpu=1,
        shell:
            EXPERIMENT


# One cold process per size runs the modes in order (forward, forward+backward, train step): the
# first mode sees process start-up costs (CUDA context, cuBLAS handles), later modes the first use
# of their new kernels (backward, optimizer) and allocator growth. Per-mode processes would cost
# ~5 s of `import torch` each on the H100 host, a quarter of the whole run's wall time.
WARMUP_JOBS = {
    size: [
        dict(size=size, mode=mode, context_length=SWEEP["context_length"], dtype=SWEEP["dtype"], compile="eager",
             steps=max(SWEEP["warmups"]) + SWEEP["steps"], optimizer="ours", device=DEVICE,
             warmups=SWEEP["warmups"], measured_steps=SWEEP["steps"], order_in_process=i)
        for i, mode in enumerate(SWEEP["modes"])
    ]
    for size in SWEEP["sizes"]
}

for size, points in WARMUP_JOBS.items():

    rule:
        name:
            f"warmup_{slug(size)}"
        output:
            [f"results/warmup/{size}/{p['mode']}.json" for p in points],
        params:
            problem="warmup",
            function="cs336sys.bench:run_warmup_point",
            points=points_json(points),
            code=experiment_code("cs336sys.bench:run_warmup_point"),
        log:
            f"logs/warmup/{size}.log",
        benchmark:
            f"benchmarks/warmup/{size}.tsv"
        resources:
            gpu=1,
        shell:
            EXPERIMENT


PEAK_POINTS = [dict(dtype=d, n=PEAK["n"], device=DEVICE) for d in PEAK["dtypes"]]


rule matmul_peak:
    output:
        [f"results/peak/{p['dtype']}.json" for p in PEAK_POINTS],
    params:
        problem="matmul_peak",
        function="cs336sys.peak:run_point",
        points=points_json(PEAK_POINTS),
        code=experiment_code("cs336sys.peak:run_point"),
    log:
        "logs/peak.log",
    benchmark:
        "benchmarks/peak.tsv"
    resources:
        gpu=1,
    shell:
        EXPERIMENT


rule benchmarking_section:
    localrule: True
    input:
        [benchmark_output(p) for points in BENCH_JOBS.values() for p in points],
        [f"results/warmup/{p['size']}/{p['mode']}.json" for points in WARMUP_JOBS.values() for p in points],
        rules.matmul_peak.output,
        # the pipeline-overhead table reads the jobs' own wall-clock records
        [f"benchmarks/benchmarking/{s}-{c}.tsv" for s, c in BENCH_JOBS],
        [f"benchmarks/warmup/{s}.tsv" for s in WARMUP_JOBS],
        "benchmarks/peak.tsv",
        "benchmarks/precision/accumulation.tsv",
        "benchmarks/precision/autocast.tsv",
    output:
        directory("results/sections/benchmarking"),
    params:
        section="benchmarking",
        extra="{}",
        code=code_hash("cs336sys.analysis.benchmarking"),
    log:
        "logs/sections/benchmarking.log",
    shell:
        ANALYSIS
