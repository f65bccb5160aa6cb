# Problem 25 (leaderboard, 2026): one full training step of the 8B model on 2 GPUs, ours against
# PyTorch's own parts. Each job of the grid runs its configs one after another on the same GPUs
# (ratios are taken within a job); each point renders its profiled step's timeline beside it.

from cs336sys.sizes import get_size  # noqa: E402  (no torch: the registry of model shapes)

LB = GRID["leaderboard"]
_layers = get_size(LB["size"]).num_layers
for _name, _config in LB["configs"].items():
    _k = _config.get("checkpoint_blocks")
    if isinstance(_k, int) and not 0 <= _k <= _layers:
        raise ValueError(f"leaderboard.configs.{_name}: checkpoint_blocks {_k} is not a number of blocks of "
                         f"{LB['size']} (0..{_layers})")
experiment_job("leaderboard_step", "", [], [])  # handled here even while the grid names no job

for _job, _names in LB["jobs"].items():
    _unknown = sorted(set(_names) - set(LB["configs"]))
    if _unknown:
        raise ValueError(f"leaderboard.jobs.{_job} names unknown configs {_unknown}; known: {', '.join(LB['configs'])}")
    experiment_job(
        "leaderboard_step", _job,
        [dict(size=LB["size"], context_length=LB["context_length"], compute_dtype=LB["compute_dtype"],
              warmup=LB["warmup"], steps=LB["steps"], bench_rep_ms=LB["bench_rep_ms"],
              bench_warmup_ms=LB["bench_warmup_ms"], peak_tflops=LB["peak_tflops"], device=DEVICE,
              **{"variant": "ours", **LB["configs"][name]})
         for name in _names],
        [f"results/leaderboard_step/{_job}/{name}.json" for name in _names],
        gpus=LB["world_size"], rendered=True,
    )

section(
    "leaderboard",
    results_of("leaderboard_step") + timings_of("leaderboard_step"),
    extra={**{k: LB[k] for k in ("size", "context_length", "world_size", "compute_dtype", "peak_tflops", "configs", "jobs")},
           "reference": LB.get("reference"),
           # the shape our flash kernel's tiles were tuned at (the flash section's leaderboard benchmark)
           "flash_tuned_at": {k: GRID["attention"]["leaderboard"]["shapes"]["2025"][k] for k in ("d", "seq")}},
)
