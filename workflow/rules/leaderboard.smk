# Problem 25 (leaderboard, 2026): one full training step of the 8B model on 2 GPUs, ours against
# PyTorch's own parts. Every config the grid runs is a point of one job, so their ratios come from
# the same GPUs in the same session; each point renders its profiled step's timeline beside it.

LB = GRID["leaderboard"]
_unknown = sorted(set(LB["run"]) - set(LB["configs"]))
if _unknown:
    raise ValueError(f"leaderboard.run names unknown configs {_unknown}; known: {', '.join(LB['configs'])}")

experiment_job(
    "leaderboard_step", "",
    [dict(size=LB["size"], context_length=LB["context_length"], compute_dtype=LB["compute_dtype"],
          warmup=LB["warmup"], steps=LB["steps"], bench_rep_ms=LB["bench_rep_ms"],
          bench_warmup_ms=LB["bench_warmup_ms"], peak_tflops=LB["peak_tflops"], device=DEVICE,
          **{"variant": "ours", **LB["configs"][name]})
     for name in LB["run"]],
    [f"results/leaderboard_step/{name}.json" for name in LB["run"]],
    gpus=LB["world_size"], rendered=True,
)

section(
    "leaderboard",
    results_of("leaderboard_step") + timings_of("leaderboard_step"),
    extra={k: LB[k] for k in ("size", "context_length", "world_size", "compute_dtype", "peak_tflops", "configs", "run")},
)
