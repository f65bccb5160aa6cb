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


def commands() -> list[str]:
    return [line.split(" # ")[0].strip() for line in install_block() if not line.lstrip().startswith("#")]


def test_the_cpu_torch_line_comes_first_and_says_so():
    lines, cmds = install_block(), commands()
    assert lines[0].lstrip().startswith("#") and "CPU machine only" in lines[0]
    cpu_index, fallback = cmds[0].split(" || ")
    assert cpu_index.startswith("pip install torch==")
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu_index
    # an index out of reach costs seconds, not pip's five retries of every package
    assert "--retries 0" in cpu_index and re.search(r"--timeout \d\b", cpu_index)
    assert fallback == cpu_index.split(" --")[0]  # the same torch, from the default index
    assert cmds[1].startswith("pip install -e")
    assert cmds[2] == "snakemake -c1 writeup/report.pdf" and cmds[3] == "pytest -n 2"


def test_ci_installs_and_tests_as_the_readme_says():
    ci = (REPO / ".ci" / "run").read_text().replace("\\\n", "")
    ci = re.sub(r" +", " ", ci)
    readme_torch = commands()[0].replace("pip install", "python -m pip install -q")
    assert readme_torch in ci
    torch_at, project_at = ci.index(readme_torch), ci.index("pip install -q -e")
    assert torch_at < project_at  # torch first, as the README's block
    # the README's test command (the fast suite), then the long checks that the README names after it, with the
    # CI cluster up (.ci/slurm-smoke.sh runs the command it is given); each timed, the slowest tests listed
    fast = commands()[3]
    long = re.search(r"`(pytest -m long[^`]*)` runs the long checks", (REPO / "README.md").read_text()).group(1)
    assert re.search(rf'^timed "fast suite" python -m {re.escape(fast)} --durations=10$', ci, re.M)
    assert re.search(rf'^timed "long checks" bash \.ci/slurm-smoke\.sh python -m {re.escape(long)} --durations=10$',
                     ci, re.M)
