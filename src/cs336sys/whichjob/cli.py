"""Which rule makes a file, with which point, and whether it is up to date; and a rule's files.

    python -m cs336sys.whichjob which results/fsdp_step/2.7B-proxy/ours-bf16-layer.json
    python -m cs336sys.whichjob which results/autocast_dtypes       # a folder: every rule with files in it
    python -m cs336sys.whichjob rule fsdp_step_2_7B_proxy       # a rule's files, each with its status
    python -m cs336sys.whichjob which PATH --config grid=next   # the rules of another grid (overlay, smoke)
    python -m cs336sys.whichjob rule matmul_peak --json         # the same, as JSON

Rules are generated (workflow/rules/rules.smk makes one per registered job), so no `rule X:` can be
grepped. This asks Snakemake: the workflow is parsed through Snakemake's API as `snakemake -n` parses
it (every experiment's code hash included, which takes a few seconds), so the rules, their files and
parameters are those a run of that grid would use. Whether a file is up to date is Snakemake's verdict
on its job, from the DAG of the files asked about (what `snakemake -n FILE` would run, and why). On
top of that it says the experiment and the point (the JSON settings the rule passes for that result
file), the code hash the file's provenance record holds against the one the rule passes now, the pin
in effect (cs336sys.pins) and, for an experiment whose code changed, which statements changed since
its results' commit or its pin (cs336sys.why). Nothing is run, and no file of the checkout is
written (Snakemake may make its own empty working folders under `.snakemake/`, as `snakemake -n` does).

Exit status: 0; 2 for a path no rule makes or a rule the workflow does not have (close names are
suggested); 1 when the workflow cannot be parsed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cs336sys.whichjob.model import Unknown, WorkflowParseError
from cs336sys.whichjob.render import render_rule, render_which
from cs336sys.whichjob.workflow import Workflow


def _config(entries: list[str]) -> dict[str, Any]:
    from snakemake.cli import parse_config

    return parse_config(entries)


def main(argv: list[str] | None = None, prog: str = "python -m cs336sys.whichjob") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("which", help="the rule, point and status of each file (or the rules of a folder)")
    w.add_argument("paths", nargs="*", help="files or folders, relative to the checkout or absolute")
    r = sub.add_parser("rule", help="a rule's files, each with its point and status")
    r.add_argument("name", help="a rule name, e.g. fsdp_step_2_7B_proxy")
    for s in (w, r):
        s.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                       help="the workflow's config, as snakemake takes it (grid=next, grid=smoke, pins=off)")
        s.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    # words after --config without '=' are paths (or the rule), so `which --config grid=next PATH` works too
    loose = [c for c in args.config if "=" not in c]
    config = [c for c in args.config if "=" in c]
    if args.command == "which":
        args.paths += loose
        if not args.paths:
            p.error("which: name at least one path")
    elif loose:
        p.error(f"unrecognized arguments: {' '.join(loose)}")
    paths = [os.path.abspath(x) for x in args.paths] if args.command == "which" else []
    try:
        with Workflow(config=_config(config)) as wf:
            if args.command == "which":
                entries = wf.which(paths)
                for e, asked in zip(entries, args.paths, strict=True):
                    if "error" in e:
                        e["path"] = asked
                text = json.dumps(entries, indent=1) if args.json else render_which(entries)
                if text:
                    print(text)
                errors = [e["error"] for e in entries if "error" in e]
                for message in errors:
                    print(f"error: {message}", file=sys.stderr)
                return 2 if errors else 0
            d = wf.rule_outputs(args.name)
            print(json.dumps(d, indent=1) if args.json else render_rule(d))
            return 0
    except Unknown as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    except WorkflowParseError as e:
        print(f"error: the workflow could not be parsed:\n{e}", file=sys.stderr)
        return 1
