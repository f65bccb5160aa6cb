# Problems pytorch_attention (7), torch_compile (8a), flash_benchmarking (11) and both
# leaderboards' attention shapes. One job per implementation (and dtype) of a grid.

ATT = GRID["attention"]
PT, FLASH, LB = ATT["pytorch"], ATT["flash"], ATT["leaderboard"]

for impl in PT["impls"]:
    points = [
        point("pytorch_attention", PT, impl=impl, d=d, seq=seq, dtype="fp32") for d in PT["d"] for seq in PT["seq"]
    ]
    experiment_job(
        "pytorch_attention",
        impl,
        points,
        [f"results/pytorch_attention/{impl}/d{p['d']}-seq{p['seq']}.json" for p in points],
    )

for impl in FLASH["impls"]:
    for dtype in FLASH["dtypes"]:
        if impl == "triton_ieee" and dtype != "fp32":  # how float32 products run: nothing to set in bf16
            continue
        points = [
            point("flash_benchmarking", FLASH, impl=impl, dtype=dtype, seq=seq, d=d, causal=True)
            for d in FLASH["d"]
            for seq in FLASH["seq"]
        ]
        experiment_job(
            "flash_benchmarking",
            f"{impl}-{dtype}",
            points,
            [f"results/flash_benchmarking/{impl}-{dtype}/d{p['d']}-seq{p['seq']}.json" for p in points],
        )

# One job per GPU model (each runs only on a host with that GPU): ours against cuDNN on each.
for gpu in LB["gpus"]:
    points = [
        point("flash_leaderboard", LB, impl=impl, edition=edition, causal=True, gpu_model=gpu, **shape)
        for edition, shape in LB["shapes"].items()
        for impl in LB["impls"]
    ]
    experiment_job(
        "flash_leaderboard",
        gpu.lower(),
        points,
        [f"results/flash_leaderboard/{gpu.lower()}/{p['edition']}/{p['impl']}.json" for p in points],
    )

# The Gluon kernels (Hopper) at the same shapes, one job per GPU model: cs336sys.attention.bench_gluon.
GLUON = LB.get("gluon") or {"gpus": []}
for gpu in GLUON["gpus"]:
    points = [
        point("flash_leaderboard_gluon", LB, impl=impl, edition=edition, causal=True, gpu_model=gpu, **shape)
        for edition, shape in LB["shapes"].items()
        for impl in GLUON["impls"]
    ]
    experiment_job(
        "flash_leaderboard_gluon",
        gpu.lower(),
        points,
        [f"results/flash_leaderboard_gluon/{gpu.lower()}/{p['edition']}/{p['impl']}.json" for p in points],
    )
if not GLUON["gpus"]:
    experiment_job("flash_leaderboard_gluon", "", [], [])  # declared; the main grid has no points until measured


# The comparisons of the summary in interleaved rounds, one job per (GPU model, shape): every implementation
# once a round, in one process (cs336sys.attention.bench_rounds). Jobs under `pending` wait in the overlay next.
ROUNDS = LB.get("rounds") or {"gpus": []}
ROUNDS_PENDING = set(ROUNDS.get("pending", []))
for gpu in ROUNDS["gpus"]:
    for edition, shape in LB["shapes"].items():
        job = f"{gpu.lower()}-{edition}"
        if job in ROUNDS_PENDING:
            continue
        variants = [
            point("flash_leaderboard_rounds", LB, impl=impl, edition=edition, causal=True, gpu_model=gpu, **shape)
            for impl in ROUNDS["impls"]
        ]
        points = rotated_rounds(variants, ROUNDS["rounds"])
        experiment_job(
            "flash_leaderboard_rounds",
            job,
            points,
            [f"results/flash_leaderboard_rounds/{job}/{p['impl']}-r{p['round']}.json" for p in points],
        )
experiment_job("flash_leaderboard_rounds", "", [], [])  # declared, also where every job is pending

section(
    "attention",
    results_of(
        "pytorch_attention",
        "flash_benchmarking",
        "flash_leaderboard",
        "flash_leaderboard_gluon",
        "flash_leaderboard_rounds",
    )
    # wall time of each flash-grid job, compilation included
    + timings_of("flash_benchmarking")
    # the bf16 matrix-product ceiling bounds the attainable speed-up over naive attention
    + results_of("matmul_peak"),
    extra={
        "reference_ms": LB.get("reference_ms", {}),
        "reference_source": LB.get("reference_source"),
        "rounds_pending": sorted(ROUNDS_PENDING),
    },
)
