"""What the README and docs/*.md name exists: every repository path they put in backticks, in a link or
in the README's layout block is a tracked file or folder (or one of the few that running makes, listed
below with why); every `cs336sys` module they name imports; every command in their code blocks and
inline code names options, targets, profiles, config values, extras, markers and test files that exist,
and each `python -m cs336sys...` command's options are in that command's `--help`. Seconds, no pipeline run.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import tomllib
import warnings
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Paths the docs name that no checkout holds until something runs or a reader makes them.
MADE_BY_RUNNING = (
    "smoke/",            # the smoke grid's results, logs and report (--config grid=smoke), git-ignored
    "next/",             # the overlay's sections and report (--config grid=next), git-ignored
    "logs/",             # each rule's log and Slurm's job logs, written as jobs run, git-ignored
    "artifacts/",        # raw per-point traces and snapshots, written by GPU runs, git-ignored
    ".snakemake/log/",   # Snakemake's log of each run
    ".venv/",            # the virtual environment a reader may make
    ".whl/",             # wheels a GPU host is handed with a bare copy of the tree
    "$OUT/",             # the output folder of a run on a GPU host
    "/tmp/",             # a scratch folder of the reader's choosing
    "rule_<rule>/",      # the tail of a Slurm log path under logs/slurm/
)


def _text(doc: Path) -> str:
    return doc.read_text()


def _code_blocks(text: str) -> list[str]:
    """Bodies of the fenced blocks without a language (shell commands, the layout); yaml, python and
    jinja blocks are examples, not commands."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if not lang]


def _inline_code(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


@cache
def tracked() -> frozenset[str]:
    """Every tracked file, and every folder holding one (with a trailing slash): what a fresh clone has."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True,
                           text=True).stdout.split("\0")
    out = set()
    for f in filter(None, files):
        out.add(f)
        parts = f.split("/")
        out.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return frozenset(out)


def _pattern(path: str) -> re.Pattern:
    """A documented path as a pattern: `<name>` is one path component, `...` any run of characters."""
    out = ""
    for piece in re.split(r"(<[^>]+>|\.\.\.)", path):
        out += "[^/]+" if piece.startswith("<") else ".*" if piece == "..." else re.escape(piece)
    return re.compile(out)


def exists(path: str) -> bool:
    path = path.removeprefix("./")
    if any(path.startswith(p) for p in MADE_BY_RUNNING):
        return True
    if "<" not in path and "..." not in path:
        return path in tracked() or path + "/" in tracked()
    pattern = _pattern(path)
    return any(pattern.fullmatch(p) for p in tracked())


PATH_LIKE = re.compile(r"^[\w.$/<>-][\w.$/<> -]*$")
FILE_SUFFIX = re.compile(r"\.(md|py|yaml|yml|txt|sh|smk|j2|json|pdf|toml|csv|png|log|tsv)$")


def _is_path(token: str) -> bool:
    """A backticked token that names a path: no spaces outside placeholders, and a slash or a file suffix."""
    bare = re.sub(r"<[^>]+>", "x", token)
    return (bool(PATH_LIKE.match(token)) and " " not in bare and not token.startswith(("-", "http"))
            and ("/" in bare or bool(FILE_SUFFIX.search(bare))) and not re.match(r"^[\w.]+\(", token))


def documented_paths() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = _text(doc)
        found += [(doc.name, t) for t in _inline_code(text) if _is_path(t)]
        found += [(doc.name, link) for link in re.findall(r"\]\(([^)#\s]+)\)", text)
                  if not link.startswith(("http", "#")) and "(" not in link]
    return found


def layout_paths() -> list[str]:
    """The README's layout block: a path in the left column per line; indented names sit in the folder
    named last at the left edge."""
    text = _text(REPO / "README.md")
    block = _code_blocks(text[text.index("## Layout"):])[0]
    paths, folder = [], ""
    for line in block.splitlines():
        m = re.match(r"^( {0,2})(\S.*?)(?: {2,}|$)", line)
        if not m:
            continue  # a description carried over from the line before
        indent, names = m.groups()
        for name in names.split(", "):
            if indent:
                paths.append(folder + name)
            else:
                paths.append(name)
                folder = name if name.endswith("/") else folder
    return paths


def test_every_path_the_docs_name_exists():
    missing = [f"{doc}: {p}" for doc, p in documented_paths() if not exists(p)]
    assert missing == []
    assert len(documented_paths()) > 40  # the docs are read, not skipped


def test_every_path_of_the_readme_layout_exists():
    paths = layout_paths()
    assert "src/cs336sys/registry.py" in paths and "workflow/rules/<part>.smk" in paths
    assert [p for p in paths if not exists(p)] == []


def test_the_path_check_can_fail():
    assert not exists("tests/test_report_lint.py") and not exists("src/cs336sys/<part>/nothing_here.py")
    assert exists("results/sections/<section>/context.json") and exists("smoke/writeup/report.pdf")


def _resolve(name: str) -> bool:
    """A dotted name: a module, or an attribute of one."""
    module, attrs = name, []
    while module:
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:  # a name inside a module, not a submodule
            spec = None
        if spec is not None:
            obj = importlib.import_module(module)
            for a in attrs:
                if not hasattr(obj, a):
                    return False
                obj = getattr(obj, a)
            return True
        module, _, last = module.rpartition(".")
        attrs.insert(0, last)
    return False


def test_every_cs336sys_name_the_docs_give_imports():
    names = {t.removesuffix("()") for doc in DOCS for t in _inline_code(_text(doc))
             if re.fullmatch(r"cs336sys(\.\w+)+(\(\))?", t)}
    assert len(names) > 5
    assert [n for n in sorted(names) if not _resolve(n)] == []
    assert not _resolve("cs336sys.writeup.no_such_module")


# --- commands ------------------------------------------------------------------------------------------

COMMAND_START = ("python -m ", "snakemake", "pytest", "pip install", "tools/", ".ci/")


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for every command line of a code block and every inline command; a line's
    comment is dropped, `&&` and `||` split it into commands."""
    found = []
    for doc in DOCS:
        text = _text(doc)
        lines = [line for block in _code_blocks(text) for line in block.splitlines()] + _inline_code(text)
        for line in lines:
            line = re.split(r"\s+#\s", line)[0].strip()
            for part in re.split(r"\s+(?:&&|\|\|)\s+", line):
                if part.startswith(COMMAND_START) and not part.split()[0].endswith("/"):  # not the layout's folders
                    found.append((doc.name, part))
    return found


@cache
def snakemake_help() -> str:
    return subprocess.run([sys.executable, "-m", "snakemake", "--help"], capture_output=True, text=True,
                          cwd=REPO).stdout


@cache
def config_schema() -> dict:
    return yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


SNAKEMAKE_VALUED = {"-c", "--cores", "-j", "--jobs", "--profile", "--quiet", "--forcerun", "--until", "--list-changes",
                    "--report"}  # --report: the file it writes


def snakemake_problems(cmd: str) -> list[str]:
    words, problems = shlex.split(cmd)[1:], []
    i = 0
    while i < len(words):
        w = words[i]
        if re.fullmatch(r"-[cj]\d+", w):
            w = w[:2]
        if w.startswith("-"):
            if not re.search(rf"(?<![\w-]){re.escape(w)}\b", snakemake_help()):
                problems.append(f"no option {w}")
            if w == "--profile":
                if f"{words[i + 1]}/config.yaml" not in tracked():
                    problems.append(f"no profile {words[i + 1]}")
            if w in ("--config", "--resources"):
                while i + 1 < len(words) and "=" in words[i + 1]:
                    key, value = words[i + 1].split("=", 1)
                    if w == "--config":
                        prop = config_schema()["properties"].get(key)
                        if prop is None or value not in prop.get("enum", [value]):
                            problems.append(f"--config {key}={value} is not in the config schema")
                    i += 1
            elif w in SNAKEMAKE_VALUED and w != words[i]:
                pass  # -c1: the value is in the word
            elif w in SNAKEMAKE_VALUED:
                i += 1
        elif w != "..." and not exists(w):  # "...": the rest of a command left out
            problems.append(f"target {w} is not a tracked file")
        i += 1
    return problems


@cache
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def pytest_problems(words: list[str]) -> list[str]:
    problems = []
    markers = {m.split(":")[0] for m in pyproject()["tool"]["pytest"]["ini_options"]["markers"]}
    for i, w in enumerate(words):
        if w == "-m" and words[i + 1] not in markers:
            problems.append(f"no marker {words[i + 1]}")
        elif w.startswith("tests/") and not exists(w.split("::")[0]):
            problems.append(f"no test file {w}")
    return problems


def pip_problems(words: list[str]) -> list[str]:
    problems = []
    extras = set(pyproject()["project"]["optional-dependencies"])
    for i, w in enumerate(words):
        if m := re.fullmatch(r"\.\[([\w,]+)\]", w):
            problems += [f"no extra {e}" for e in m.group(1).split(",") if e not in extras]
        if w == "-c" and not exists(words[i + 1]):
            problems.append(f"no constraints file {words[i + 1]}")
    return problems


def module_help(module: str, subcommands: list[str]) -> str:
    """`python -m module [subcommands] --help`, run in this process (one import of torch for them all)."""
    out, argv = io.StringIO(), sys.argv
    sys.argv = [module, *subcommands, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(SystemExit) as done, \
                warnings.catch_warnings():
            # runpy warns that the module was imported before (by another test): its code runs anew here
            warnings.filterwarnings("ignore", "'cs336sys", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = argv
    assert done.value.code in (0, None), out.getvalue()
    return out.getvalue()


def python_module_problems(words: list[str]) -> list[str]:
    module, args = words[2], words[3:]
    if module == "pytest":
        return pytest_problems(args)
    if not module.startswith("cs336sys"):
        return [] if importlib.util.find_spec(module) else [f"no module {module}"]
    if importlib.util.find_spec(module) is None:
        return [f"no module {module}"]
    options = [a.split("=")[0] for a in args if a.startswith("--")]
    subcommands = []
    for a in args:
        if a.startswith("-"):
            break
        subcommands.append(a)
    text = module_help(module, subcommands)
    return [f"{module} {' '.join(subcommands)}: no option {o}" for o in options if o not in text]


def command_problems(cmd: str) -> list[str]:
    words = shlex.split(cmd)
    if words[0] == "snakemake":
        return snakemake_problems(cmd)
    if words[0] == "pytest":
        return pytest_problems(words[1:])
    if words[:2] == ["pip", "install"]:
        return pip_problems(words[2:])
    if words[:2] == ["python", "-m"]:
        return python_module_problems(words)
    # a script of the repository, run by its path
    return [] if exists(words[0]) and os.access(REPO / words[0], os.X_OK) else [f"{words[0]} is not an executable file"]


def test_every_command_the_docs_give_names_what_exists():
    commands = documented_commands()
    kinds = {shlex.split(c)[0] for _, c in commands}
    assert {"snakemake", "pytest", "pip", "python", "tools/run_on_gpu_host.sh"} <= kinds
    problems = [f"{doc}: `{cmd}`: {p}" for doc, cmd in commands for p in command_problems(cmd)]
    assert problems == []


@pytest.mark.parametrize("cmd, problem", [
    ("snakemake --profile profiles/nowhere writeup/report.pdf", "no profile"),
    ("snakemake -n writeup/report.pdf --config grid=huge", "grid=huge"),
    ("snakemake -n --no-such-option", "no option"),
    ("snakemake -c1 writeup/nothing.pdf", "target"),
    ("python -m pytest -m nomarker", "no marker"),
    ("pytest tests/test_report_lint.py", "no test file"),
    ("pip install -e '.[gpu]'", "no extra"),
    ("python -m cs336sys.accounting --no-such-option 3", "no option"),
    ("python -m cs336sys.pins add --no-such-option", "no option"),
    ("tools/nothing.sh", "not an executable"),
])
def test_the_command_check_can_fail(cmd, problem):
    assert any(problem in p for p in command_problems(cmd))


def test_the_slurm_profile_without_its_plugin_fails_as_the_readme_says():
    """A profile cannot run code, so Snakemake's own argparse message is what a user without the `slurm`
    extra sees: the README and docs/cluster.md quote it and name the install line."""
    readme = _text(REPO / "README.md")
    quoted = re.search(r"`(error: argument --executor/-e: invalid choice: 'slurm'[^`]*)`", readme).group(1)
    assert "pip install -e '.[slurm]'" in readme[readme.index(quoted):][:300]
    assert quoted in _text(REPO / "docs" / "cluster.md")
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None:
        pytest.skip("snakemake-executor-plugin-slurm is installed here: the profile works")
    run = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "-n", "writeup/report.pdf"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and quoted in run.stderr
