"""constraints/gpu-host.txt pins what the committed GPU results were made with: its torch and Triton
versions are exactly those every GPU result's `env` records, so the file cannot drift from them."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def pinned() -> dict[str, str]:
    lines = (REPO / "constraints" / "gpu-host.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def gpu_envs() -> list[dict]:
    envs = []
    for p in (REPO / "results").rglob("*.json"):
        if "sections" in p.parts:
            continue
        data = json.loads(p.read_text())
        if isinstance(data, dict) and isinstance(data.get("env"), dict) and data["env"].get("gpu"):
            envs.append(data["env"])
    return envs


def test_the_gpu_host_constraints_are_what_the_results_record():
    envs = gpu_envs()
    assert len(envs) > 100  # the committed GPU results
    versions = pinned()
    assert {e["torch"].split("+")[0] for e in envs} == {versions["torch"]}
    assert {e["triton"] for e in envs} == {versions["triton"]}
    assert {e["python"].rsplit(".", 1)[0] for e in envs} == {"3.12"}  # as the file's comment says
