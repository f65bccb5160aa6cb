"""Section: profiling a step (problem 2, nsys_profile): kernel tables from torch.profiler traces.

Every answer of the problem is computed here from the kernel_profile results: (a) the forward's
time in the profiler against the Python timer; (b) the top kernel by cumulative time in the forward
and in forward+backward, with its calls per forward; (c) the non-matmul kernels that matter; (d) the
matmul share from inference to a full train step; (e) softmax against the attention matmuls, in
time and in FLOPs. Each table names the tool that made it (CUPTI kernels on a GPU, CPU ops on the
smoke grid's CPU).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import (
    SIZE_ORDER,
    environment_summary,
    figure,
    ran_on,
    read_benchmark_tsv,
    results_frame,
    save_figure,
    save_table,
)
from cs336sys.analysis.context import SectionContext
from cs336sys.analysis.kernel_names import compact_name, distinct_names
from cs336sys.analysis.profiling_grid import longest_contexts
from cs336sys.analysis.profiling_paired import paired_shares
from cs336sys.results import read_result

AGREE_PCT = 10  # the profiler's forward "matches" the Python timer within this many percent
CLASSES = ("matmul", "softmax", "elementwise", "reduction", "copy", "indexing", "optimizer", "other")
CLASS_COLORS = {"matmul": "#4C72B0", "softmax": "#DD8452", "elementwise": "#55A868", "reduction": "#C44E52",
                "copy": "#8172B3", "indexing": "#937860", "optimizer": "#DA8BC3", "other": "#8C8C8C"}
def _count(x: float) -> int | float:
    """A count as an integer when it is one (calls per forward are whole numbers)."""
    return int(round(x)) if abs(x - round(x)) < 1e-9 else x


def _key(r: dict) -> tuple:
    s = r["settings"]
    size_rank = SIZE_ORDER.index(s["size"]) if s["size"] in SIZE_ORDER else len(SIZE_ORDER)
    return size_rank, s["context_length"], s["dtype"], s["mode"]


def _load(paths: list[Path]) -> list[dict]:
    results = [read_result(p) for p in paths if p.suffix == ".json"]
    return sorted((r for r in results if r["problem"] == "kernel_profile"), key=_key)


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _shares(by_class_us: dict[str, float]) -> dict[str, float]:
    total = sum(by_class_us.values())
    shares = {c: 0.0 for c in CLASSES}
    for c, us in by_class_us.items():
        shares[c if c in shares else "other"] += 100 * us / total if total else 0.0
    return shares


Span = dict[str, float]  # {"min", "max", "mean"} of a share over the profiled points (%)


@dataclass
class ProfilingContext(SectionContext):
    figures: dict[str, str] = field(default_factory=dict)
    """Figure name -> its file (`analysis.common.save_figure`)."""
    not_ok: list[str] | None = None
    """The points that did not run (size, context, mode, dtype: status), e.g. out of memory."""
    machine_s: float | None = None
    """Wall seconds of the section's jobs (Snakemake's timing records)."""
    tools: list[str] | None = None
    """The profilers the points used."""
    tool: str | None = None
    """`tools`, joined for the text."""
    is_cuda_trace: bool | None = None
    """Every point's trace holds GPU kernels (not CPU ops)."""
    unit: str | None = None
    """What a trace row is: "kernel" or "CPU op"."""
    nsys: list[str] | None = None
    """Nsight Systems reports the points also wrote."""
    sizes: list[str] | None = None
    """Model sizes profiled, smallest first."""
    context_lengths: list[int] | None = None
    """Context lengths profiled."""
    warmup: int | None = None
    """Untimed steps before the profiled ones."""
    profiled_steps: int | None = None
    """Steps timed and profiled per point."""
    batch_size: int | None = None
    """Sequences per batch."""
    forward_ratio: Span | None = None
    """(a) The profiler's forward span over the Python timer: {"min", "max", "median"}."""
    agree_pct: int | None = None
    """(a) Within how many percent the two count as agreeing (AGREE_PCT)."""
    forward_agrees: bool | None = None
    """(a) Every point's ratio is within `agree_pct` of 1."""
    profiler_overhead: Span | None = None
    """(a) The Python timer with the profiler on over without it: {"min", "max"}."""
    top_same: dict[str, int] | None = None
    """(b) In how many of the compared points the top kernel of the forward tops the forward+backward too."""
    detail: dict | None = None
    """(b, c) The largest profiled point: its label and its top kernels' names, classes, calls and shares."""
    non_matmul: list[dict] | None = None
    """(c) The four largest kernels of its forward that are not matrix products."""
    classes_figure_context: int | None = None
    """(d) The context length the figure of time by class shows."""
    paired: dict | None = None
    """(d) Kernel-class shares over the points where both modes ran (`profiling_paired.paired_shares`): the
    matmul share of a forward, a train step and its forward and backward alone; where the train step's is lower
    or higher; the elementwise and optimizer shares."""
    attention: dict[str, float] | None = None
    """(e) Softmax against the attention's two products: ranges of their time and FLOP ratios."""
    summary: list[dict] | None = None
    """The section's lines of the report's summary page."""
    limitations: list[str] | None = None
    """What the profiled grid leaves out of the handout's."""
    pending: list[str] | None = None
    """Points of the grid not measured yet, "2.7B at 2048" (config `profiling.pending`, run by the overlay next)."""
    longest: dict[str, list[str]] | None = None
    """(2026) Mode -> per size, the longest context that ran and the first that did not ("xl 1024 (2048 out of
    memory)"; "small 4096+": the longest tried ran)."""


def build(paths: list[Path], out: Path, pending: list[str] | None = None, **_: object) -> ProfilingContext:
    """`pending`: points of the grid not measured yet ("2.7B at 2048"; config `profiling.pending`)."""
    frame = results_frame(paths)
    ctx = ProfilingContext(env=environment_summary(frame), pending=list(pending) if pending else None)
    results = _load(paths)
    if not results:
        return ctx
    ok = [r for r in results if r["status"] == "ok"]
    ctx.not_ok = [f"{r['settings']['size']} ctx {r['settings']['context_length']} {r['settings']['mode']} "
                     f"{r['settings']['dtype']}: {r['status']}" for r in results if r["status"] != "ok"]
    ctx.longest = longest_contexts(results)
    timings = [p for p in paths if p.suffix == ".tsv" and p.exists()]
    if timings:
        ctx.machine_s = sum(read_benchmark_tsv(p) for p in timings)
    if not ok:
        return ctx
    m0 = ok[0]["metrics"]
    ctx.tools = sorted({r["metrics"]["tool"] for r in ok})
    ctx.tool = ", ".join(ctx.tools)
    ctx.is_cuda_trace = all(r["metrics"]["trace_source"] == "cuda" for r in ok)
    ctx.unit = "kernel" if ctx.is_cuda_trace else "CPU op"
    ctx.nsys = sorted({r["metrics"]["nsys"] for r in ok if r["metrics"].get("nsys")})
    ctx.sizes = sorted({r["settings"]["size"] for r in ok}, key=SIZE_ORDER.index)
    ctx.context_lengths = sorted({r["settings"]["context_length"] for r in ok})
    ctx.warmup = ok[0]["settings"]["warmup"]
    ctx.profiled_steps = ok[0]["settings"]["steps"]
    ctx.batch_size = m0["batch_size"]

    forward = {(r["settings"]["size"], r["settings"]["context_length"], r["settings"]["dtype"]): r["metrics"]
               for r in ok if r["settings"]["mode"] == "forward"}
    train = {(r["settings"]["size"], r["settings"]["context_length"], r["settings"]["dtype"]): r["metrics"]
             for r in ok if r["settings"]["mode"] == "train_step"}

    _forward_time(ctx, out, forward)
    _top_kernels(ctx, out, forward, train)
    if ctx.detail:  # where the detailed point ran, for its tables' captions
        key = (ctx.detail["size"], ctx.detail["context_length"], ctx.detail["dtype"])
        ctx.detail["on"] = ran_on(r.get("env", {}).get("gpu") for r in ok if _key(r) == key)
    _classes(ctx, out, forward, train)
    _attention(ctx, out, forward)
    _summary(ctx)
    return ctx


def _summary(ctx: ProfilingContext) -> None:
    """The page-1 row (the matmul share) and what the profiled grid leaves out."""
    ctx.summary = []
    paired = ctx.paired
    if paired:
        share = paired["matmul"]
        ctx.summary.append({"part": "Matrix products' share of GPU time", "target": None, "met": None,
                               "result": f"{share['forward']['mean']:.0f} % of a forward, "
                                         f"{share['train_step']['mean']:.0f} % of a train step (fp32, mean of "
                                         f"the {paired['points']} points where both ran)",
                               "ref": "prof-classes"})
    # the 2025 handout's nsys_profile grid: every size of its table at contexts 128, 256, 512 and 1024
    asked_sizes, asked_contexts = {"small", "medium", "large", "xl", "2.7B"}, {128, 256, 512, 1024}
    if not (asked_sizes <= set(ctx.sizes) and asked_contexts <= set(ctx.context_lengths)):
        ctx.limitations = [f"Kernels were profiled for {', '.join(ctx.sizes)} at contexts "
                              f"{', '.join(str(c) for c in ctx.context_lengths)}; the 2025 handout's "
                              "nsys_profile asks for every model size at four context lengths."]


def _key(result: dict) -> tuple:
    return tuple(result["settings"][k] for k in ("size", "context_length", "dtype"))


def _label(key: tuple) -> str:
    size, context, dtype = key
    return f"{size} ctx {context}" + ("" if dtype == "fp32" else f" {dtype}")


def _forward_time(ctx: ProfilingContext, out: Path, forward: dict) -> None:
    """(a) The forward pass: profiler (kernel span, host range) against the Python timer."""
    if not forward:
        return
    rows, ratios, overheads = [], [], []
    for (size, context, dtype), m in forward.items():
        python = m["python_ms"]["mean_ms"]
        ratio = m["profiler_forward_ms"] / python if python else None
        ratios.append(ratio)
        overheads.append(m["python_profiled_ms"]["mean_ms"] / python if python else None)
        rows.append({"size": size, "context": context, "dtype": dtype, "Python timer (ms)": python,
                     "timer, profiled (ms)": m["python_profiled_ms"]["mean_ms"],
                     "profiler span (ms)": m["profiler_forward_ms"],
                     "profiler busy (ms)": m["profiler_forward_busy_ms"],
                     "span / timer": ratio})
    ctx.tables["forward_time"] = save_table(pd.DataFrame(rows), out, "forward_time", digits=2)
    ratios = [r for r in ratios if r is not None]
    overheads = [o for o in overheads if o is not None]
    ctx.forward_ratio = {"min": min(ratios), "max": max(ratios), "median": statistics.median(ratios)}
    ctx.agree_pct = AGREE_PCT
    ctx.forward_agrees = max(abs(r - 1) for r in ratios) <= AGREE_PCT / 100
    ctx.profiler_overhead = {"min": min(overheads), "max": max(overheads)}


def _top_row(scope: dict | None) -> dict | None:
    return scope["top"][0] if scope and scope["top"] else None


def _top_kernels(ctx: ProfilingContext, out: Path, forward: dict, train: dict) -> None:
    """(b) Top kernel per forward and per forward+backward; (c) the non-matmul kernels."""
    rows, same = [], []
    for key, m in forward.items():
        top_f = _top_row(m["scopes"].get("forward"))
        if top_f is None:
            continue
        t = train.get(key)
        top_fb = _top_row(t["scopes"].get("forward+backward")) if t else None
        is_same = None if top_fb is None else top_fb["name"] == top_f["name"]
        if is_same is not None:
            same.append(is_same)
        shown = distinct_names([top_f["short_name"]] + ([top_fb["short_name"]] if top_fb else []), 24)
        fb_cell = "n/a" if top_fb is None else "same" if is_same else f"`{shown[1]}`"
        rows.append({"size": key[0], "context": key[1],
                     f"top forward {ctx.unit}": f"`{shown[0]}`",
                     "calls / forward": _count(top_f["calls_per_occurrence"]), "share (%)": 100 * top_f["share"],
                     "top in forward+backward": fb_cell,
                     "its share (%)": None if top_fb is None else 100 * top_fb["share"]})
    if rows:
        ctx.tables["top_summary"] = save_table(pd.DataFrame(rows), out, "top_kernels_summary", digits=1)
        ctx.top_same = {"same": sum(same), "compared": len(same)}

    # The detailed tables: the largest size at its longest context with both modes profiled.
    both = [k for k in forward if k in train] or list(forward)
    key = max(both, key=lambda k: (SIZE_ORDER.index(k[0]) if k[0] in SIZE_ORDER else -1, k[1]))
    ctx.detail = {"label": _label(key), "size": key[0], "context_length": key[1], "dtype": key[2]}
    fwd = forward[key]["scopes"].get("forward")
    if fwd:
        top = fwd["top"][0]
        ctx.detail.update(
            top_forward=compact_name(top["short_name"], 60), top_forward_class=top["class"],
            top_forward_calls=top["calls_per_occurrence"], top_forward_share=100 * top["share"],
            num_layers=forward[key]["num_layers"],
            top_forward_calls_per_layer=top["calls_per_occurrence"] / forward[key]["num_layers"],
            forward_ms=fwd["device_us_per_occurrence"] / 1e3)
        ctx.tables["top_forward"] = save_table(_kernel_rows(fwd["top"], "forward"), out, "top_forward", digits=2)
        # one ranking and one naming for the table and the prose: largest summed time first, ties by name
        non = ranked(fwd["top_non_matmul"])
        rows = _kernel_rows(non, "forward")
        ctx.tables["non_matmul"] = save_table(rows, out, "non_matmul_forward", digits=2)
        ctx.non_matmul = [{"name": name.strip("`"), "class": r["class"], "share": 100 * r["share"]}
                          for name, r in zip(rows["name"][:4], non[:4], strict=True)]
    fb = train[key]["scopes"].get("forward+backward") if key in train else None
    if fb:
        top = fb["top"][0]
        ctx.detail.update(top_fb=compact_name(top["short_name"], 60), top_fb_class=top["class"],
                             top_fb_share=100 * top["share"],
                             top_fb_same=fwd is not None and top["name"] == fwd["top"][0]["name"])
        ctx.tables["top_fb"] = save_table(_kernel_rows(fb["top"], "forward+backward"), out, "top_forward_backward",
                                             digits=2)


def ranked(rows: list[dict]) -> list[dict]:
    """Kernel rows by summed time, largest first; equal times by name, so that a tie has one order."""
    return sorted(rows, key=lambda r: (-r["total_us"], r["name"]))


def _kernel_rows(rows: list[dict], scope: str) -> pd.DataFrame:
    per = "forward" if scope == "forward" else "step"
    def per_occurrence_ms(r: dict) -> float:
        occurrences = r["calls"] / r["calls_per_occurrence"] if r["calls_per_occurrence"] else 1
        return r["total_us"] / 1e3 / occurrences

    names = distinct_names([r["short_name"] for r in rows], 38)
    return pd.DataFrame([{"name": f"`{name}`", "class": r["class"],
                          f"calls / {per}": _count(r["calls_per_occurrence"]), "mean (µs)": r["mean_us"],
                          f"total / {per} (ms)": per_occurrence_ms(r), "share (%)": 100 * r["share"]}
                         for name, r in zip(names, rows, strict=True)])


def _classes(ctx: ProfilingContext, out: Path, forward: dict, train: dict) -> None:
    """(d) Time by kernel class, inference against a train step, compared over the points where both ran;
    the figure of the same."""
    rows, bars = [], []
    by_mode: dict[str, dict] = {"forward": {}, "train step": {}}
    forward_backward = {}  # the train step's forward and backward alone: matmul share (%)
    contexts = sorted({k[1] for k in train} or {k[1] for k in forward})
    figure_context = 512 if 512 in contexts else contexts[-1] if contexts else None
    ctx.classes_figure_context = figure_context
    for key in sorted(set(forward) | set(train), key=lambda k: (SIZE_ORDER.index(k[0]), k[1], k[2])):
        for mode, source, scope in (("forward", forward, "forward"), ("train step", train, "train_step")):
            m = source.get(key)
            if m is None or scope not in m["scopes"]:
                continue
            by_class = dict(m["scopes"][scope]["by_class_us"])
            optimizer = (m["scopes"].get("optimizer_step") or {}).get("by_class_us") if scope == "train_step" else None
            if optimizer:  # the optimizer step's kernels are its own class, whatever their kind (elementwise)
                for c, us in optimizer.items():
                    by_class[c] = by_class.get(c, 0.0) - us
                by_class["optimizer"] = by_class.get("optimizer", 0.0) + sum(optimizer.values())
            shares = _shares(by_class)
            rows.append({"size": key[0], "context": key[1], "mode": mode,
                         **{f"{c} (%)": shares[c] for c in ("matmul", "softmax", "elementwise", "reduction",
                                                             "optimizer")},
                         "rest (%)": shares["copy"] + shares["indexing"] + shares["other"]})
            if key[1] == figure_context:  # the figure: one context, every size and mode
                bars.append((f"{_label(key)}, {mode}", shares))
            by_mode[mode][key] = shares
            if scope == "train_step" and "forward+backward" in m["scopes"]:
                forward_backward[key] = _shares(m["scopes"]["forward+backward"]["by_class_us"])["matmul"]
    if not rows:
        return
    ctx.tables["classes"] = save_table(pd.DataFrame(rows), out, "time_by_class", digits=1)
    ctx.paired = paired_shares(by_mode["forward"], by_mode["train step"], forward_backward, _label)

    fig, ax = figure(0.32 * len(bars) + 1.3)
    left = [0.0] * len(bars)
    for c in CLASSES:
        widths = [s[c] for _, s in bars]
        ax.barh(range(len(bars)), widths, left=left, color=CLASS_COLORS[c], label=c, height=0.7)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"share of {ctx.unit} time (%)")
    ax.grid(axis="y", visible=False)
    fig.legend(loc="outside lower center", ncol=4, frameon=False)
    ctx.figures["classes"] = save_figure(fig, out, "time_by_class")


def _attention(ctx: ProfilingContext, out: Path, forward: dict) -> None:
    """(e) Softmax against the two attention matmuls in the forward: time and FLOPs."""
    rows, time_ratios, flop_ratios = [], [], []
    for key, m in forward.items():
        a = m.get("attention")
        if not a or not a["calls"] or not a["softmax_us"]:
            continue
        calls = a["calls"]
        rows.append({"size": key[0], "context": key[1],
                     "matmuls (µs/call)": a["matmul_us"] / calls, "softmax (µs/call)": a["softmax_us"] / calls,
                     "time ratio": a["time_ratio"], "FLOP ratio": a["flop_ratio"],
                     "matmul (GFLOP/s)": (a["matmul_flop_per_s"] or 0) / 1e9,
                     "softmax (GFLOP/s)": (a["softmax_flop_per_s"] or 0) / 1e9})
        time_ratios.append(a["time_ratio"])
        flop_ratios.append(a["flop_ratio"])
    if not rows:
        return
    ctx.tables["attention"] = save_table(pd.DataFrame(rows), out, "attention_softmax_matmul", digits=2)
    ctx.attention = {"time_ratio_min": min(time_ratios), "time_ratio_max": max(time_ratios),
                        "flop_ratio_min": min(flop_ratios), "flop_ratio_max": max(flop_ratios),
                        "flop_over_time_min": min(f / t for f, t in zip(flop_ratios, time_ratios, strict=True)),
                        "flop_over_time_max": max(f / t for f, t in zip(flop_ratios, time_ratios, strict=True))}
