"""The command line of the benchmarking script (`python -m cs336sys.bench`, `--help` for the options).

Kept apart from the package's `__init__`, the measurement every benchmarking point runs: the command
line imports the measurement, never the other way round, and what only it uses (its options, its
memory estimate from the accounting, its messages) is no part of what a point runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import torch

from cs336sys import bench
from cs336sys.bench import BenchSettings, measure
from cs336sys.dtypes import DTYPE_NAMES
from cs336sys.sizes import SIZES, get_size
from cs336sys.training.step import COMPILE, MODES


def memory_estimate(settings: BenchSettings) -> dict[str, float]:
    """Bytes the point needs, by part, from the accounting's formulas: parameters always; gradients
    and saved activations when there is a backward; AdamW's two moments for a train step."""
    from cs336sys.accounting.plan import make_setup, plan

    p = plan(make_setup(settings.size, 1, "single", batch_size=settings.spec().batch,
                        context_length=settings.context_length, master_dtype="fp32",
                        compute_dtype=settings.dtype if settings.dtype != "tf32" else "fp32",
                        attention="flash" if settings.attention == "sdpa" else "naive"))
    row = {r.quantity: r.value for r in p.rows if r.group == "memory per GPU"}
    parts = {"parameters": row["parameters"]}
    if settings.mode != "forward":
        parts["gradients"] = row["gradients"]
        parts["saved activations"] = row["saved activations"]
    if settings.mode == "train_step":
        parts["optimizer state"] = row["optimizer state (AdamW)"]
    return parts


def available_bytes(device: str) -> tuple[float, str] | None:
    """(free bytes, where) on the device the point would run on; None where it cannot be told."""
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return float(free), f"free on {torch.cuda.get_device_name(torch.device(device))}"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return float(info["MemAvailable"].split()[0]) * 1024, "available host memory (MemAvailable)"
    except (OSError, KeyError, ValueError):
        return None


def refuse_if_it_cannot_fit(settings: BenchSettings) -> str | None:
    """The message refusing a point whose estimate exceeds what the device has, else None."""
    have = available_bytes(settings.device)
    if have is None:
        return None
    parts = memory_estimate(settings)
    need = sum(parts.values())
    if need <= have[0]:
        return None
    split = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in parts.items())
    return (f"--size {settings.size} {settings.mode} at batch {settings.spec().batch} x context "
            f"{settings.context_length} needs about {need / 1e9:.1f} GB ({split} GB; the accounting's count: "
            f"python -m cs336sys.accounting --model {settings.size} --gpus 1 --strategy single), but "
            f"{have[0] / 1e9:.1f} GB is {have[1]}. Use a smaller size, context or --batch-size, or --force to try "
            "anyway.")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default once: argparse's own, unless the help already says it (a default that
    depends on another option or on the machine) or the option is a flag."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if "default" in (action.help or "") or action.default is None or isinstance(action.default, bool):
            return action.help or ""
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cs336sys.bench", description=bench.__doc__,
                                formatter_class=_HelpFormatter)
    p.add_argument("--size", default="small", help=f"one of {', '.join(SIZES)}")
    p.add_argument("--context-length", type=int, default=512, help="tokens per sequence")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per step (default: the size's batch: "
                   + ", ".join(f"{k} {v.batch_size}" for k, v in SIZES.items()) + ")")
    p.add_argument("--mode", choices=MODES, default="forward_backward", help="what one timed step does")
    p.add_argument("--dtype", choices=[d for d in DTYPE_NAMES if d != "tf32"], default="fp32",
                   help="fp32, or autocast to bf16/fp16 with fp32 weights")
    p.add_argument("--compile", choices=COMPILE, default="eager",
                   help="torch.compile nothing, each TransformerBlock, or the whole model")
    p.add_argument("--attention", choices=["naive", "sdpa"], default="naive", help="attention backend of the model")
    p.add_argument("--checkpoint-blocks", type=int, default=0, help="recompute groups of k blocks (0 = off)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--optimizer", choices=["ours", "torch_fused"], default="ours",
                   help="our AdamW, or torch.optim.AdamW(fused=True) (GPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda or cpu (default: cuda where a GPU is visible, else cpu)")
    p.add_argument("--json", action="store_true", help="print the settings and every metric as JSON, nothing else")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="warm-up and timed steps on stderr as they run (auto: when stderr is a terminal)")
    p.add_argument("--force", action="store_true",
                   help="run even where the memory estimate says the point cannot fit")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    try:
        get_size(a.size)
    except ValueError as exc:
        p.error(str(exc))
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: no CUDA GPU is visible on this host (torch {torch.__version__}); "
                "use --device cpu")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    if a.batch_size is not None and a.batch_size < 1 or a.context_length < 1:
        p.error("--batch-size and --context-length must be at least 1")
    settings = BenchSettings(size=a.size, context_length=a.context_length, mode=a.mode, dtype=a.dtype,
                             compile=a.compile, attention=a.attention, checkpoint_blocks=a.checkpoint_blocks,
                             warmup=a.warmup, steps=a.steps, optimizer=a.optimizer, batch_size=a.batch_size,
                             device=a.device)
    if not a.force and (refusal := refuse_if_it_cannot_fit(settings)):
        p.exit(2, f"{p.prog}: error: {refusal}\n")
    progress = a.progress == "on" or (a.progress == "auto" and sys.stderr.isatty())
    if progress:
        print(f"building {a.size} ({a.mode}, {a.dtype}, {a.compile}) on {a.device}", file=sys.stderr, flush=True)
    m = measure(settings, a.device, progress=progress)
    if a.json:
        resolved = {**asdict(settings), "batch_size": settings.spec().batch}
        json.dump({"settings": resolved, "metrics": m}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    memory = (f"peak GPU memory allocated {m['peak_memory_bytes'] / 2**30:.3f} GiB" if m["peak_memory_bytes"]
              else f"peak process RSS (CPU high-water mark) {m['peak_rss_bytes'] / 2**30:.3f} GiB")
    print(f"{a.size} batch={settings.spec().batch} ctx={a.context_length} {a.mode} {a.dtype} {a.compile} on "
          f"{a.device}: {m['mean_ms']:.2f} ± {m['std_ms']:.2f} ms (median {m['median_ms']:.2f}, min {m['min_ms']:.2f}) "
          f"over {a.steps} steps after {a.warmup} warm-up; {m['achieved_tflops']:.4g} TFLOP/s; {memory}")
    if "phase_median_ms" in m:
        print("  each phase timed alone (median ms): "
              + ", ".join(f"{k} {v:.2f}" for k, v in m["phase_median_ms"].items()))
    if m.get("gpu_busy_median_ms") is not None:
        print(f"  GPU busy {m['gpu_busy_median_ms']:.2f} ms per step (kernels only; the rest is waiting on the host)")



