"""The leaderboard step's options (`fused_elementwise`, attention "flash_tuned", `keep_attention`) on
the CPU: each against single-process training of the plain model on 1 and 2 gloo ranks (the bounds and
the reference of test_leaderboard_step.py), and what keep_attention saves, counted by a dispatch mode.

Our flash (attention "flash_tuned") runs only under Triton's interpreter on the CPU: those tests run in
a TRITON_INTERPRET=1 subprocess (as in test_leaderboard_fused_ops.py), in fp32, with a model whose
d_head is 16 (the kernels' smallest). Without the interpreter the fused elementwise functions are the
model's own torch ops, so here `fused_elementwise` checks the step's wiring; the subprocess runs the kernels.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from conftest import rerun_under_the_interpreter, spawn_checks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

pytest.importorskip("triton")

import test_leaderboard_step as base  # noqa: E402

from cs336sys.leaderboard.attention import (  # noqa: E402
    BACKWARD_8B,
    FORWARD_8B,
    KEPT_OPS,
    keep_attention_context,
    tuned_flash_attention,
    tuned_tiles,
)
from cs336sys.leaderboard.proxy import PROXY, ProxySettings, run_proxy_point  # noqa: E402
from cs336sys.leaderboard.step import LeaderboardSpec, build_leaderboard_step  # noqa: E402
from cs336sys.sizes import ModelSize  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess "
                                 "of test_flash_tuned_in_an_interpreter_process")
SDPA_FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"  # SDPA's CPU kernel, fp32
FLASH_FORWARD = "cs336sys_leaderboard.flash_forward.default"
# d_head 16 for our flash: 64 wide, 4 heads (test_leaderboard_step's TINY has d_head 8)
TINY_D16 = ModelSize("leaderboard-test-d16", d_model=64, d_ff=96, num_layers=3, num_heads=4, vocab_size=64,
                     batch_size=2)

# (name, checkpoint policy, options): every option, alone and together, checkpointed and not
CONFIGS = [
    ("sdpa_keep", "all", dict(attention="sdpa", keep_attention=True)),
    ("sdpa_keep_first", 1, dict(attention="sdpa", keep_attention=True)),
    ("fused", "all", dict(fused_elementwise=True)),
    ("sdpa_fused_keep", (0, 2), dict(attention="sdpa", fused_elementwise=True, keep_attention=True)),
]
# two blocks checkpointed (attention kept), one not
FLASH_CONFIGS = [("flash_tuned_fused_keep", 2, dict(attention="flash_tuned", fused_elementwise=True,
                                                    keep_attention=True))]


class OpCounter(TorchDispatchMode):
    """Counts every op dispatched below autograd (a checkpoint's recompute included)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _check_training(per_rank: list[dict]) -> None:
    for rank, results in enumerate(per_rank):
        for config, r in results.items():
            where = f"rank {rank}, {config}"
            assert r["initial_err"] == 0, f"{where}: the shards do not hold rank 0's initial model"
            assert r["loss_err"] < base.FP32_LOSS_TOL, f"{where}: loss off by {r['loss_err']:.3g}"
            assert r["grad_err"] < base.FP32_GRAD_TOL, f"{where}: gradients off by {r['grad_err']:.3g}"
            assert r["param_err"] < base.FP32_PARAM_TOL, f"{where}: parameters off by {r['param_err']:.3g}"
            assert r["alive_after_step"] == 0, f"{where}: a gathered buffer outlived the step"


def _train_each(configs):
    def worker(info, seed: int) -> dict:
        return {name: base._train_ours(info.rank, info.world_size, seed, policy, True, **options)
                for name, policy, options in configs}
    return worker


def _options_checks(info, seed: int) -> dict:
    return _train_each(CONFIGS)(info, seed)


@pytest.mark.parametrize("world", [1, 2])
def test_each_option_matches_single_process_training(world):
    _check_training(spawn_checks(_options_checks, world)[1])


def _attention_forwards(size: ModelSize, op: str, policy, **options) -> int:
    """How often attention's forward op runs in one step of a 1-rank step (forward + backward)."""
    spec = LeaderboardSpec(size=size, context_length=base.SEQ, compute_dtype="fp32", checkpoint_blocks=policy,
                           ce_chunk_tokens=base.CHUNK, **options)
    step = build_leaderboard_step(spec, "cpu")
    with OpCounter() as counter:
        step.run()
    return counter.counts[op]


@pytest.mark.parametrize("policy,checkpointed", [("all", 3), (1, 1), ("none", 0)])
def test_keep_attention_runs_sdpa_forward_once_per_block(policy, checkpointed):
    layers = base.TINY.num_layers
    kept = _attention_forwards(base.TINY, SDPA_FORWARD, policy, attention="sdpa", keep_attention=True)
    plain = _attention_forwards(base.TINY, SDPA_FORWARD, policy, attention="sdpa")
    assert kept == layers, "with keep_attention each block's attention forward runs once"
    assert plain == layers + checkpointed, "without it a checkpointed block recomputes attention's forward"


def test_keep_attention_needs_an_attention_it_can_keep():
    with pytest.raises(ValueError, match="keep_attention keeps the forward of attention sdpa or flash_tuned"):
        LeaderboardSpec(size=base.TINY, context_length=base.SEQ, attention="flash", keep_attention=True)


def test_gluon_attention_is_refused_off_a_hopper_gpu():
    """Attention "gluon" is a step option (kept through a checkpoint like flash_tuned), refused when the
    step is built where the Gluon kernels cannot run, with the reason."""
    spec = LeaderboardSpec(size=TINY_D16, context_length=base.SEQ, attention="gluon", keep_attention=True)
    assert torch.ops.cs336sys_leaderboard.gluon_forward.default in KEPT_OPS
    with pytest.raises(ValueError, match="attention 'gluon': the Gluon kernels need a Hopper CUDA GPU, got device cpu"):
        build_leaderboard_step(spec, "cpu")


def test_tuned_tiles_only_where_they_were_measured():
    bf16 = torch.empty(1, 2, 8, 128, dtype=torch.bfloat16)
    assert tuned_tiles(bf16) == (None, None)  # a CPU tensor: the table's (interpreter) tiles
    if torch.cuda.is_available():
        assert tuned_tiles(bf16.cuda()) == (FORWARD_8B, BACKWARD_8B)
        assert tuned_tiles(bf16.cuda()[..., :64].contiguous()) == (None, None)
        assert tuned_tiles(bf16.cuda().float()) == (None, None)
    assert str(FORWARD_8B) == "256x64/w8/s3" and str(BACKWARD_8B) == "kv64x128/q128x64/w8/s3/split"


def test_proxy_point_on_the_cpu():
    """The proxy's code path on one gloo rank, both variants; its settings say it is a proxy."""
    for variant, options in [("pytorch_parts", {}), ("ours", dict(attention="sdpa", keep_attention=True))]:
        settings = ProxySettings(size="tiny", num_layers=1, context_length=base.SEQ, variant=variant,
                                 compute_dtype="fp32", warmup=1, steps=2, ce_chunk_tokens=base.CHUNK,
                                 device="cpu", **options)
        from cs336sys.jobs import Run

        r = run_proxy_point(settings, Run(device="cpu"))
        assert len(r["step_ms"]) == 2 and r["median_ms"] > 0 and r["world_size"] == 1 and r["proxy"] == PROXY
        assert r["num_layers"] == 1 and settings.spec().model_size.num_layers == 1
        assert not torch.distributed.is_initialized(), "the point's process group of one ends with it"


# ------------------------------------------------------------------------- under the interpreter


@pytest.mark.slow(seconds=95)
def test_flash_tuned_in_an_interpreter_process():
    from test_attention_triton import _interpreter_cannot_take_tensor_loop_bounds

    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    if _interpreter_cannot_take_tensor_loop_bounds():
        pytest.skip("Triton < 3.7's interpreter with NumPy >= 2.4 cannot take the flash kernels' tensor loop "
                    "bounds; here the compiled kernels are tested instead (pytest -m gpu)")
    rerun_under_the_interpreter(__file__, "interpreted", timeout_s=600)


def _flash_checks(info, seed: int) -> dict:
    base.TINY = TINY_D16  # this spawned rank's own copy of the module: d_head 16 for our kernels
    return _train_each(FLASH_CONFIGS)(info, seed)


@interpreted
def test_interpreted_flash_tuned_step_matches_single_process_training():
    # One rank: what the kernels do in the step is the same on any rank. Two ranks (each interpreting every
    # kernel again: minutes on a busy 2-core host) are the options' test above with the model's ops.
    _check_training(spawn_checks(_flash_checks, 1, timeout_s=300)[1])


@interpreted
def test_interpreted_flash_tuned_forward_is_kept_through_the_checkpoint():
    layers = TINY_D16.num_layers
    kept = _attention_forwards(TINY_D16, FLASH_FORWARD, "all", attention="flash_tuned", keep_attention=True)
    plain = _attention_forwards(TINY_D16, FLASH_FORWARD, "all", attention="flash_tuned")
    assert (kept, plain) == (layers, 2 * layers)


@interpreted
def test_interpreted_flash_tuned_matches_naive_attention_in_a_kept_checkpoint(fresh_seed):
    from cs336sys.attention.naive import naive_causal_attention

    q, k, v = (torch.randn(2, 2, 24, 16, requires_grad=True) for _ in range(3))
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = checkpoint(tuned_flash_attention, q, k, v, use_reentrant=False, context_fn=keep_attention_context)
    want = naive_causal_attention(*ref)
    grad = torch.randn_like(want)
    out.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for got, expected in zip((q, k, v), ref, strict=True):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-4)
