# Problems mixed_precision_accumulation (3) and benchmarking_mixed_precision (4a, 4b).

PRECISION = GRID["precision"]
AUTOCAST_POINTS = [dict(autocast_dtype=d, device=DEVICE) for d in PRECISION["autocast_dtypes"]]


rule mixed_precision_accumulation:
    output:
        "results/precision/accumulation.json",
    params:
        problem="mixed_precision_accumulation",
        function="cs336sys.precision:run_accumulation_point",
        points=points_json([dict(device=DEVICE)]),
        code=experiment_code("cs336sys.precision:run_accumulation_point"),
    log:
        "logs/precision/accumulation.log",
    benchmark:
        "benchmarks/precision/accumulation.tsv"
    resources:
        gpu=1,
    shell:
        EXPERIMENT


rule autocast_dtypes:
    output:
        [f"results/precision/autocast-{p['autocast_dtype']}.json" for p in AUTOCAST_POINTS],
    params:
        problem="autocast_dtypes",
        function="cs336sys.precision:run_autocast_dtypes_point",
        points=points_json(AUTOCAST_POINTS),
        code=experiment_code("cs336sys.precision:run_autocast_dtypes_point"),
    log:
        "logs/precision/autocast.log",
    benchmark:
        "benchmarks/precision/autocast.tsv"
    resources:
        gpu=1,
    shell:
        EXPERIMENT


rule precision_section:
    localrule: True
    input:
        rules.mixed_precision_accumulation.output,
        rules.autocast_dtypes.output,
    output:
        directory("results/sections/precision"),
    params:
        section="precision",
        extra="{}",
        code=code_hash("cs336sys.analysis.precision"),
    log:
        "logs/sections/precision.log",
    shell:
        ANALYSIS
