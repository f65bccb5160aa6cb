import shutil

import pytest

from cs336sys import codehash


@pytest.fixture
def src_copy(tmp_path, monkeypatch):
    """A private copy of the package sources for hashing, so tests can edit them."""
    shutil.copytree(codehash.SRC / "cs336sys", tmp_path / "cs336sys")
    monkeypatch.setattr(codehash, "SRC", tmp_path)
    codehash.closure.cache_clear()
    yield tmp_path / "cs336sys"
    codehash.closure.cache_clear()


def test_closure_follows_package_imports_only():
    bench = codehash.closure("cs336sys.bench")
    assert {"cs336sys.bench", "cs336sys.model", "cs336sys.sizes", "cs336sys.optim", "cs336sys.timing"} <= set(bench)
    assert "cs336sys.precision" not in bench
    assert "cs336sys.model" not in codehash.closure("cs336sys.precision")


def test_hash_changes_with_content_not_with_file_times(src_copy):
    before = codehash.code_hash("cs336sys.bench")
    (src_copy / "model.py").touch()
    codehash.closure.cache_clear()
    assert codehash.code_hash("cs336sys.bench") == before
    with open(src_copy / "model.py", "a") as f:
        f.write("\n# a comment is a change of content\n")
    codehash.closure.cache_clear()
    assert codehash.code_hash("cs336sys.bench") != before


def test_unrelated_change_keeps_the_hash(src_copy):
    before = codehash.code_hash("cs336sys.precision")
    with open(src_copy / "model.py", "a") as f:
        f.write("\nX = 1\n")
    codehash.closure.cache_clear()
    assert codehash.code_hash("cs336sys.precision") == before


def test_unknown_module_is_an_error():
    with pytest.raises(ValueError, match="no source for module"):
        codehash.closure("cs336sys.does_not_exist")


def test_a_command_line_under_the_main_guard_is_not_what_a_point_runs(src_copy):
    bench = codehash.closure("cs336sys.bench")
    assert "cs336sys.bench_cli" not in bench and "cs336sys.accounting.plan" not in bench
    before = codehash.code_hash("cs336sys.bench")
    with open(src_copy / "bench_cli.py", "a") as f:  # the CLI's options, messages, estimate
        f.write("\n# a new message\n")
    codehash.closure.cache_clear()
    assert codehash.code_hash("cs336sys.bench") == before
    with open(src_copy / "bench.py", "a") as f:  # a module-level import outside the guard counts
        f.write("\nimport cs336sys.precision  # noqa\n")
    codehash.closure.cache_clear()
    assert "cs336sys.precision" in codehash.closure("cs336sys.bench")
