"""`snakemake --lint`, failing on any lint but the one this workflow cannot honour.

    python tools/snakemake_lint.py [snakemake options...]

Every rule gets "Specify a conda environment or container for each rule": no conda channel or container
registry is reachable from the machines this workflow runs on, so an environment file could not be
tested; the software is pinned by `constraints/` instead and every result records its own (`env`).
Anything else the linter says is an error. Snakemake 9's command line ignores `--lint json` (it always
prints text), so the text is parsed: "Lints for rule NAME (...):" or "Lints for snakefile PATH:" and
under it one "    * TITLE:" per lint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ALLOWED = "Specify a conda environment or container for each rule."
_FOR = re.compile(r"^Lints for (rule \S+|snakefile \S+?)(?: \(.*\))?:$")
_LINT = re.compile(r"^    \* (.*):$")


def lints(text: str) -> list[tuple[str, str]]:
    """(what, title) for every lint in `snakemake --lint` text output."""
    found, what = [], None
    for line in text.splitlines():
        if m := _FOR.match(line):
            what = m.group(1)
        elif (m := _LINT.match(line)) and what:
            found.append((what, m.group(1)))
    return found


def main(argv: list[str] | None = None) -> int:
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint", *(argv or [])], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    found = lints(text)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not found):
        print(text, file=sys.stderr)
        print(f"error: snakemake --lint failed (exit {proc.returncode})", file=sys.stderr)
        return 2
    other = [(what, title) for what, title in found if title != ALLOWED]
    allowed = len(found) - len(other)
    for what, title in other:
        print(f"{what}: {title}")
    print(f"snakemake --lint: {len(other)} lint(s) to fix; {allowed} rule(s) without a conda environment or "
          "container (the software is pinned by constraints/ instead)")
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
