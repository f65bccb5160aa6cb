"""Helpers shared by the tests (error norms, random attention inputs, float64 references), the GPU marker's
check, and the rule that splits the tests into the fast suite (`pytest`) and the long checks (`pytest -m long`)."""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path

import pytest
import torch

from cs336sys.numerics import rel_err  # noqa: F401  (re-exported for the tests)


def random_qkv(lead: tuple[int, ...], seq_q: int, seq_k: int, d: int, dtype=torch.float32, device="cpu"):
    """Fresh random q (lead, seq_q, d) and k, v (lead, seq_k, d) that require gradients."""
    make = lambda n: torch.randn(*lead, n, d, dtype=dtype, device=device, requires_grad=True)
    return make(seq_q), make(seq_k), make(seq_k)


def reference_attention(q, k, v, grad_out, is_causal):
    """O, L, dQ, dK, dV of naive attention in float64."""
    from cs336sys.attention.naive import attention_logsumexp, naive_attention

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = naive_attention(q64, k64, v64, is_causal)
    out.backward(grad_out.double())
    lse = attention_logsumexp(q64.detach(), k64.detach(), is_causal)
    return out.detach(), lse, q64.grad, k64.grad, v64.grad


@pytest.fixture
def fresh_seed():
    """A new seed per test run, printed so a failure can be replayed (inputs are never fixed)."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    torch.manual_seed(seed)
    print(f"seed {seed}")
    return seed


def run_experiment(fn, device: str = "cpu", *, artifact_dir=None, rendered_dir=None, **point):
    """Call an experiment function as the job runner does: the point parsed into its settings
    dataclass (so bad keys fail the same way), on this process's device; `artifact_dir` and
    `rendered_dir` become the Run's per-point folders (None: the experiment gets none)."""
    from cs336sys.jobs import Run, parse_settings, settings_type

    settings = parse_settings(settings_type(fn), {"device": device, **point})
    return fn(settings, Run(device="cuda:0" if device == "cuda" else device, artifact_dir=artifact_dir,
                            rendered_dir=rendered_dir))


def spawn_checks(worker, world: int, timeout_s: float = 120, pg_timeout_s: float = 30):
    """Run `worker(info, seed)` on `world` gloo ranks with a fresh seed (printed, with the time taken,
    so a failure can be replayed); returns (world, every rank's result)."""
    import time

    from cs336sys.distributed.spawn import spawn

    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"seed {seed}")
    start = time.monotonic()
    per_rank = spawn(worker, world, seed, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s)
    print(f"world {world}: {time.monotonic() - start:.1f} s")
    return world, per_rank


def rerun_under_the_interpreter(test_file: str, deselect: str, timeout_s: float = 900) -> None:
    """Run `test_file`'s tests again in a subprocess with TRITON_INTERPRET=1, minus those `-k` `deselect`
    names; fail with its output unless every one it selects ran and passed.

    Triton chooses between its interpreter and its compiler when it is first imported, so one process
    cannot run a kernel both ways: the kernel tests of a file run in this subprocess (on CPU tensors),
    and are skipped in the parent with a reason that names the test calling this.
    """
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-x", "-k", deselect]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]


GPU_SKIP_REASON = "needs a CUDA GPU"


def _skip_reason(report: pytest.TestReport) -> str:
    """The reason text of a skipped report (its longrepr is (path, line, "Skipped: reason"))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Fail a test that skips for want of a GPU but lacks the `gpu` marker: `pytest -m gpu` on the GPU
    host must select every such test, so the set cannot drift as tests are added."""
    report = yield
    if report.skipped and GPU_SKIP_REASON in _skip_reason(report) and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skips ({_skip_reason(report)}) but has no @pytest.mark.gpu: "
                           f"mark it (or its module's pytestmark) so `pytest -m gpu` runs it on a GPU host")
    return report


def expected_seconds(item: pytest.Item) -> float:
    """How long a `slow(seconds=N)` test takes on one core of the 2-core CI host (0 for the rest)."""
    mark = item.get_closest_marker("slow")
    return mark.kwargs.get("seconds", 60) if mark else 0


# ---- the two suites -----------------------------------------------------------------------------------------
# `pytest -n 2` (the README's test command) runs the fast suite; `pytest -m long -n 2` runs the long checks:
# the tests that need the pipeline run end to end or a Slurm cluster. The rule, not each test file, decides:
# a test is long exactly when it asks for one of these fixtures (directly or through another fixture), so a
# new test that makes the smoke grid lands in the long checks by asking for the grid. tests/test_suites.py
# checks the partition against a fresh collection.
LONG_FIXTURES = {
    "smoke_grid": "the whole smoke grid made end to end in a copy of the pipeline (tests/test_workflow.py)",
    "smoke_jobs": "a copy of the pipeline whose smoke-grid jobs the test runs for real (tests/test_workflow.py)",
    "slurm_cluster": "a Slurm node that answers (.ci/slurm-smoke.sh brings one up; tests/test_slurm_profile.py)",
    "rerun_copy": "a private copy of the pipeline where the test checks what Snakemake re-runs: the re-run contract",
}
LONG_COMMAND = "pytest -m long -n 2"
SUITES_ENV = "CS336SYS_LIST_SUITES"  # a path: collection writes every test's suite there (tests/test_suites.py)
SUITES = pytest.StashKey[tuple[dict, list]]()  # this session's: every test's suite, and the tests it runs
FAST_TEST_BUDGET_S = 60.0  # a fast test slower than this is named in the summary: make it cheaper, or long


@pytest.fixture
def rerun_copy(tmp_path) -> Path:
    """A fresh copy of the pipeline (as tests/test_workflow.py makes it) where the test checks what Snakemake
    re-runs: a long check. A module may define its own (a git clone, say) under the same name."""
    from test_workflow import copy_pipeline

    return copy_pipeline(tmp_path / "clone")


def is_long(item: pytest.Item) -> bool:
    """The rule: a test is long when it needs one of LONG_FIXTURES (no test is marked `long` by hand)."""
    return bool(LONG_FIXTURES.keys() & set(getattr(item, "fixturenames", ())))


def _named(config: pytest.Config) -> list[tuple[Path, str]]:
    """(file, test) of each test the command line names (`file::test`): those run whichever suite they are in."""
    named = []
    for arg in map(str, config.args):
        if "::" in arg:
            path, test = arg.split("::", 1)
            named.append((Path(config.invocation_params.dir, path).resolve(), test))
    return named


def _is_named(item: pytest.Item, named: list[tuple[Path, str]]) -> bool:
    test = item.nodeid.split("::", 1)[-1]
    return any(item.path.resolve() == path and (test == name or test.startswith((name + "[", name + "::")))
               for path, name in named)


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m filter, which reads the `long` marker added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the long checks `long`; without -m leave them out but those named (`file::test`), so that the
    plain command is the fast suite. Then the long tests first, the longest first (the rest keep their order):
    `pytest -n 2` hands tests out two at a time (`--maxschedchunk=2` in pyproject), so each worker starts a
    long one at once and the short ones fill in after."""
    for item in items:
        if is_long(item):
            item.add_marker("long")
    every = {i.nodeid: {"suite": "long" if is_long(i) else "fast", "marked": i.get_closest_marker("long") is not None,
                        "fixtures": sorted(i.fixturenames)} for i in items}
    if path := os.environ.get(SUITES_ENV):
        Path(path).write_text(json.dumps(every))
    if not config.option.markexpr:
        named = _named(config)
        long = [i for i in items if is_long(i) and not _is_named(i, named)]
        if long:
            config.hook.pytest_deselected(items=long)
            left_out = set(map(id, long))
            items[:] = [i for i in items if id(i) not in left_out]
    config.stash[SUITES] = (every, [i.nodeid for i in items])  # tests/test_suites.py reads the plain command's
    items.sort(key=expected_seconds, reverse=True)  # stable, so the same order in every worker


_slow_fast_tests: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note a fast test over the budget (with `-n 2` the controller sees every worker's reports)."""
    if report.when == "call" and "long" not in report.keywords and report.duration > FAST_TEST_BUDGET_S:
        _slow_fast_tests.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say where the long checks are when they were left out, and name fast tests over the budget."""
    if not config.option.markexpr and not config.option.collectonly:
        terminalreporter.write_line(f"the long checks (smoke grid end to end, re-run contract, Ctrl-C and locking, "
                                    f"Slurm dispatch) are left out of this command: {LONG_COMMAND}")
    for nodeid, seconds in sorted(_slow_fast_tests, key=lambda t: -t[1]):
        terminalreporter.write_line(f"fast suite over its {FAST_TEST_BUDGET_S:.0f} s budget per test: {nodeid} "
                                    f"took {seconds:.0f} s (make it cheaper, or give it a long fixture)")
