"""Where the host time of a DDP step goes (issue 24): per variant, the step's phases timed, then one
profiled step (torch.profiler, CPU activities, Python calls recorded) read back into counts and times
of what our wrappers do on the host: hook calls, the tensor operations inside the hooks and inside
`finish_gradient_synchronization()` (allocations, copies, fills, all-reduce launches), and, for every
variant, PyTorch's DDP included, the all-reduces started per step.

    # CPU, gloo, 2 ranks: the 2025 xl's 435 parameter tensors at tiny width, so host work dominates
    PYTHONPATH=src python notes/runs/2026-11-24-cpu/ddp_host_profile.py --out DIR
    # one GPU: world size 1 in an NCCL group of one (hooks, buckets, launches; no transfer)
    PYTHONPATH=src python notes/runs/2026-11-24-cpu/ddp_host_profile.py --device cuda --world 1 --size xl --dtype bf16 \
        --context 512 --batch 4 --out DIR

Rows (rank 0's; one per variant) go to DIR/ddp_host_profile.json with the settings and the machine;
a table is printed. The timed steps run without the profiler; the profiled step's times carry the
profiler's per-call cost (the Python tracer most), so they compare variants within one run, not
with the timed steps. Variants: none, naive, flat, overlap, bucketed:MB, bucket_view:MB, torch_ddp:MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

from cs336sys.distributed.experiments import DDPStepSettings, build_ddp_step, one_rank_group
from cs336sys.distributed.spawn import spawn
from cs336sys.jobs import Run
from cs336sys.sizes import SIZES, ModelSize
from cs336sys.timing import synchronize

DEFAULT_VARIANTS = ["none", "overlap", "bucketed:1", "bucketed:25", "bucketed:1000", "bucket_view:0",
                    "bucket_view:1", "bucket_view:25", "bucket_view:1000", "torch_ddp:25"]
# tensor operations that make a new tensor (the allocation happens inside; copies counted apart)
ALLOCATING = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::zeros", "aten::zeros_like",
              "aten::clone", "aten::cat", "aten::new_empty", "aten::new_zeros", "aten::contiguous",
              "aten::_to_copy", "aten::lift_fresh", "aten::scalar_tensor"}
OURS = {"hook": ": _on_gradient_ready", "finish": ": finish_gradient_synchronization"}


def parse_variant(text: str) -> tuple[str, float | None]:
    name, _, mb = text.partition(":")
    return name, float(mb) if mb else None


def _top_level_inside(events: list[dict], windows: list[dict]) -> Counter:
    """Names (counted) of the cpu_ops that `windows` call directly: inside a window (same thread) and
    inside no other cpu_op there. What our Python code asks for; the operations those run within
    (a CPU fallback's per-tensor loop, say) are theirs."""
    counts: Counter = Counter()
    spans: dict = {}
    for w in windows:
        spans.setdefault(w["tid"], []).append((w["ts"], w["ts"] + w["dur"]))
    for tid, ws in spans.items():
        ws.sort()
        ops = sorted((e for e in events if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
        k, open_until = 0, -1.0  # the window being walked; the end of the top-level op open in it
        for e in ops:
            while k < len(ws) and ws[k][1] < e["ts"]:
                k, open_until = k + 1, -1.0
            if k == len(ws):
                break
            a, b = ws[k]
            if a <= e["ts"] and e["ts"] + e["dur"] <= b and e["ts"] >= open_until:
                counts[e["name"]] += 1
                open_until = e["ts"] + e["dur"]
    return counts


def _categorise(ops: Counter) -> dict:
    return {"alloc": sum(n for k, n in ops.items() if k in ALLOCATING),
            "copy": ops.get("aten::copy_", 0),
            "fill": ops.get("aten::fill_", 0) + ops.get("aten::zero_", 0),
            "allreduce": sum(n for k, n in ops.items() if k.startswith("c10d::allreduce")),
            "ops": sum(ops.values())}


def profile_summary(trace: dict, steps: int) -> dict:
    """Per step: our hook calls and time, finish's time, and the tensor operations each calls directly."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    py = [e for e in events if e.get("cat") == "python_function"]
    out: dict = {}
    for part, suffix in OURS.items():
        calls = [e for e in py if e["name"].endswith(suffix)]
        ops = _top_level_inside(cpu_ops, calls)
        out[f"{part}_calls"] = len(calls) / steps
        out[f"{part}_ms"] = sum(e["dur"] for e in calls) / 1e3 / steps
        out.update({f"{part}_{k}": v / steps for k, v in _categorise(ops).items()})
        out[f"{part}_top_ops"] = {k: v / steps for k, v in ops.most_common(8)}
    out["allreduce_per_step"] = sum(1 for e in cpu_ops if e["name"].startswith("c10d::allreduce")) / steps
    out["allreduce_launch_ms"] = sum(e["dur"] for e in cpu_ops if e["name"].startswith("c10d::allreduce")) / 1e3 / steps
    return out


def _measure(step, run: Run, warmup: int, steps: int, profiled: int, zero_in_place: bool) -> dict:
    """Timed steps (the experiment's phases), then `profiled` steps under the profiler."""
    def zero_grad() -> None:
        if zero_in_place:  # gradients keep their memory (bucket views stay views)
            step.optimizer.zero_grad(set_to_none=False)
        else:
            step.zero_grad()  # as the experiments: set_to_none=True

    def one_step() -> None:
        step.forward_backward()
        step.sync()
        step.optimizer_step()
        zero_grad()

    phases = {"fwd_bwd": [], "sync": [], "optimizer": [], "zero_grad": [], "step": []}
    for i in range(warmup + steps):
        synchronize(run.device)
        t0 = time.perf_counter()
        step.forward_backward()
        t1 = time.perf_counter()
        step.sync()
        t2 = time.perf_counter()
        step.optimizer_step()
        t3 = time.perf_counter()
        zero_grad()
        synchronize(run.device)
        t4 = time.perf_counter()
        if i >= warmup:
            for k, (a, b) in {"fwd_bwd": (t0, t1), "sync": (t1, t2), "optimizer": (t2, t3), "zero_grad": (t3, t4),
                              "step": (t0, t4)}.items():
                phases[k].append((b - a) * 1e3)
    row = {f"{k}_ms": statistics.median(v) for k, v in phases.items()}
    row["step_std_ms"] = statistics.stdev(phases["step"]) if len(phases["step"]) > 1 else 0.0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(profiled):
            one_step()
        synchronize(run.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return row | {"profiled_" + k: v for k, v in profile_summary(trace, profiled).items()}


def _rank(info, args: dict) -> list[dict]:
    run = Run(device=info.device, rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
              backend=info.backend)
    if info.world_size == 1:
        with one_rank_group(run):
            return _variants(run, args)
    return _variants(run, args)


def _variants(run: Run, args: dict) -> list[dict]:
    size = SIZES[args["size"]]
    if args["d_model"]:
        size = ModelSize(f"{size.name}-d{args['d_model']}", args["d_model"], 4 * args["d_model"], size.num_layers,
                         max(1, args["d_model"] // 16), vocab_size=args["vocab"] or size.vocab_size)
    rows = []
    for text in args["variants"]:
        variant, mb = parse_variant(text)
        settings = DDPStepSettings(size=size, variant=variant, bucket_size_mb=mb, context_length=args["context"],
                                   batch_size=args["batch"], dtype=args["dtype"], device=args["device"])
        step = build_ddp_step(settings, run)
        groups = getattr(step.module, "gradient_groups", None)
        row = {"variant": variant, "bucket_mb": mb, "buckets": len(groups) if groups is not None else None,
               "param_tensors": sum(1 for p in step.model.parameters() if p.requires_grad)}
        row |= _measure(step, run, args["warmup"], args["steps"], args["profiled"], args["zero_in_place"])
        rows.append(row)
        del step
        dist.barrier()
    return rows


def _table(rows: list[dict]) -> str:
    cols = [("variant", "{}"), ("bucket_mb", "{}"), ("buckets", "{}"), ("step_ms", "{:.2f}"), ("sync_ms", "{:.2f}"),
            ("profiled_hook_calls", "{:.0f}"), ("profiled_hook_ms", "{:.2f}"), ("profiled_hook_alloc", "{:.0f}"),
            ("profiled_hook_copy", "{:.0f}"), ("profiled_finish_ms", "{:.2f}"), ("profiled_finish_alloc", "{:.0f}"),
            ("profiled_finish_copy", "{:.0f}"), ("profiled_allreduce_per_step", "{:.0f}")]
    lines = [" ".join(f"{c.removeprefix('profiled_'):>14}" for c, _ in cols)]
    for r in rows:
        lines.append(" ".join(f"{'' if r.get(c) is None else f.format(r[c]):>14}" for c, f in cols))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--world", type=int, default=2, help="ranks (gloo on cpu, NCCL on cuda; 1: a group of one)")
    parser.add_argument("--size", default="xl", help="a size of cs336sys.sizes (its layer count)")
    parser.add_argument("--d-model", type=int, default=None,
                        help="narrow the size to this width (d_ff 4x, heads d/16); default on cpu: 32")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary of a narrowed size (default 1000 on cpu)")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--profiled", type=int, default=2, help="profiled steps after the timed ones")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--zero-in-place", action="store_true",
                        help="zero gradients with set_to_none=False (default: set_to_none=True, as the experiments)")
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    if a.device == "cpu":
        a.d_model = a.d_model or 32
        a.vocab = a.vocab or 1000
    args = {k: getattr(a, k) for k in ("device", "size", "d_model", "vocab", "dtype", "context", "batch", "warmup",
                                       "steps", "profiled", "variants", "zero_in_place")}
    per_rank = spawn(_rank, a.world, args, device=a.device, timeout_s=3600, pg_timeout_s=600)
    rows = [r | {"world_size": a.world, "device": a.device, "backend": "nccl" if a.device == "cuda" else "gloo",
                 "zero_in_place": a.zero_in_place}
            for r in per_rank[0]]
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ddp_host_profile.json").write_text(json.dumps({"settings": args | {"world": a.world},
                                                            "machine": machine, "rows": rows}, indent=1) + "\n")
    print(_table(rows))


if __name__ == "__main__":
    main()
