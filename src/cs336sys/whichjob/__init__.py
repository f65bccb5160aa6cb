"""Which rule makes a file, with which point, and whether it is up to date; and a rule's files
(`python -m cs336sys.whichjob which PATH` / `rule RULE`: the usage is in cli).

Each module imports only those after it: `cli` (the command line), `workflow` (the workflow as Snakemake
parses it, and the two questions asked of it), `render` (the answers as text), `model` (a rule and its files).
"""

from cs336sys.whichjob.cli import main
from cs336sys.whichjob.model import Output, Rule, Unknown, WorkflowParseError, find_repo
from cs336sys.whichjob.render import render_rule, render_which
from cs336sys.whichjob.workflow import Workflow

__all__ = ["Output", "Rule", "Unknown", "Workflow", "WorkflowParseError", "find_repo", "main", "render_rule",
           "render_which"]
