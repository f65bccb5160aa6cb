"""The one-GPU proxy of the leaderboard step (results/leaderboard_proxy/): its table, and each config that
offloads blocks to host memory beside its twin that recomputes them. Not leaderboard results."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from cs336sys.units import GIB


def ok_time(cell: str) -> bool:
    return cell.replace(".", "", 1).isdigit()


def proxy_table(proxies: list[tuple[str, dict]], describe: Callable[[dict], str]) -> pd.DataFrame:
    """The one-GPU proxy's configs (not leaderboard results): median step and allocator peak; `describe`
    says what a config runs (its CSV's `setup`)."""
    rows = []
    for name, r in proxies:
        m = r.get("metrics") or {}
        ok = r["status"] == "ok"
        rows.append({"config": name, "setup": describe(r["settings"]),
                     "step (s)": f"{m['median_ms'] / 1e3:.3f}" if ok else r["status"],
                     "peak (GiB)": m.get("peak_bytes") / GIB if ok and m.get("peak_bytes") else None})
    table = pd.DataFrame(rows)
    base = [float(r["step (s)"]) for r in rows if r["config"] == "pytorch_parts" and ok_time(r["step (s)"])]
    if base:
        table.insert(3, "× PyTorch's parts", [f"{float(t) / base[0]:.3f}" if ok_time(t) else None
                                              for t in table["step (s)"]])
    return table if table["peak (GiB)"].notna().any() else table.drop(columns="peak (GiB)")


def offload_pairs(proxies: list[tuple[str, dict]]) -> list[dict]:
    """Proxy configs with `offload_blocks` against the config with the same settings that recomputes those
    blocks instead, where both ran to completion."""
    def key(settings: dict) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in settings.items() if k != "offload_blocks"))

    plain = {key(r["settings"]): (name, r) for name, r in proxies
             if r["status"] == "ok" and not r["settings"].get("offload_blocks")}
    pairs = []
    for name, r in proxies:
        k = r["settings"].get("offload_blocks") or 0
        twin = plain.get(key(r["settings"]))
        if not k or r["status"] != "ok" or twin is None:
            continue
        m, t = r["metrics"], twin[1]["metrics"]
        pairs.append({"config": name, "twin": twin[0], "offloaded": k,
                      "checkpointed": r["settings"].get("checkpoint_blocks"),
                      "step_s": m["median_ms"] / 1e3, "twin_step_s": t["median_ms"] / 1e3,
                      "ratio": m["median_ms"] / t["median_ms"],
                      "peak_gib": (m.get("peak_bytes") or 0) / GIB or None,
                      "twin_peak_gib": (t.get("peak_bytes") or 0) / GIB or None})
    return sorted(pairs, key=lambda p: (str(p["checkpointed"]), p["offloaded"]))
