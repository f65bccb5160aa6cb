# Problem 25 (leaderboard, 2026): one full training step of the 8B model on 2 GPUs, ours against
# PyTorch's own parts. Each job of the grid runs its configs one after another on the same GPUs
# (ratios are taken within a job); each point renders its profiled step's timeline beside it.

from cs336sys.sizes import get_size  # noqa: E402  (no torch: the registry of model shapes)

LB = GRID["leaderboard"]
_proxy = LB.get("proxy") or {"configs": {}}


def _check_checkpoint_blocks(where, configs, model, layers):
    for name, config in configs.items():
        for key in ("checkpoint_blocks", "matmul_blocks"):  # matmul_blocks: of the checkpointed (pytorch_native)
            k = config.get(key)
            if isinstance(k, int) and not 0 <= k <= layers:
                raise ValueError(f"{where}.{name}: {key} {k} is not a number of blocks of {model} (0..{layers})")


LB_SIZE = setting("leaderboard_step", LB, "size")
_check_checkpoint_blocks("leaderboard.configs", LB["configs"], LB_SIZE, get_size(LB_SIZE).num_layers)
_check_checkpoint_blocks(
    "leaderboard.proxy.configs", _proxy["configs"], "the proxy", setting("leaderboard_proxy", _proxy, "num_layers")
)
experiment_job("leaderboard_step", "", [], [])  # handled here even while the grid names no job

for _job, _names in LB["jobs"].items():
    _unknown = sorted(set(_names) - set(LB["configs"]))
    if _unknown:
        raise ValueError(f"leaderboard.jobs.{_job} names unknown configs {_unknown}; known: {', '.join(LB['configs'])}")
    experiment_job(
        "leaderboard_step",
        _job,
        [point("leaderboard_step", LB, **{"variant": "ours", **LB["configs"][name]}) for name in _names],
        [f"results/leaderboard_step/{_job}/{name}.json" for name in _names],
        gpus=LB["world_size"],
        rendered=True,
    )

# The one-GPU proxy of the step: the 8B's widths, vocabulary and sample, `proxy.num_layers`
# blocks, one rank. A proxy, not the leaderboard step: its results say so, and the section reads only
# the step's. Only a grid with `leaderboard.proxy` (the overlay `next`, the smoke grid) has the job.
experiment_job(
    "leaderboard_proxy",
    "",
    [
        point(
            "leaderboard_proxy",
            _proxy,
            size=LB_SIZE,
            context_length=setting("leaderboard_step", LB, "context_length"),
            compute_dtype=setting("leaderboard_step", LB, "compute_dtype"),
            **{"variant": "ours", **config},
        )
        for config in _proxy["configs"].values()
    ],
    [f"results/leaderboard_proxy/{name}.json" for name in _proxy["configs"]],
    gpus=1,
)

section(
    "leaderboard",
    results_of("leaderboard_step") + timings_of("leaderboard_step") + results_of("leaderboard_proxy"),
    extra={
        **{k: setting("leaderboard_step", LB, k) for k in ("size", "context_length", "compute_dtype", "peak_tflops")},
        **{k: LB[k] for k in ("world_size", "configs", "jobs")},
        "reference": LB.get("reference"),
        # the shape our flash kernel's tiles were tuned at (the flash section's leaderboard benchmark)
        "flash_tuned_at": {k: GRID["attention"]["leaderboard"]["shapes"]["2025"][k] for k in ("d", "seq")},
    },
)
