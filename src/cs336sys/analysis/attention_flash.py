"""The attention section's FlashAttention-2 grid (problem 11), its numbers and tables: the time and TFLOP/s
tables of ours against SDPA, naive and compiled naive attention, the CUDA-graph replays, the main text's
compact table, the targets, the host-bound floor, fp32 with IEEE against TF32 products, and what a kernel
could reach at the matmul peak. The figures are drawn in cs336sys.analysis.attention."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import save_table

IMPL_LABEL = {"triton": "ours (Triton)", "triton_ieee": "ours, IEEE float32 products", "sdpa": "PyTorch SDPA",
              "naive": "naive PyTorch", "naive_compiled": "naive, torch.compile"}
# Targets of the project's attention issue (ratios measured in the same run).
TARGETS = {"forward_vs_sdpa": 1.25, "fwd_bwd_vs_sdpa": 1.5, "naive_over_ours_at_16384": 20.0}
NAIVE_TARGET_SEQ = 16384
SHORT = {"triton": "ours", "triton_ieee": "ours, IEEE", "sdpa": "SDPA", "naive": "naive",
         "naive_compiled": "compiled"}


def time_tables(wide: pd.DataFrame, statuses: pd.DataFrame, out: Path) -> dict[str, str]:
    """Per dtype, the forward, backward and forward+backward times of every point (a status where one did
    not run), with ours over SDPA and naive over ours."""
    tables = {}
    for dtype, g in wide.groupby("dtype"):
        impls = [i for i in IMPL_LABEL if f"fwd_bwd_ms:{i}" in g]
        for part, label in (("forward_ms", "forward"), ("backward_ms", "backward"), ("fwd_bwd_ms", "fwd_bwd")):
            rows = []
            for _, r in g.sort_values(["d", "seq"]).iterrows():
                row = {"d": r["d"], "seq": r["seq"]}
                for impl in impls:
                    st = statuses.loc[(dtype, r["d"], r["seq"]), impl] if impl in statuses else "missing"
                    value = r.get(f"{part}:{impl}")
                    row[f"{SHORT[impl]} (ms)"] = f"{value:.3f}" if st == "ok" and pd.notna(value) else st
                if f"{part}:triton" in g and f"{part}:sdpa" in g:
                    row["ours / SDPA (×)"] = r[f"{part}:triton"] / r[f"{part}:sdpa"]
                if f"{part}:triton_ieee" in g and f"{part}:sdpa" in g:  # IEEE against IEEE (TF32 off in SDPA)
                    row["ours, IEEE / SDPA (×)"] = r[f"{part}:triton_ieee"] / r[f"{part}:sdpa"]
                if f"{part}:triton" in g and f"{part}:naive" in g:
                    row["naive / ours (×)"] = r[f"{part}:naive"] / r[f"{part}:triton"]
                rows.append(row)
            if rows and any(f"{SHORT[i]} (ms)" in rows[0] for i in impls):
                table = pd.DataFrame(rows)
                # at most 9 columns fit the page: with the IEEE columns the printed table leaves out
                # naive / ours (the two times are beside each other); the CSV keeps every column
                printed = table.drop(columns="naive / ours (×)") if len(table.columns) > 9 else table
                tables[f"{dtype} {label.replace('_', '+')}"] = save_table(printed, out, f"flash_{dtype}_{label}",
                                                                          data=table)
    return tables


def host_floor(wide: pd.DataFrame) -> dict | None:
    """The shortest forward+backward of ours and of SDPA (bf16 where measured), and the sequence length
    from which ours is faster."""
    if "fwd_bwd_ms:triton" not in wide:
        return None
    bf = wide[wide["dtype"] == "bf16"] if (wide["dtype"] == "bf16").any() else wide
    floor = {"ours_min_fwd_bwd_ms": float(bf["fwd_bwd_ms:triton"].min()),
             "sdpa_min_fwd_bwd_ms": float(bf["fwd_bwd_ms:sdpa"].min()) if "fwd_bwd_ms:sdpa" in bf else None}
    if "fwd_bwd_ms:sdpa" in bf:
        faster = bf.assign(r=bf["fwd_bwd_ms:triton"] / bf["fwd_bwd_ms:sdpa"]).groupby("seq")["r"].max()
        # the shortest sequence length from which ours is faster at every d and every longer length
        tail = [int(q) for q in faster.index if (faster.loc[faster.index >= q] < 1).all()]
        floor["crossover_seq"] = min(tail) if tail else None
    return floor


def fp32_precision(flash: pd.DataFrame) -> dict | None:
    """fp32 at the longest sequence every d measured: ours with TF32 products (Triton's default) and
    with IEEE fp32 products, each over SDPA's forward+backward time (SDPA multiplies in IEEE fp32)."""
    ok = flash[(flash.status == "ok") & (flash.dtype == "fp32")]
    if ok.empty or not {"triton", "triton_ieee", "sdpa"} <= set(ok.impl):
        return None
    times = ok.pivot_table(index=["seq", "d"], columns="impl", values="fwd_bwd_ms").dropna(
        subset=["triton", "triton_ieee", "sdpa"])
    if times.empty:
        return None
    seq = int(times.index.get_level_values("seq").max())
    at = times.xs(seq, level="seq")
    tf32, ieee = at["triton"] / at["sdpa"], at["triton_ieee"] / at["sdpa"]
    return {"seq": seq, "tf32": (float(tf32.min()), float(tf32.max())), "ieee": (float(ieee.min()), float(ieee.max())),
            "ieee_over_tf32": (float((at["triton_ieee"] / at["triton"]).min()),
                               float((at["triton_ieee"] / at["triton"]).max()))}


def compact(wide: pd.DataFrame, out: Path) -> str | None:
    """The main text's table: bf16 at the two longest sequence lengths, every d: forward, backward and
    forward+backward of ours against SDPA, and naive over ours."""
    need = {"forward_ms:triton", "backward_ms:triton", "fwd_bwd_ms:triton", "fwd_bwd_ms:sdpa"}
    bf = wide[wide["dtype"] == "bf16"]
    if bf.empty or not need <= set(bf.columns):
        return None
    seqs = sorted(bf["seq"].unique())[-2:]
    rows = []
    for _, r in bf[bf["seq"].isin(seqs)].sort_values(["seq", "d"]).iterrows():
        row = {"seq": r["seq"], "d": r["d"], "fwd ours (ms)": r["forward_ms:triton"],
               "fwd SDPA (ms)": r.get("forward_ms:sdpa"), "bwd ours (ms)": r["backward_ms:triton"],
               "bwd SDPA (ms)": r.get("backward_ms:sdpa"),
               "fwd+bwd ours / SDPA (×)": r["fwd_bwd_ms:triton"] / r["fwd_bwd_ms:sdpa"]}
        if pd.notna(r.get("fwd_bwd_ms:naive")):
            row["naive / ours (×)"] = r["fwd_bwd_ms:naive"] / r["fwd_bwd_ms:triton"]
        rows.append(row)
    return save_table(pd.DataFrame(rows), out, "flash_compact", digits=3)


def graphed_table(g: pd.DataFrame) -> pd.DataFrame:
    """Ours against SDPA as CUDA-graph replays (GPU time only) next to the eager ratios."""
    rows = []
    for _, r in g.sort_values(["d", "seq"]).iterrows():
        rows.append({"d": r["d"], "seq": r["seq"],
                     "fwd ours (ms)": r["graph_forward_ms:triton"], "fwd SDPA (ms)": r["graph_forward_ms:sdpa"],
                     "fwd ours / SDPA": r["graph_forward_ms:triton"] / r["graph_forward_ms:sdpa"],
                     "fwd+bwd ours (ms)": r["graph_fwd_bwd_ms:triton"],
                     "fwd+bwd SDPA (ms)": r["graph_fwd_bwd_ms:sdpa"],
                     "fwd+bwd ours / SDPA": r["graph_fwd_bwd_ms:triton"] / r["graph_fwd_bwd_ms:sdpa"],
                     "eager fwd+bwd ours / SDPA": r["fwd_bwd_ms:triton"] / r["fwd_bwd_ms:sdpa"]})
    return pd.DataFrame(rows)


def targets(wide: pd.DataFrame) -> list[dict]:
    rows = []
    big = wide[(wide["dtype"] == "bf16") & (wide["seq"] >= 8192) & (wide["d"].isin([64, 128]))]
    for _, r in big.sort_values(["d", "seq"]).iterrows():
        if "forward_ms:triton" not in r or "forward_ms:sdpa" not in r:
            continue
        fwd = r["forward_ms:triton"] / r["forward_ms:sdpa"]
        fb = r["fwd_bwd_ms:triton"] / r["fwd_bwd_ms:sdpa"]
        row = {"d": int(r["d"]), "seq": int(r["seq"]), "forward_vs_sdpa": float(fwd), "fwd_bwd_vs_sdpa": float(fb),
               "forward_ok": bool(fwd <= TARGETS["forward_vs_sdpa"]),
               "fwd_bwd_ok": bool(fb <= TARGETS["fwd_bwd_vs_sdpa"])}
        if pd.notna(r.get("graph_fwd_bwd_ms:triton")) and pd.notna(r.get("graph_fwd_bwd_ms:sdpa")):
            gf = r["graph_forward_ms:triton"] / r["graph_forward_ms:sdpa"]
            gfb = r["graph_fwd_bwd_ms:triton"] / r["graph_fwd_bwd_ms:sdpa"]
            row.update(graph_forward_vs_sdpa=float(gf), graph_fwd_bwd_vs_sdpa=float(gfb),
                       graph_forward_ok=bool(gf <= TARGETS["forward_vs_sdpa"]),
                       graph_fwd_bwd_ok=bool(gfb <= TARGETS["fwd_bwd_vs_sdpa"]))
        naive = r.get("fwd_bwd_ms:naive")
        if int(r["seq"]) == NAIVE_TARGET_SEQ and pd.notna(naive):
            row["naive_over_ours"] = float(naive / r["fwd_bwd_ms:triton"])
            row["naive_ok"] = bool(row["naive_over_ours"] >= TARGETS["naive_over_ours_at_16384"])
        rows.append(row)
    return rows


def feasibility(df: pd.DataFrame, ceiling_tflops: float) -> list[dict]:
    """Whether >= 20x naive at seq 16384 is reachable at all: the time it allows, the rate that
    needs (credited FLOPs, as in the TFLOP/s tables), and the best ratio any kernel could reach at
    the measured bf16 matrix-product ceiling; next to the best ratio measured in this grid."""
    ok = df[(df.status == "ok") & (df["dtype"] == "bf16") & (df["seq"] == NAIVE_TARGET_SEQ)]
    rows = []
    for d, g in ok.groupby("d"):
        by = g.set_index("impl")
        if "naive" not in by.index or "triton" not in by.index:
            continue
        naive_ms = float(by.loc["naive", "fwd_bwd_ms"])
        flops = float(by.loc["triton", "fwd_bwd_flops"])
        allowed_ms = naive_ms / TARGETS["naive_over_ours_at_16384"]
        floor_ms = flops / (ceiling_tflops * 1e12) * 1e3
        measured = {}
        for impl, label in (("triton", "ours"), ("sdpa", "SDPA")):
            for col, how in (("fwd_bwd_ms", "eager"), ("graph_fwd_bwd_ms", "graphed")):
                if impl in by.index and col in by and pd.notna(by.loc[impl, col]):
                    measured[f"{label} {how}"] = naive_ms / float(by.loc[impl, col])
        rows.append({"d": int(d), "naive_ms": naive_ms, "allowed_ms": allowed_ms,
                     "needed_tflops": flops / (allowed_ms * 1e-3) / 1e12, "ceiling_tflops": ceiling_tflops,
                     "needed_fraction": flops / (allowed_ms * 1e-3) / 1e12 / ceiling_tflops,
                     "max_ratio_at_ceiling": naive_ms / floor_ms, "measured": measured})
    return rows


def tflops_tables(ok: pd.DataFrame, out: Path) -> dict:
    """Achieved TFLOP/s (attended pairs only, see cs336sys.attention.bench_common) of forward+backward."""
    tables = {}
    for dtype, g in ok.groupby("dtype"):
        wide = g.pivot_table(index=["d", "seq"], columns="impl", values="fwd_bwd_tflops").reset_index()
        wide.columns.name = None
        wide = wide.rename(columns={"triton": "ours", "triton_ieee": "ours, IEEE", "sdpa": "SDPA",
                                    "naive_compiled": "compiled"})
        wide = wide[["d", "seq"] + [c for c in ("naive", "compiled", "SDPA", "ours", "ours, IEEE") if c in wide]]
        tables[f"{dtype} fwd+bwd TFLOP/s"] = save_table(wide, out, f"flash_{dtype}_tflops", digits=1)
    return tables
