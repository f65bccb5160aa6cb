# Problems mixed_precision_accumulation (3) and benchmarking_mixed_precision (4a, 4b).

PRECISION = GRID["precision"]

experiment_job(
    "mixed_precision_accumulation",
    "",
    [point("mixed_precision_accumulation")],
    ["results/mixed_precision_accumulation/accumulation.json"],
)
AUTOCAST_POINTS = [point("autocast_dtypes", PRECISION, autocast_dtype=d) for d in PRECISION["autocast_dtypes"]]
experiment_job(
    "autocast_dtypes",
    "",
    AUTOCAST_POINTS,
    [f"results/autocast_dtypes/{p['autocast_dtype']}.json" for p in AUTOCAST_POINTS],
)

section("precision", results_of("mixed_precision_accumulation", "autocast_dtypes"))
