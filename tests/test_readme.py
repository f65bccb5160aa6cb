"""The README's install block can be run top to bottom on a fresh CPU machine: the CPU build of torch
comes first (a plain install would pull the multi-GB CUDA build), then the one install, the main job and
the test command; CI installs and tests the way the block says."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def install_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Install and run"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_the_cpu_torch_line_comes_first_and_says_so():
    lines = install_block()
    commands = [line.split("#")[0].strip() for line in lines if not line.lstrip().startswith("#")]
    assert lines[0].lstrip().startswith("#") and "CPU machine only" in lines[0]
    assert commands[0].startswith("pip install torch") and "download.pytorch.org/whl/cpu" in commands[0]
    assert commands[1].startswith("pip install -e")
    assert commands[2] == "snakemake -c1 writeup/report.pdf" and commands[3] == "pytest"


def test_ci_installs_and_tests_as_the_readme_says():
    ci = (REPO / ".ci" / "run").read_text()
    torch_at, project_at = ci.index("pip install -q torch"), ci.index("pip install -q -e")
    assert torch_at < project_at  # torch first, as the README's block
    assert re.search(r"^pytest$", ci, re.M)
