"""The profiling grid's answer to the 2026 nsys_profile question, the longest context that fits: read from
which points ran and which ran out of memory (`cs336sys.analysis.profiling` builds the section)."""

from __future__ import annotations

from cs336sys.analysis.common import SIZE_ORDER, gpu_model


def longest_contexts(results: list[dict]) -> dict[str, list[str]]:
    """nsys_profile (2026): per mode, each size's longest context that ran: "xl 1024 (2048 out of memory)", "small
    4096+" (the grid's longest ran), "2.7B 512 (1024 out of memory, on the H100)" (another GPU model than most's);
    sizes in a row with one answer joined ("medium to large 2048 (4096 out of memory)")."""
    by: dict[tuple[str, str], dict[int, str]] = {}
    gpu: dict[str, set[str]] = {}
    for r in results:
        s = r["settings"]
        by.setdefault((s["mode"], s["size"]), {})[int(s["context_length"])] = r["status"]
        gpu.setdefault(s["size"], set()).add(gpu_model(r.get("env", {}).get("gpu") or ""))
    models = [g for gs in gpu.values() for g in gs]
    common = max(set(models), key=models.count) if models else ""
    out: dict[str, list[list[str]]] = {"forward": [], "train_step": []}
    for (mode, size), statuses in sorted(by.items(), key=lambda kv: (kv[0][0], SIZE_ORDER.index(kv[0][1]))):
        ran = [c for c, st in sorted(statuses.items()) if st == "ok"]
        failed = [c for c, st in sorted(statuses.items()) if st != "ok" and (not ran or c > ran[-1])]
        notes = [f"{failed[0]} {'out of memory' if statuses[failed[0]] == 'oom' else statuses[failed[0]]}"] \
            if failed else []
        notes += [f"on the {g}" for g in sorted(gpu[size] - {common})]
        rest = f"{ran[-1] if ran else 'none'}{'' if failed or not ran else '+'}"
        rest += f" ({', '.join(notes)})" if notes else ""
        runs = out.setdefault(mode, [])
        if runs and runs[-1][2] == rest:  # sizes in a row with one answer: "small to xl 4096+"
            runs[-1][1] = size
        else:
            runs.append([size, size, rest])
    return {mode: [f"{a} {rest}" if a == b else f"{a} to {b} {rest}" for a, b, rest in runs]
            for mode, runs in out.items()}
