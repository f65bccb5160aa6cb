# Problems pytorch_attention (7), torch_compile (8a), flash_benchmarking (11) and the 2025
# leaderboard shape. One job per implementation (and dtype) of a grid.

ATT = GRID["attention"]
PT, FLASH, LB = ATT["pytorch"], ATT["flash"], ATT["leaderboard"]

PT_JOBS = {
    impl: [dict(impl=impl, batch=PT["batch"], d=d, seq=seq, passes=PT["passes"], dtype="fp32", device=DEVICE)
           for d in PT["d"] for seq in PT["seq"]]
    for impl in PT["impls"]
}
FLASH_JOBS = {
    (impl, dtype): [dict(impl=impl, dtype=dtype, seq=seq, d=d, batch=FLASH["batch"], heads=FLASH["heads"],
                         causal=True, device=DEVICE) for d in FLASH["d"] for seq in FLASH["seq"]]
    for impl in FLASH["impls"] for dtype in FLASH["dtypes"]
}
LB_POINTS = [dict(impl=impl, batch=LB["batch"], heads=LB["heads"], seq=LB["seq"], d=LB["d"], dtype=LB["dtype"],
                  causal=True, device=DEVICE) for impl in LB["impls"]]


def pytorch_attention_output(p):
    return f"results/pytorch_attention/{p['impl']}/d{p['d']}-seq{p['seq']}.json"


def flash_output(p):
    return f"results/flash_benchmarking/{p['impl']}-{p['dtype']}/d{p['d']}-seq{p['seq']}.json"


for impl, points in PT_JOBS.items():

    rule:
        name:
            f"pytorch_attention_{impl}"
        output:
            [pytorch_attention_output(p) for p in points],
        params:
            problem="pytorch_attention",
            function="cs336sys.attention.bench:run_pytorch_attention_point",
            points=points_json(points),
            code=experiment_code("cs336sys.attention.bench:run_pytorch_attention_point"),
        log:
            f"logs/pytorch_attention/{impl}.log",
        benchmark:
            f"benchmarks/pytorch_attention/{impl}.tsv"
        resources:
            gpu=1,
        shell:
            EXPERIMENT


for (impl, dtype), points in FLASH_JOBS.items():

    rule:
        name:
            f"flash_benchmarking_{impl}_{dtype}"
        output:
            [flash_output(p) for p in points],
        params:
            problem="flash_benchmarking",
            function="cs336sys.attention.bench:run_flash_point",
            points=points_json(points),
            code=experiment_code("cs336sys.attention.bench:run_flash_point"),
        log:
            f"logs/flash_benchmarking/{impl}-{dtype}.log",
        benchmark:
            f"benchmarks/flash_benchmarking/{impl}-{dtype}.tsv"
        resources:
            gpu=1,
        shell:
            EXPERIMENT


rule flash_leaderboard:
    output:
        [f"results/flash_leaderboard/{p['impl']}.json" for p in LB_POINTS],
    params:
        problem="flash_leaderboard",
        function="cs336sys.attention.bench:run_leaderboard_point",
        points=points_json(LB_POINTS),
        code=experiment_code("cs336sys.attention.bench:run_leaderboard_point"),
    log:
        "logs/flash_leaderboard.log",
    benchmark:
        "benchmarks/flash_leaderboard.tsv"
    resources:
        gpu=1,
    shell:
        EXPERIMENT


rule attention_section:
    localrule: True
    input:
        [pytorch_attention_output(p) for points in PT_JOBS.values() for p in points],
        [flash_output(p) for points in FLASH_JOBS.values() for p in points],
        rules.flash_leaderboard.output,
        # wall time of each flash-grid job, compilation included
        [f"benchmarks/flash_benchmarking/{impl}-{dtype}.tsv" for impl, dtype in FLASH_JOBS],
        # the bf16 matrix-product ceiling bounds the attainable speed-up over naive attention
        rules.matmul_peak.output,
    output:
        directory("results/sections/attention"),
    params:
        section="attention",
        code=code_hash("cs336sys.analysis.attention"),
        extra=json.dumps({"reference_ms": LB.get("reference_ms", {})}, sort_keys=True),
    log:
        "logs/sections/attention.log",
    shell:
        ANALYSIS
