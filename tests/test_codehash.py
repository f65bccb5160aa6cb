import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
from functools import cache
from pathlib import Path

import pytest

from cs336sys import codehash, registry
from cs336sys.codehash import statements

RUNNER = "cs336sys.run"


_BY_CONTENT: dict[str, dict[str, str]] = {}  # sources' content -> every experiment's hash


def experiment_hashes(reuse: bool = True) -> dict[str, str]:
    """Every registered experiment's code hash, as the workflow computes it. A hash is a function of the
    sources' content (the workflow's disk cache rests on that too), so a content seen before reuses its
    hashes: every test starts from the same pristine copy, whose hashes are computed once. `reuse=False`
    computes afresh (for the test that only touches files)."""
    key = hashlib.sha256(b"".join(p.relative_to(codehash.SRC).as_posix().encode() + b"\0" + p.read_bytes() + b"\0"
                                  for p in sorted(codehash.SRC.rglob("*.py")))).hexdigest()
    codehash.clear_cache()
    if not reuse or key not in _BY_CONTENT:
        _BY_CONTENT[key] = {name: codehash.code_hash(e.function, RUNNER) for name, e in registry.EXPERIMENTS.items()}
    return dict(_BY_CONTENT[key])


_PARSED: dict[tuple[str, bool, str], codehash.Module] = {}
_parse = statements._parse


def _parse_once(path: Path, module: str, text: str) -> codehash.Module:
    """codehash's parse of a module's text, once per text: parsing is most of a hash's time, a test edits one
    file of the package, and a parsed Module is only read once made (the hashes are as computed afresh)."""
    key = (module, path.name == "__init__.py", text)
    if key not in _PARSED:
        _PARSED[key] = _parse(path, module, text)
    return _PARSED[key]


@pytest.fixture
def src_copy(tmp_path, monkeypatch):
    """A private copy of the package sources for hashing, so tests can edit them."""
    shutil.copytree(codehash.SRC / "cs336sys", tmp_path / "cs336sys")
    monkeypatch.setattr(codehash, "SRC", tmp_path)
    monkeypatch.setattr(codehash, "_parse", _parse_once)
    codehash.clear_cache()
    yield tmp_path / "cs336sys"
    codehash.clear_cache()


def edit(path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert text.count(old) >= count, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, count))


def changed_after(src, path: str, old: str, new: str) -> set[str]:
    before = experiment_hashes()
    edit(src / path, old, new)
    after = experiment_hashes()
    return {name for name in before if before[name] != after[name]}


# --- what never stales a result ---------------------------------------------------------------------


def _relayout(source: str) -> str:
    """The same code with every docstring rewritten, a comment on every statement line, blank lines
    between statements, and single-quoted strings double-quoted (and the other way)."""
    out, prev_end = [], (1, 0)
    lines = source.splitlines(keepends=True)
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for tok in toks:
        (sl, sc), (el, ec) = tok.start, tok.end
        # the text between tokens as it was
        if (sl, sc) > prev_end:
            gap = "".join(lines[prev_end[0] - 1:sl])[prev_end[1]:len("".join(lines[prev_end[0] - 1:sl - 1])) + sc]
            out.append(gap)
        text = tok.string
        if tok.type == tokenize.STRING and text[:3] in ('"""', "'''"):
            text = text[:3] + "Rewritten documentation, with 'quotes' and {braces}." + text[-3:]
        elif tok.type == tokenize.STRING and re.fullmatch(r"'[^'\"\\]*'", text):
            text = '"' + text[1:-1] + '"'
        elif tok.type == tokenize.STRING and re.fullmatch(r'"[^\'"\\]*"', text):
            text = "'" + text[1:-1] + "'"
        elif tok.type == tokenize.NEWLINE:
            text = "  # a comment\n\n" if text else text
        out.append(text)
        prev_end = (el, ec)
    return "".join(out)


def test_docstrings_comments_layout_and_quotes_stale_nothing(src_copy):
    before = experiment_hashes()
    sections_before = {s.module: codehash.code_hash(s.module) for s in registry.SECTIONS.values()}
    for path in src_copy.rglob("*.py"):
        relaid = _relayout(path.read_text())
        compile(relaid, str(path), "exec")  # still Python
        path.write_text(relaid)
    assert "Rewritten documentation" in (src_copy / "model.py").read_text()
    assert experiment_hashes() == before
    assert {s.module: codehash.code_hash(s.module) for s in registry.SECTIONS.values()} == sections_before


def test_a_field_docstring_stales_nothing_but_a_default_string_does(src_copy):
    # a bare string under a field (an attribute docstring) is dropped like any docstring; the field's
    # default, a string that is used, still counts
    path = "distributed/experiments.py"
    field = '    iters: int = 20\n'
    doc = re.search(r'    iters: int = 20\n(    """.*"""\n)', (src_copy / path).read_text())
    assert doc, "AllReduceSettings.iters has a docstring to rewrite"
    assert changed_after(src_copy, path, field + doc.group(1), field + '    """Timed calls."""\n') == set()
    assert changed_after(src_copy, path, field + '    """Timed calls."""\n', field) == set()
    in_class = r'class AllReduceSettings:\n(?:    .*\n)*?    device: str = "cuda"\n'
    device = re.search(in_class, (src_copy / path).read_text())
    assert device
    # the module holds the all-reduce and DDP experiments: an edit of it re-runs all three
    assert changed_after(src_copy, path, device.group(0), device.group(0).replace('"cuda"', '"cpu"')) == {
        "allreduce", "ddp_step", "ddp_trace"}


def test_a_call_rewrapped_over_lines_with_a_trailing_comma_is_the_same_code(src_copy):
    path = src_copy / "precision.py"
    text = path.read_text()
    call = re.search(r"torch\.zeros\(([^()\n]*)\)", text) or re.search(r"(\w+)\(([^()\n]+), ([^()\n]+)\)", text)
    assert call, "precision.py has a one-line call to rewrap"
    before = experiment_hashes()
    inner = call.group(0)[call.group(0).index("(") + 1:-1]
    args = [a.strip() for a in inner.split(",")]
    rewrapped = call.group(0)[:call.group(0).index("(") + 1] + "\n" + "".join(f"    {a},\n" for a in args) + ")"
    if len(args) == 1:  # a one-argument call keeps no trailing comma: `f(a,)` is still `f(a)`, but not for tuples
        rewrapped = rewrapped.replace(",\n)", "\n)")
    path.write_text(text.replace(call.group(0), rewrapped, 1))
    assert experiment_hashes() == before


# --- what always stales exactly the dependent jobs --------------------------------------------------


def importers(module: str) -> set[str]:
    """The experiments whose code hash covers `module` (it is in their import closure)."""
    return {name for name, e in registry.EXPERIMENTS.items() if module in codehash.closure(e.function, RUNNER)}


def test_any_code_edit_of_a_module_stales_exactly_the_experiments_that_import_it(src_copy):
    # the rule is the module: a helper nobody calls, a constant nothing reads, an import of the standard
    # library nobody uses all count for every experiment that imports the module, and for no other
    flash = importers("cs336sys.attention.flash_triton_forward")
    assert FLASH <= flash and not flash & {"benchmarking", "matmul_peak", "pytorch_attention", "allreduce"}
    with open(src_copy / "attention" / "flash_triton_forward.py", "a") as f:
        f.write("\n\ndef unused_helper(x):\n    return x * 2\n")
    unused_constant = changed_after(src_copy, "model.py", "\nclass ", "\nUNUSED_CONSTANT = 3\n\n\nclass ")
    assert unused_constant == importers("cs336sys.model")
    before = experiment_hashes()
    edit(src_copy / "attention" / "flash_triton_forward.py", "def unused_helper(x):", "def unused_helper(y):")
    edit(src_copy / "attention" / "flash_triton_forward.py", "return x * 2", "return y * 2")
    assert {n for n, h in experiment_hashes().items() if h != before[n]} == flash
    assert changed_after(src_copy, "results.py", "import json\n", "import fractions\nimport json\n") == set(
        registry.EXPERIMENTS)  # every experiment writes its result through it

FLASH = {"flash_benchmarking", "flash_leaderboard"}


def test_a_triton_kernel_edit_stales_the_flash_experiments_and_no_other(src_copy):
    changed = changed_after(src_copy, "attention/flash_triton_forward.py", "-1.0e6)", "-1.0e7)")
    assert FLASH <= changed
    assert not changed & {"benchmarking", "matmul_peak", "allreduce", "mixed_precision_accumulation",
                          "pytorch_attention", "memory_snapshot"}


def test_a_gluon_kernel_edit_stales_the_experiments_that_launch_it_and_no_other(src_copy):
    # a @gluon.jit helper of the warp-specialised forward: the Gluon attention benchmarks, the leaderboard
    # step (its attention option 'gluon') and its one-GPU proxy; not the Triton grid nor anything else
    changed = changed_after(src_copy, "attention/flash_gluon_forward_ws.py", "    if TURN >= 0:", "    if TURN > 0:")
    assert changed == {"flash_leaderboard_gluon", "flash_leaderboard_rounds", "leaderboard_step", "leaderboard_proxy"}


def test_a_function_body_edit_stales_exactly_its_callers(src_copy):
    # the matmul ceiling's own measurement: the experiments that time it (the optimised step, in one pass and in
    # rounds, and the benchmarking points time it too; warmup shares the benchmarking module)
    assert changed_after(src_copy, "peak.py", "def matmul_tflops(", "def matmul_tflops(*_unused, ") == {
        "matmul_peak", "optimized_step", "optimized_step_rounds", "benchmarking", "warmup"}


def test_a_default_argument_edit_stales_its_users(src_copy):
    text = (src_copy / "precision.py").read_text()
    default = re.search(r'def accumulate\([^)]*device: str = "cpu"', text)
    assert default
    # `accumulate` is what the accumulation experiment runs; the autocast one, in the same module, re-runs too
    assert changed_after(src_copy, "precision.py", 'device: str = "cpu"', 'device: str = "meta"') == {
        "mixed_precision_accumulation", "autocast_dtypes"}


def test_a_constant_edit_stales_the_experiments_that_read_it(src_copy):
    changed = changed_after(src_copy, "peak.py", "PEAK_DTYPES = (", "PEAK_DTYPES = ('fp16', ")
    assert changed == {"matmul_peak", "optimized_step", "optimized_step_rounds", "benchmarking",
                       "warmup"} == importers("cs336sys.peak")


def test_a_decorator_edit_stales_its_users(src_copy):
    changed = changed_after(src_copy, "attention/flash_triton_forward.py", "@triton.jit\n",
                            "@triton.jit(do_not_specialize=[])\n")
    assert FLASH <= changed and "matmul_peak" not in changed


def test_an_import_edit_stales_its_users(src_copy):
    # the runner binds another write_result: every experiment runs through it
    edit(src_copy / "results.py", "def write_result(", "def write_result_v1(")
    shim = "def write_result(*a, **k):\n    return write_result_v1(*a, **k)\n\n\n"
    edit(src_copy / "results.py", "def write_json_atomic(", shim + "def write_json_atomic(")
    before = experiment_hashes()
    assert before  # the runner imports it by name: the statement that binds it changed
    codehash.clear_cache()
    changed = changed_after(src_copy, "run.py", "from cs336sys.results import write_json_atomic, write_result",
                            "from cs336sys.results import write_json_atomic, write_result_v1 as write_result")
    assert changed == set(registry.EXPERIMENTS)


def test_a_function_imported_inside_a_function_counts_for_its_callers(src_copy):
    # the 8B experiments' builder imports the step builder inside its body (to keep torch out of the
    # module's import): an edit of the step builder stales them, and only the experiments that build it
    step = (src_copy / "leaderboard" / "step.py").read_text()
    assert "def build_leaderboard_step(" in step
    builder = (src_copy / "leaderboard" / "experiments.py").read_text()
    assert re.search(r"\n    +from cs336sys\.leaderboard\.step import [^\n]*build_leaderboard_step", builder)
    changed = changed_after(src_copy, "leaderboard/step.py", "def build_leaderboard_step(spec: LeaderboardSpec, ",
                            "def build_leaderboard_step(spec: LeaderboardSpec, *_unused, ")
    assert changed == {"leaderboard_step", "leaderboard_proxy"}


def test_a_new_import_of_another_package_stales_the_importers(src_copy):
    # importing another package runs its code: it counts, even if nothing uses the name
    with open(src_copy / "precision.py", "a") as f:
        f.write("\nimport yaml  # noqa\n")
    codehash.clear_cache()
    before = {n: h for n, h in experiment_hashes().items()}
    edit(src_copy / "precision.py", "\nimport yaml  # noqa\n", "")
    after = experiment_hashes()
    assert {n for n in before if before[n] != after[n]} == {"mixed_precision_accumulation", "autocast_dtypes"}


def test_a_statement_that_acts_at_import_counts_for_every_importer(src_copy):
    # a call at module level (it may set global state) in a module the benchmark imports
    changed = changed_after(src_copy, "model.py", "\nclass ", "\ntorch.manual_seed(0)\n\n\nclass ")
    assert {"benchmarking", "warmup"} <= changed and "matmul_peak" not in changed


# --- the rule's own properties ------------------------------------------------------------------


def test_nothing_is_kept_between_processes(src_copy):
    # hashes live in the process that computed them: an edit is seen by the next process (or after
    # clear_cache) whatever was hashed before, and hashing writes no file anywhere
    before = codehash.code_hash("cs336sys.peak:run_point", RUNNER)
    edit(src_copy / "peak.py", "PEAK_DTYPES = (", "PEAK_DTYPES = ('fp16', ")
    assert codehash.code_hash("cs336sys.peak:run_point", RUNNER) == before  # this process's own, until cleared
    codehash.clear_cache()
    assert codehash.code_hash("cs336sys.peak:run_point", RUNNER) != before
    assert sorted(p.name for p in src_copy.parent.iterdir()) == ["cs336sys"]


def test_closure_follows_what_runs():
    bench = set(codehash.closure("cs336sys.bench:run_point", RUNNER))
    assert {"cs336sys.bench", "cs336sys.model", "cs336sys.timing", "cs336sys.run"} <= bench
    assert "cs336sys.precision" not in bench
    # the command line under the main guard is not what a point runs
    assert "cs336sys.bench.cli" not in bench and "cs336sys.accounting.plan" not in bench
    assert "cs336sys.model" not in codehash.closure("cs336sys.precision:run_accumulation_point")


def test_hash_changes_with_content_not_with_file_times(src_copy):
    before = experiment_hashes()
    for p in src_copy.rglob("*.py"):
        p.touch()
    assert experiment_hashes(reuse=False) == before


def test_unknown_module_or_function_is_an_error():
    with pytest.raises(ValueError, match="no source for module"):
        codehash.code_hash("cs336sys.does_not_exist")
    with pytest.raises(ValueError, match="defines no 'nope'"):
        codehash.code_hash("cs336sys.bench:nope")


VERSIONS = ("3.11", "3.12", "3.13")  # CI runs 3.11, the GPU hosts 3.12


def other_pythons() -> list[str]:
    """An interpreter of each version in VERSIONS other than this one that is installed here (pyenv or PATH)."""
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = []
    for v in VERSIONS:
        if v != this:
            paths = sorted(Path.home().glob(f".pyenv/versions/{v}*/bin/python{v}")) or [shutil.which(f"python{v}")]
            found += [str(paths[-1])] if paths[-1] else []
    return found


# Every hash computed from scratch: a Tree of the sources (never the disk cache), the cache turned off as well.
_HASH_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from cs336sys import codehash
tree = codehash.Tree(sys.argv[1])
print(json.dumps({" + ".join(e): tree.code_hash(*e) for e in json.loads(sys.argv[2])}))
"""


def every_entry(src: Path = codehash.SRC) -> list[tuple[str, ...]]:
    """Each experiment as the workflow hashes it, and each module of the package on its own."""
    modules = [".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
               for p in sorted((src / "cs336sys").rglob("*.py"))]
    return [(e.function, RUNNER) for e in registry.EXPERIMENTS.values()] + [(m,) for m in modules]


def hashes_under(python: str, src: Path, entries: list[tuple[str, ...]]) -> dict[str, str]:
    """The hashes `python` computes for `entries` from the sources under `src`, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run([python, "-c", _HASH_SCRIPT, str(src), json.dumps(entries)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def hashes_here(src: Path, entries: list[tuple[str, ...]]) -> dict[str, str]:
    tree = codehash.Tree(src)
    return {" + ".join(e): tree.code_hash(*e) for e in entries}


@cache
def _every_hash_here() -> dict[str, str]:  # once for every other Python (the sources are not edited)
    return hashes_here(codehash.SRC, every_entry())


@pytest.mark.parametrize("python", other_pythons() or [None])
def test_same_hashes_under_another_python(python):
    """The same code hashes the same under every Python we run: every experiment and every module, each
    computed from scratch in both processes."""
    if python is None:
        pytest.skip(f"no Python of another version ({', '.join(VERSIONS)}) installed here to compare with")
    assert len(every_entry()) > 150
    assert hashes_under(python, codehash.SRC, every_entry()) == _every_hash_here()


def test_the_python_comparison_fails_when_a_hash_differs(src_copy):
    """The comparison reads no cache: each process computes every hash, so an edit that changes one, seen by
    one side only, makes the two differ."""
    pythons = other_pythons()
    if not pythons:
        pytest.skip(f"no Python of another version ({', '.join(VERSIONS)}) installed here to compare with")
    entries = [("cs336sys.peak:run_point", RUNNER), ("cs336sys.precision:run_accumulation_point", RUNNER)]
    src = src_copy.parent
    real = hashes_here(src, entries)
    assert hashes_under(pythons[0], src, entries) == real
    edit(src_copy / "peak.py", "PEAK_DTYPES = (", "PEAK_DTYPES = ('fp16', ")
    assert hashes_under(pythons[0], src, entries) != real


def test_why_names_the_changed_statement(src_copy):
    before = codehash.manifest("cs336sys.peak:run_point", RUNNER)
    edit(src_copy / "peak.py", "PEAK_DTYPES = (", "PEAK_DTYPES = ('fp16', ")
    codehash.clear_cache()
    lines = codehash.changes(before, codehash.manifest("cs336sys.peak:run_point", RUNNER))
    assert lines == ["cs336sys.peak: changed: PEAK_DTYPES = …"]


@pytest.mark.slow(seconds=35)
def test_committed_records_hold_the_hash_of_the_code_their_results_name():
    """Each committed experiment result is up to date by its code or held by a pin: a record that is not
    pinned holds the current rule's hash of the sources at the commit its result names (`env.git_commit`),
    which is today's; a pinned one holds the hash its pin names for it."""
    from cs336sys import pins, provenance

    if provenance.git("rev-parse", "--is-shallow-repository", cwd=codehash.SRC.parent) != "false":
        pytest.skip("needs the project's git history (a full clone) to rebuild old sources")
    checked, by_commit = 0, {}
    pinned = {rule: p for p in pins.load(codehash.SRC.parent / "workflow" / "pins.yaml") for rule in p.rules}
    for output, rec in provenance.records(codehash.SRC.parent / ".snakemake" / "metadata"):
        function = provenance.function_param(rec)
        commit = provenance.results_commit(str(codehash.SRC.parent / output))
        if not function or not commit:
            continue
        if rec["rule"] in pinned:
            assert provenance.code_param(rec) == pinned[rec["rule"]].rules[rec["rule"]], output
        else:
            src = provenance.sources_at(commit, repo=codehash.SRC.parent)
            assert src is not None, f"{output}: its commit {commit} is not in the history"
            tree = by_commit.setdefault(commit, codehash.Tree(src))
            assert provenance.code_param(rec) == tree.code_hash(function, RUNNER) == codehash.code_hash(
                function, RUNNER), f"{output}: stale and not pinned"
        checked += 1
    assert checked > 500


def test_definitions_reordered_within_a_file_stale_nothing(src_copy):
    path = src_copy / "peak.py"
    text = path.read_text()
    head, _, rest = text.partition("\ndef matmul_tflops(")
    body, _, tail = rest.partition("\ndef run_point(")
    before = experiment_hashes()
    path.write_text(head + "\ndef run_point(" + tail.rstrip("\n") + "\n\n\ndef matmul_tflops(" + body)
    compile(path.read_text(), str(path), "exec")
    assert experiment_hashes() == before
