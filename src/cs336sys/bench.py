"""Problem benchmarking_script: time forward, forward+backward and full training steps.

    python -m cs336sys.bench --size small --context-length 512 --mode train_step --dtype bf16

Every step is synchronised and timed separately; all step times are kept. Precision is fp32 or
bf16 under `torch.autocast` (problem benchmarking_mixed_precision), and the model runs eager or
compiled (problem torch_compile): `blocks` compiles each TransformerBlock (they share one compiled
graph, so compile time does not grow with depth); `full` compiles the whole model.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable

import torch

from cs336sys.model import build_model
from cs336sys.optim import cross_entropy, make_optimizer
from cs336sys.sizes import SIZES, forward_flops, get_size, parameter_count, train_step_flops
from cs336sys.timing import peak_memory_bytes, reset_peak_memory, summarize_ms, synchronize, time_steps

MODES = ("forward", "forward_backward", "train_step")
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE = ("eager", "blocks", "full")


def precision_context(dtype: str, device: str):
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if DTYPES[dtype] is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=DTYPES[dtype])


def make_step(settings: dict) -> tuple[Callable[[], None], dict]:
    """Build the model, data and optimizer for one point and return a closure doing one step."""
    size = get_size(settings["size"])
    mode, dtype, device = settings["mode"], settings["dtype"], settings["device"]
    compile_mode = settings.get("compile", "eager")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if compile_mode not in COMPILE:
        raise ValueError(f"unknown compile mode {compile_mode!r}; known: {', '.join(COMPILE)}")
    ctx = int(settings["context_length"])
    batch = int(settings.get("batch_size", size.batch_size))
    torch.manual_seed(settings.get("seed", 0))
    model = build_model(size, ctx, device=device)
    runner: torch.nn.Module = model
    if compile_mode != "eager":
        torch._dynamo.reset()  # each point compiles afresh; no guards or graphs left from the last one
    if compile_mode == "blocks":
        for block in model.layers:
            block.compile()
    elif compile_mode == "full":
        runner = torch.compile(model)
    tokens = torch.randint(0, size.vocab_size, (batch, ctx), device=device)
    targets = torch.randint(0, size.vocab_size, (batch, ctx), device=device)
    optimizer = make_optimizer(model.parameters(), settings.get("optimizer", "ours")) \
        if mode == "train_step" else None

    def step() -> None:
        if mode == "forward":
            with torch.no_grad(), precision_context(dtype, device):
                runner(tokens)
            return
        with precision_context(dtype, device):
            loss = cross_entropy(runner(tokens), targets)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    info = {"batch_size": batch, "parameters": parameter_count(size),
            "flops_per_step": (forward_flops if mode == "forward" else train_step_flops)(size, batch, ctx)}
    return step, info


def run_point(settings: dict) -> dict:
    """Warm up, then time `steps` steps; metrics include every step's time and peak memory."""
    device = settings["device"]
    reset_peak_memory(device)
    build_start = time.perf_counter()
    step, info = make_step(settings)
    synchronize(device)
    build_s = time.perf_counter() - build_start
    times = time_steps(step, int(settings["warmup"]), int(settings["steps"]), device)
    metrics = {**summarize_ms(times), "step_ms": times, "build_s": build_s,
               "peak_memory_bytes": peak_memory_bytes(device), **info}
    metrics["achieved_tflops"] = info["flops_per_step"] / (metrics["median_ms"] * 1e-3) / 1e12
    return metrics


def run_warmup_point(settings: dict) -> dict:
    """The warm-up sweep: in a fresh process, time every step from the very first one.

    Running w untimed warm-up steps then n timed steps is the same as timing steps w..w+n-1 of one
    cold sequence, so one sequence of max(w)+n steps serves every w; the table slices it.
    """
    settings = {**settings, "warmup": 0}
    return run_point(settings)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cs336sys.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="small", help=f"one of {', '.join(SIZES)}")
    p.add_argument("--context-length", type=int, default=512)
    p.add_argument("--mode", choices=MODES, default="forward_backward")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--compile", choices=COMPILE, default="eager")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--optimizer", choices=["ours", "torch_fused"], default="ours")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    try:
        get_size(a.size)
    except ValueError as exc:
        p.error(str(exc))
    settings = {"size": a.size, "context_length": a.context_length, "mode": a.mode, "dtype": a.dtype,
                "compile": a.compile, "warmup": a.warmup, "steps": a.steps, "optimizer": a.optimizer,
                "device": a.device}
    m = run_point(settings)
    peak = m["peak_memory_bytes"]
    print(f"{a.size} ctx={a.context_length} {a.mode} {a.dtype} {a.compile} on {a.device}: "
          f"{m['mean_ms']:.2f} ± {m['std_ms']:.2f} ms (median {m['median_ms']:.2f}, min {m['min_ms']:.2f}) "
          f"over {a.steps} steps after {a.warmup} warm-up; {m['achieved_tflops']:.1f} TFLOP/s"
          + (f"; peak memory {peak / 2**30:.2f} GiB" if peak else ""))


if __name__ == "__main__":
    main()
