"""Problem 11's leaderboard shapes (registry: flash_leaderboard): forward alone and forward + backward of
one implementation at a leaderboard's attention shape, each a `fn(settings, run) -> metrics` for
cs336sys.run. Ours (Triton) beside SDPA's backends and naive attention, timed as the course's harnesses
do (do_bench after warm calls, SM clocks sampled beside it). What the attention benchmarks share is
cs336sys.attention.bench_common's; naive attention's points are apart (bench_naive), so that their code
hash reaches no Triton module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cs336sys.attention.bench_common import (
    BENCH_WARMUP_MS,
    _random_qkv,
    attention_flops,
    bench_ms,
    pick_sdpa_backend,
    sdpa_attention,
)
from cs336sys.attention.naive import naive_attention
from cs336sys.dtypes import torch_dtype
from cs336sys.gpu_clocks import ClockSampler
from cs336sys.jobs import Run, Unsupported


@dataclass(frozen=True)
class LeaderboardSettings:
    """A leaderboard's attention shape: forward alone and forward + backward, loss = O.sum().

    layout "bhsd": q, k, v of (batch, heads, seq, d); "bsd": (batch, seq, d), heads folded into the
    batch as the 2025 harness builds them (SDPA, which wants 4-D, gets a view with one head).
    forward_tiles / backward_tiles: ours with these tiles instead of the table's (flash_configs)."""

    impl: str
    """ours | sdpa_flash | sdpa_cudnn | sdpa_efficient | naive (Gluon job: gluon | gluon_bwd | sdpa_cudnn)."""
    batch: int = 1
    """Batch size (layout bsd: samples times heads, as the 2025 harness builds it)."""
    heads: int = 16
    """Heads per sample (layout bhsd only)."""
    seq: int = 16384
    """Sequence length (queries and keys)."""
    d: int = 64
    """Head dimension."""
    dtype: str = "bf16"
    """dtype of q, k and v: bf16 | fp16 | fp32."""
    causal: bool = True
    """Causal mask (key j <= query i)."""
    layout: str = "bhsd"
    """bhsd: q, k, v of (batch, heads, seq, d) | bsd: (batch, seq, d), heads folded into the batch."""
    forward_tiles: str | None = None
    """Ours only: forward tiles as `flash_configs.Tiles` text ("256x64/w8/s3"); None: the table's."""
    backward_tiles: str | None = None
    """Ours and gluon: backward tiles as `BackwardConfig` text; None: the table's (flash_configs)."""
    edition: str = "2025"
    """Whose leaderboard the shape is from (2025 | 2026): a label for the report."""
    gpu_model: str = "any"
    """GPU model this point must run on: H100 | H200 | any (another GPU is an error)."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def _check_triton_runs_here(device: torch.device, dtype: torch.dtype) -> None:
    """On the CPU the Triton kernels run through the interpreter, in float32 only."""
    if device.type == "cuda":
        return
    if dtype != torch.float32:
        raise Unsupported(f"the Triton interpreter (CPU) runs float32 only; {dtype} is measured on a GPU")
    from cs336sys.attention.flash_triton import kernels_interpreted

    if not kernels_interpreted():
        raise RuntimeError("Triton on the CPU needs TRITON_INTERPRET=1 set before triton is imported")


def run_leaderboard_point(settings: LeaderboardSettings, run: Run) -> dict:
    """One implementation at one leaderboard shape, do_bench medians: the forward alone, forward +
    backward (loss = O.sum(), as the harnesses time it) and the backward as their difference; on
    CUDA also each GPU kernel of one profiled forward + backward, in launch order (where the time goes).

    settings: LeaderboardSettings; "ours" is torch.compile(FlashAttention2Triton.apply).
    """
    device = torch.device(run.device)
    s = settings
    if device.type == "cuda":
        _require_gpu_model(s.gpu_model, device)
    dtype = torch_dtype(s.dtype)
    if s.layout not in ("bhsd", "bsd"):
        raise ValueError(f"unknown layout {s.layout!r}; known: bhsd, bsd")
    shape = (s.batch, s.heads, s.seq, s.d) if s.layout == "bhsd" else (s.batch, s.seq, s.d)
    q, k, v = _random_qkv(shape, dtype, device)
    impl = s.impl
    if impl == "ours":
        from cs336sys.attention.flash_triton import FlashAttention2Triton

        _check_triton_runs_here(device, dtype)
        apply = torch.compile(FlashAttention2Triton.apply)
        attend = lambda q, k, v, causal: apply(q, k, v, causal, "tf32", s.forward_tiles, s.backward_tiles)  # noqa: E731
    elif impl.startswith("sdpa_"):
        four_d = (lambda t: t.unsqueeze(1)) if s.layout == "bsd" else (lambda t: t)
        backend = pick_sdpa_backend(four_d(q), s.causal, impl.removeprefix("sdpa_"))
        sdpa = sdpa_attention(backend)
        attend = lambda q, k, v, causal: sdpa(four_d(q), four_d(k), four_d(v), causal)  # noqa: E731
    elif impl == "naive":  # the 2025 leaderboard's baseline
        attend = naive_attention
    else:
        raise ValueError(f"unknown leaderboard implementation {impl!r}")
    return measure_leaderboard_point(attend, q, k, v, s, device)


def measure_leaderboard_point(attend: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              s: LeaderboardSettings, device: torch.device) -> dict:
    """`attend(q, k, v, causal)` at a leaderboard shape: do_bench medians of forward + backward and of
    the forward alone, the backward as their difference, TFLOP/s, and on CUDA each kernel's time and the
    SM clock and power over each do_bench (`fwd_bwd_clocks`, `fwd_clocks`: `gpu_clocks.ClockSampler`'s
    medians; empty where nvidia-smi does not run). Under the leaderboard's load the clock falls below its
    unloaded one by an amount that differs between machines and kernels (notes/flash_attention.md)."""

    def forward_backward() -> None:
        attend(q, k, v, s.causal).sum().backward()

    def forward() -> None:
        attend(q, k, v, s.causal)

    windows: list[tuple[float, float]] = []
    with ClockSampler(device, interval_ms=LEADERBOARD_CLOCK_MS) as clocks:
        fwd_bwd = _leaderboard_ms(forward_backward, device, [q, k, v], windows)
        fwd = _leaderboard_ms(forward, device, None, windows)
    flops = attention_flops(s.batch * (s.heads if s.layout == "bhsd" else 1), s.seq, s.seq, s.d, s.causal)
    metrics = {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd, "bwd_ms": fwd_bwd - fwd,
               "fwd_flops": flops["forward"], "bwd_flops": flops["backward"], "fwd_bwd_flops": flops["fwd_bwd"]}
    if device.type == "cuda":
        metrics["fwd_bwd_clocks"], metrics["fwd_clocks"] = (clocks.summary(*w) for w in windows)
    for part in ("fwd", "bwd", "fwd_bwd"):
        metrics[f"{part}_tflops"] = metrics[f"{part}_flops"] / (metrics[f"{part}_ms"] * 1e-3) / 1e12
    if device.type == "cuda":
        metrics["kernels"] = _kernel_times(forward_backward, [q, k, v])
    return metrics


# A leaderboard call takes 1-80 ms: do_bench's grid budget (BENCH_*_MS) would time the 2026 shape's
# forward+backward once, and the first call of a process (compiling its kernels) would set do_bench's
# estimate of the call's time, hence how often it is repeated. So each measurement first runs the call
# for LEADERBOARD_WARM_S seconds and at least LEADERBOARD_WARM_CALLS times (compiled, tuned), then times
# at least LEADERBOARD_MIN_CALLS calls and LEADERBOARD_MIN_MS milliseconds. The seconds are for the GPU's
# clocks: on an H100 a backward timed first in a cool process ran 4-6 % faster than once the GPU had been
# busy for some seconds (notes/flash_attention.md, "The order of measurement"), which favoured whichever
# implementation a job timed first. The timed second holds the 2025 shape's few-millisecond calls by the
# hundred (at 20 calls, a tenth of a second, the clock sampler took two samples inside it), and gives the
# sampler (every LEADERBOARD_CLOCK_MS) some fifty.
LEADERBOARD_WARM_CALLS = 3
LEADERBOARD_WARM_S = 5.0
LEADERBOARD_MIN_CALLS = 20
LEADERBOARD_MIN_MS = 1000.0
LEADERBOARD_CLOCK_MS = 20


def _leaderboard_ms(fn: Callable[[], None], device: torch.device,
                    grad_to_none: list[torch.Tensor] | None = None,
                    windows: list[tuple[float, float]] | None = None) -> float:
    """Median milliseconds per call of `fn`: `bench_ms` on the CPU; on CUDA do_bench after warm calls
    (LEADERBOARD_WARM_S seconds of them), with a budget of at least LEADERBOARD_MIN_CALLS calls and
    LEADERBOARD_MIN_MS (and do_bench's warm-up of a quarter of it), whose host times (start, end) are
    appended to `windows`."""
    if device.type != "cuda":
        return bench_ms(fn, device, grad_to_none)
    import triton.testing

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    warm_until, calls = time.perf_counter() + LEADERBOARD_WARM_S, 0
    while calls < LEADERBOARD_WARM_CALLS or time.perf_counter() < warm_until:
        for t in grad_to_none or ():
            t.grad = None
        fn()
        torch.cuda.synchronize(device)  # the host's clock follows the GPU's work
        calls += 1
    for t in grad_to_none or ():
        t.grad = None
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    rep_ms = max(LEADERBOARD_MIN_MS, LEADERBOARD_MIN_CALLS * start.elapsed_time(end))
    began = time.perf_counter()
    ms = float(triton.testing.do_bench(fn, warmup=max(BENCH_WARMUP_MS, rep_ms / 4), rep=rep_ms,
                                       grad_to_none=grad_to_none, return_mode="median"))
    if windows is not None:
        windows.append((began, time.perf_counter()))
    return ms


def _require_gpu_model(model: str, device: torch.device) -> None:
    """A point measured per GPU model ("H100", "H200"; "any" runs anywhere) fails on any other GPU, so
    no other GPU's number is recorded under its name (an error: the job runner writes no result)."""
    name = torch.cuda.get_device_name(device)
    if model != "any" and model.lower() not in name.lower():
        raise RuntimeError(f"this point measures an NVIDIA {model} and this host's GPU is {name}: run this "
                           f"job on a host with that GPU (each GPU model has its own job)")


def _kernel_times(fn: Callable[[], None], grad_to_none: list[torch.Tensor]) -> list[dict]:
    """Each GPU kernel of one call of `fn` (after a warm one), in launch order: name, ms."""
    from cs336sys.profiling.trace import parse_trace, record_trace

    def step() -> None:
        for t in grad_to_none:
            t.grad = None
        fn()

    trace = parse_trace(record_trace(step, steps=1, warmup=1, device="cuda"))
    return [{"name": w.name[:200], "ms": w.dur / 1e3} for w in trace.work if w.kind == "kernel"]
