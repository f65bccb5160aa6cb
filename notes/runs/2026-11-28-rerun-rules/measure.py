"""Issue 64, items 1 and 2: what each refinement of the re-run rule buys, what the hash cache saves,
and the GPU time that re-making the pinned results needs.

    python notes/runs/2026-11-28-rerun-rules/measure.py            # all three parts
    python notes/runs/2026-11-28-rerun-rules/measure.py stale      # A: stale rules per edit, per candidate rule
    python notes/runs/2026-11-28-rerun-rules/measure.py timing     # B: hashing and `snakemake -n`, cache on/off
    python notes/runs/2026-11-28-rerun-rules/measure.py plan       # C: the pinned rules' GPUs and run times

Reads git history and the checkout it sits in; writes only beside itself (*.csv, *.json, the printed
tables in *.txt). It imports this checkout's `cs336sys` (src/ is put first on sys.path), never an
installed one. One process, one core (part B starts its subprocesses one at a time).

A. Candidate rules, each a hash per experiment rule (entries: the experiment's function and the job
runner `cs336sys.run`, as workflow/rules/common.smk's `experiment_code`), computed over every commit's
src/ as read from git (no checkout is written):
  R0   the current rule: this checkout's `cs336sys.codehash.Tree` pointed at the old tree (statement
       reachability, constant folding, import-order insensitivity);
  R2   R0 with constant folding switched off (`_constant_digest` returns None while parsing: no value
       digests, no inlining of imported constants); statement reachability kept;
  R1   module granularity: every package module reachable by an import anywhere in a reachable module
       (lazy imports in every function included), each hashed as the sequence of its statements' token
       digests (codehash's own token cleaning: comments, docstrings, blank lines, layout dropped), in
       source order;
  R3   the raw bytes of R1's modules;
  Ptok every module of the package, token-cleaned (no reachability at all);
  Praw every .py file of the package, raw bytes.
A rule is stale across a commit pair when its experiment exists at both commits (its registry's
`Experiment(name, function, ...)`, resolvable in that tree) and its hash differs. Rules are counted with
today's rules per experiment (the workflow parsed once, through cs336sys.whichjob).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import csv
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SRC = REPO / "src"
sys.path.insert(0, str(SRC))

from cs336sys import codehash as ch  # noqa: E402

FIRST = "ff2008ac"  # the first first-parent commit with src/cs336sys/registry.py (experiments registered)
BRANCH = "cca08cef"  # main's head when measured (2026-11-28 20:43), the sources of this checkout
RULES = ("R0", "R2", "R1cut", "R1", "R3", "Ptok", "Praw")
# R1cut: R1 without the re-run machinery, which every experiment reaches by module imports only through
# `cs336sys.jobs` (its `which` command imports cs336sys.whichjob lazily) and `cs336sys.knobs` (it imports
# `codehash._absolute`): what R1 would stale if those two imports were moved out of the job path.
MACHINERY = {"cs336sys.codehash", "cs336sys.pins", "cs336sys.provenance", "cs336sys.whichjob"}
RECENT = 60  # the last commits on the first-parent line that touched src/cs336sys


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    return {"host": os.uname().nodename, "cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0],
            "loadavg": os.getloadavg(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# --- today's rules -------------------------------------------------------------------------------------


def workflow_rules() -> dict[str, dict]:
    """Each experiment rule of the main grid: experiment, function, GPUs, ranks, result and benchmark files."""
    from cs336sys.whichjob import Workflow

    out = {}
    with Workflow(REPO) as w:
        for r in w.rules.values():
            if r.kind != "experiment":
                continue
            res = w.snakemake.get_rule(r.name).resources
            gpus = res["gpu"].value if "gpu" in res else 0
            out[r.name] = {"experiment": r.experiment, "function": r.function, "gpus": int(gpus),
                           "ranks": int(r.params.get("nproc", 1)),
                           "results": [o.path for o in r.outputs if o.role == "result"],
                           "benchmark": next((o.path for o in r.outputs if o.role == "benchmark"), None)}
    return out


# --- A: stale rules per commit pair ------------------------------------------------------------------


class Blobs:
    """`git cat-file --batch`, one process."""

    def __init__(self) -> None:
        self.p = subprocess.Popen(["git", "-C", str(REPO), "cat-file", "--batch"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)

    def read(self, sha: str) -> bytes:
        self.p.stdin.write(sha.encode() + b"\n")
        self.p.stdin.flush()
        header = self.p.stdout.readline().split()
        size = int(header[2])
        data = self.p.stdout.read(size)
        self.p.stdout.read(1)
        return data


BLOBS: Blobs | None = None
PARSED: dict[tuple[str, str, str], ch.Module] = {}  # (variant, module, blob) -> parsed
IMPORTS: dict[tuple[str, str], set[str]] = {}  # (module, blob) -> package modules its imports may name


def files_at(commit: str) -> dict[str, str]:
    """Path under src/ -> blob, for every .py file of the package at `commit`."""
    out = {}
    for line in git("ls-tree", "-r", commit, "src/cs336sys").splitlines():
        meta, path = line.split("\t", 1)
        if path.endswith(".py"):
            out[path[len("src/"):]] = meta.split()[2]
    return out


@contextlib.contextmanager
def no_constant_folding():
    saved = ch._constant_digest
    ch._constant_digest = lambda node: None
    try:
        yield
    finally:
        ch._constant_digest = saved


class GitTree(ch.Tree):
    """codehash's Tree over one commit's files, read from git; parsed modules shared across commits."""

    def __init__(self, files: dict[str, str], variant: str) -> None:
        super().__init__(Path("/git-src"))
        self.files, self.variant = files, variant

    def path(self, module: str) -> Path | None:
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if rel in self.files:
                return self.root / rel
        return None

    def module(self, name: str) -> ch.Module:
        if name not in self._modules:
            path = self.path(name)
            if path is None:
                raise ValueError(f"no source for module {name!r}")
            blob = self.files[path.relative_to(self.root).as_posix()]
            key = (self.variant, name, blob)
            if key not in PARSED:
                text = BLOBS.read(blob).decode()
                if self.variant == "nofold":
                    with no_constant_folding():
                        PARSED[key] = ch._parse(path, name, text)
                else:
                    PARSED[key] = ch._parse(path, name, text)
            self._modules[name] = PARSED[key]
        return self._modules[name]


def module_name(rel: str) -> str:
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(name: str, rel: str, blob: str) -> set[str]:
    """Package modules named by any import anywhere in the module (a `from m import x` names m and m.x)."""
    key = (name, blob)
    if key not in IMPORTS:
        tree = ast.parse(BLOBS.read(blob).decode())
        is_package = rel.endswith("__init__.py")
        found: set[str] = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                found.update(a.name for a in n.names if ch._ours(a.name))
            elif isinstance(n, ast.ImportFrom):
                target = ch._absolute(name, is_package, n)
                if ch._ours(target):
                    found.add(target)
                    found.update(f"{target}.{a.name}" for a in n.names if a.name != "*")
        IMPORTS[key] = found
    return IMPORTS[key]


def module_closure(files: dict[str, str], entries: list[str], skip: frozenset[str] = frozenset()) -> set[str]:
    """R1's modules: the entries' modules and every package module reachable by imports, with their packages."""
    by_name = {module_name(rel): rel for rel in files}
    todo = [e.partition(":")[0] for e in entries]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for i in range(1, len(parts) + 1):
            p = ".".join(parts[:i])
            if p in seen or p not in by_name or p in skip:
                continue
            seen.add(p)
            rel = by_name[p]
            todo.extend(imports_of(p, rel, files[rel]))
    return seen


def registry_at(files: dict[str, str]) -> dict[str, str]:
    """experiment -> function, from the commit's registry.py (`Experiment("name", "module:function", ...)`)."""
    out = {}
    for n in ast.walk(ast.parse(BLOBS.read(files["cs336sys/registry.py"]).decode())):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Experiment"
                and len(n.args) >= 2 and all(isinstance(a, ast.Constant) for a in n.args[:2])):
            out[n.args[0].value] = n.args[1].value
    return out


def hashes_at(files: dict[str, str]) -> dict[str, dict[str, str]]:
    """rule candidate -> experiment -> hash (experiments whose function this tree cannot resolve left out)."""
    experiments = registry_at(files)
    fold, nofold = GitTree(files, "fold"), GitTree(files, "nofold")
    tok = {module_name(rel): ch._digest([s.digest for s in fold.module(module_name(rel)).statements]) for rel in files}
    out: dict[str, dict[str, str]] = {r: {} for r in RULES}
    whole_tok = ch._digest([f"{m}:{d}" for m, d in sorted(tok.items())])
    whole_raw = ch._digest([f"{rel}:{b}" for rel, b in sorted(files.items())])
    for e, function in experiments.items():
        entries = [function, "cs336sys.run"]
        try:
            out["R0"][e] = fold.code_hash(*entries)
            out["R2"][e] = nofold.code_hash(*entries)
        except ValueError:
            for r in RULES:
                out[r].pop(e, None)
            continue
        mods = sorted(module_closure(files, entries))
        out["R1"][e] = ch._digest([f"{m}:{tok[m]}" for m in mods])
        cut = sorted(module_closure(files, entries, frozenset(MACHINERY)))
        out["R1cut"][e] = ch._digest([f"{m}:{tok[m]}" for m in cut])
        by_name = {module_name(rel): blob for rel, blob in files.items()}
        out["R3"][e] = ch._digest([f"{m}:{by_name[m]}" for m in mods])
        out["Ptok"][e] = whole_tok
        out["Praw"][e] = whole_raw
    out["_tok"] = tok  # per module, for classifying an edit
    return out


def part_stale(rules: dict[str, dict]) -> dict:
    global BLOBS
    BLOBS = Blobs()
    weight = collections.Counter(r["experiment"] for r in rules.values())
    commits = git("rev-list", "--first-parent", "--reverse", BRANCH, f"^{FIRST}^").split()
    info = {}
    for line in git("log", "--first-parent", "--format=%H\t%h\t%cI\t%P\t%s", f"{FIRST}^..{BRANCH}").splitlines():
        full, short, date, parents, subject = line.split("\t", 4)
        info[full] = {"short": short, "date": date, "merge": len(parents.split()) > 1, "subject": subject}
    t0 = time.perf_counter()
    cache: dict[str, dict] = {}  # src tree id -> hashes
    src_tree = {c: git("rev-parse", f"{c}:src/cs336sys").strip() for c in commits}
    rows = []
    prev = None
    for c in commits:
        tid = src_tree[c]
        if tid not in cache:
            files = files_at(c)
            cache[tid] = {"files": files, "hashes": hashes_at(files)}
        if prev is not None:
            a, b = cache[src_tree[prev]], cache[tid]
            row = {"commit": info[c]["short"], "parent": info[prev]["short"], "date": info[c]["date"],
                   "merge": info[c]["merge"], "subject": info[c]["subject"][:100]}
            fa, fb = a["files"], b["files"]
            changed = sorted(p for p in set(fa) | set(fb) if fa.get(p) != fb.get(p))
            tok_changed = sorted(module_name(p) for p in set(fa) | set(fb)
                                 if a["hashes"]["_tok"].get(module_name(p)) != b["hashes"]["_tok"].get(module_name(p)))
            row["py_files_changed"] = len(changed)
            row["modules_token_changed"] = len(tok_changed)
            row["kind"] = ("no .py change" if not changed else "docs/layout only" if not tok_changed else "code")
            row["changed"] = " ".join(changed)
            common = sorted(set(a["hashes"]["R0"]) & set(b["hashes"]["R0"]))
            row["experiments"] = len(common)
            row["rules"] = sum(weight.get(e, 1) for e in common)
            for r in RULES:
                stale = [e for e in common if a["hashes"][r][e] != b["hashes"][r][e]]
                row[f"{r}_rules"] = sum(weight.get(e, 1) for e in stale)
                row[f"{r}_exps"] = len(stale)
                row[f"{r}_stale"] = " ".join(stale)
            rows.append(row)
        prev = c
    elapsed = time.perf_counter() - t0
    # the adapter's check: at the last commit, R0 read from git equals codehash's own Tree on this
    # checkout's src/ (the same sources when the checkout is clean), experiment by experiment
    head = cache[src_tree[commits[-1]]]["hashes"]["R0"]
    own = ch.Tree(SRC)
    adapter_check = {"experiments": len(head),
                     "equal": sum(own.code_hash(registry_at(cache[src_tree[commits[-1]]]["files"])[e], "cs336sys.run") == h
                                  for e, h in head.items())}
    BLOBS.p.stdin.close()
    BLOBS.p.wait()

    with open(HERE / "stale_pairs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    src_rows = [r for r in rows if r["py_files_changed"]]
    recent = src_rows[-RECENT:]

    def summary(rs: list[dict]) -> dict:
        s = {"pairs": len(rs), "code": sum(r["kind"] == "code" for r in rs),
             "docs_layout_only": sum(r["kind"] == "docs/layout only" for r in rs)}
        for r in RULES:
            s[r] = {"rule_stales": sum(x[f"{r}_rules"] for x in rs),
                    "experiment_stales": sum(x[f"{r}_exps"] for x in rs),
                    "edits_staling_nothing": sum(x[f"{r}_rules"] == 0 for x in rs),
                    "edits_staling_all": sum(x[f"{r}_exps"] == x["experiments"] and x["experiments"] > 0 for x in rs)}
        return s

    def differ(x: str, y: str, rs: list[dict]) -> list[dict]:
        return [{"commit": r["commit"], "merge": r["merge"], "subject": r["subject"][:80], x: r[f"{x}_rules"],
                 y: r[f"{y}_rules"], "saved": sorted(set(r[f"{y}_stale"].split()) - set(r[f"{x}_stale"].split())),
                 "extra": sorted(set(r[f"{x}_stale"].split()) - set(r[f"{y}_stale"].split()))}
                for r in rs if r[f"{x}_rules"] != r[f"{y}_rules"] or r[f"{x}_stale"] != r[f"{y}_stale"]]

    out = {
        "range": f"{info[commits[0]]['short']}..{info[commits[-1]]['short']} first-parent of main",
        "commits": len(commits), "pairs": len(rows), "distinct_src_trees": len(cache),
        "first": info[commits[0]]["date"], "last": info[commits[-1]]["date"],
        "rules_today": sum(weight.values()), "rules_per_experiment": dict(weight),
        "seconds": round(elapsed, 1), "adapter_check": adapter_check,
        "all_pairs_touching_py": summary(src_rows),
        f"last_{RECENT}_pairs_touching_py": summary(recent),
        "recent_from": recent[0]["commit"] if recent else None,
        "docs_layout_only_edits": [{"commit": r["commit"], "subject": r["subject"][:80],
                                    **{x: r[f"{x}_rules"] for x in RULES}}
                                   for r in src_rows if r["kind"] == "docs/layout only"],
        "R0_vs_R2 (constant folding)": differ("R0", "R2", src_rows),
        "R2_vs_R1 (statement reachability)": differ("R2", "R1", src_rows),
        "R1_vs_R3 (token cleaning)": differ("R1", "R3", src_rows),
        "R2_vs_R1cut": differ("R2", "R1cut", src_rows),
    }
    (HERE / "stale.json").write_text(json.dumps(out, indent=1))
    return out


# --- B: timing -----------------------------------------------------------------------------------------

HASH_ALL = (
    "import json, sys, time; t = time.perf_counter(); sys.path.insert(0, sys.argv[1]); "
    "from cs336sys.codehash import code_hash; "
    "[code_hash(f, 'cs336sys.run') for f in json.loads(sys.argv[2])]; "
    "print(time.perf_counter() - t)"
)


def simple_module_hash(path: Path) -> str:
    """A minimal stand-alone R1 module hash (for timing): tokens less comments, line breaks inside
    brackets and every bare-string statement (docstrings)."""
    import io
    import tokenize

    text = path.read_text()
    docs = {(n.lineno, n.col_offset) for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    keep = [t.string if t.type != tokenize.NEWLINE else ";" for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL) and t.start not in docs]
    return hashlib.sha256("\x1f".join(keep).encode()).hexdigest()[:16]


def simple_hashes(functions: list[str]) -> None:
    """R1 for every rule against this checkout's src/, stand-alone (no codehash), printing its time."""
    t = time.perf_counter()
    files = {p.relative_to(SRC).as_posix(): p for p in (SRC / "cs336sys").rglob("*.py")}
    by_name = {module_name(rel): rel for rel in files}
    digests: dict[str, str] = {}
    imports: dict[str, set[str]] = {}
    out = {}
    for function in dict.fromkeys(functions):
        todo, seen = [function.partition(":")[0], "cs336sys.run"], set()
        while todo:
            m = todo.pop()
            parts = m.split(".")
            for i in range(1, len(parts) + 1):
                q = ".".join(parts[:i])
                if q in seen or q not in by_name:
                    continue
                seen.add(q)
                if q not in imports:
                    tree = ast.parse(files[by_name[q]].read_text())
                    found = set()
                    for n in ast.walk(tree):
                        if isinstance(n, ast.Import):
                            found.update(a.name for a in n.names)
                        elif isinstance(n, ast.ImportFrom):
                            target = ch._absolute(q, by_name[q].endswith("__init__.py"), n)
                            found.add(target)
                            found.update(f"{target}.{a.name}" for a in n.names)
                    imports[q] = {x for x in found if ch._ours(x)}
                    digests[q] = simple_module_hash(files[by_name[q]])
                todo.extend(imports[q])
        out[function] = hashlib.sha256("".join(f"{m}:{digests[m]}" for m in sorted(seen)).encode()).hexdigest()[:16]
    print(time.perf_counter() - t)


def timed(cmd: list[str], env: dict, cwd: Path) -> dict:
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode:
        raise SystemExit(f"{cmd[:3]} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load1_before": load, "stdout_tail": p.stdout.strip()[-200:]}


def part_timing(rules: dict[str, dict], repeats: int = 3) -> dict:
    functions = [r["function"] for r in rules.values()]
    base = {k: v for k, v in os.environ.items() if k != ch.CACHE_ENV}
    base["PYTHONPATH"] = str(SRC)
    out: dict = {"machine": machine(), "rules": len(functions)}
    tmp = Path(tempfile.mkdtemp(prefix="codehash-timing-"))
    try:
        warm = tmp / "warm"
        for what, cmd in (("hash_all_rules", [sys.executable, "-c", HASH_ALL, str(SRC), json.dumps(functions)]),
                          ("hash_all_rules_simple_R1", [sys.executable, str(Path(__file__)), "simple",
                                                        json.dumps(functions)]),
                          ("snakemake_dry_run", ["snakemake", "-n", "writeup/report.pdf"])):
            runs: dict[str, list] = {"cache warm": [], "cache miss": [], "cache off": []}
            timed(cmd, {**base, ch.CACHE_ENV: str(warm)}, REPO)  # fills the warm cache
            for i in range(repeats):  # interleaved, so that load drifts fall on all three alike
                runs["cache warm"].append(timed(cmd, {**base, ch.CACHE_ENV: str(warm)}, REPO))
                miss = tmp / f"miss-{what}-{i}"
                runs["cache miss"].append(timed(cmd, {**base, ch.CACHE_ENV: str(miss)}, REPO))
                runs["cache off"].append(timed(cmd, {**base, ch.CACHE_ENV: "off"}, REPO))
            out[what] = {k: {"median_s": statistics.median(x["wall_s"] for x in v),
                             "min_s": min(x["wall_s"] for x in v), "max_s": max(x["wall_s"] for x in v),
                             "cpu_median_s": statistics.median(x["cpu_s"] for x in v),
                             "cpu_min_s": min(x["cpu_s"] for x in v), "cpu_max_s": max(x["cpu_s"] for x in v),
                             "load1": [x["load1_before"] for x in v], "runs": v} for k, v in runs.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["machine_after"] = machine()
    (HERE / "timing.json").write_text(json.dumps(out, indent=1))
    return out


# --- C: the pinned rules ---------------------------------------------------------------------------


def part_plan(rules: dict[str, dict], batch_s: float = 540.0) -> dict:
    from cs336sys import pins as pins_lib

    pins = pins_lib.load(REPO / "workflow" / "pins.yaml")
    pinned = sorted({r for p in pins for r in p.rules})
    rows = []
    for name in pinned:
        rule = rules.get(name)
        if rule is None:
            rows.append({"rule": name, "note": "not a rule of the main grid today"})
            continue
        gpus, commits, counts, missing = collections.Counter(), set(), set(), 0
        for path in rule["results"]:
            try:
                env = json.loads((REPO / path).read_text()).get("env") or {}
            except OSError:
                missing += 1
                continue
            names = [g.get("name") for g in env.get("gpus") or []] or [env.get("gpu")]
            gpus[" + ".join(sorted(set(map(str, names))))] += 1
            commits.add((env.get("git_commit") or "?")[:8])
            counts.add(env.get("world_size") or env.get("gpu_count"))
        seconds = None
        bench = REPO / rule["benchmark"] if rule["benchmark"] else None
        if bench and bench.is_file():
            lines = bench.read_text().splitlines()
            col = lines[0].split("\t").index("s")
            seconds = sum(float(line.split("\t")[col]) for line in lines[1:] if line.strip())
        live = ch.code_hash(rule["function"], "cs336sys.run")
        in_effect = pins_lib.code_for(name, live, rule["results"], pins) != live
        rows.append({"rule": name, "experiment": rule["experiment"], "pin_in_effect": in_effect,
                     "gpus_requested": rule["gpus"],
                     "ranks": rule["ranks"], "results": len(rule["results"]), "results_missing": missing,
                     "gpu_model": " | ".join(f"{k} ({v})" if len(gpus) > 1 else k for k, v in gpus.items()),
                     "made_at": " ".join(sorted(commits)), "benchmark_s": seconds})
    with open(HERE / "pinned_rules.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["rule", "experiment", "pin_in_effect", "gpus_requested", "ranks", "results",
                                          "results_missing", "gpu_model", "made_at", "benchmark_s", "note"])
        w.writeheader()
        w.writerows(rows)

    def short(model: str) -> str:
        return "H100" if "H100" in model else "H200" if "H200" in model else model or "?"

    by_model: dict[str, dict] = {}
    for r in rows:
        if "experiment" not in r:
            continue
        key = f"{short(r['gpu_model'])}, {r['gpus_requested']} GPU"
        d = by_model.setdefault(key, {"rules": 0, "with_benchmark": 0, "seconds": 0.0, "gpu_seconds": 0.0})
        d["rules"] += 1
        if r["benchmark_s"] is not None:
            d["with_benchmark"] += 1
            d["seconds"] += r["benchmark_s"]
            d["gpu_seconds"] += r["benchmark_s"] * max(r["gpus_requested"], 1)
    # batches of at most batch_s of measured wall time, per host kind (first fit, longest first)
    batches: dict[str, list] = {}
    for kind in sorted({max(r.get("gpus_requested", 1), 1) for r in rows if "experiment" in r}):
        jobs = sorted(((r["benchmark_s"], r["rule"]) for r in rows
                       if "experiment" in r and max(r["gpus_requested"], 1) == kind and r["benchmark_s"] is not None),
                      reverse=True)
        bins: list[dict] = []
        for s, name in jobs:
            for b in bins:
                if b["seconds"] + s <= batch_s:
                    break
            else:
                b = {"seconds": 0.0, "rules": []}
                bins.append(b)
            b["seconds"] += s
            b["rules"].append(name)
        batches[f"{kind} GPU"] = bins
    out = {"pins": len(pins), "pinned_rules": len(pinned), "rows": rows, "by_model_and_kind": by_model,
           "batch_limit_s": batch_s, "batches": batches,
           "pins_in_effect": sum(bool(r.get("pin_in_effect")) for r in rows),
           "no_benchmark": [r["rule"] for r in rows if r.get("benchmark_s") is None],
           "over_one_batch": [r["rule"] for r in rows if (r.get("benchmark_s") or 0) > batch_s]}
    (HERE / "plan.json").write_text(json.dumps(out, indent=1))
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["simple"]:  # part B's subprocess: the stand-alone R1 over this checkout
        simple_hashes(json.loads(argv[1]))
        return 0
    parts = argv or ["stale", "timing", "plan"]
    rules = workflow_rules()
    meta = {"machine": machine(), "head": git("rev-parse", "--short", "HEAD").strip(),
            "experiment_rules_today": len(rules)}
    print(json.dumps(meta))
    if "plan" in parts:
        p = part_plan(rules)
        print(json.dumps({k: v for k, v in p.items() if k != "rows"}, indent=1))
    if "stale" in parts:
        s = part_stale(rules)
        print(json.dumps({k: v for k, v in s.items() if "_vs" not in k}, indent=1))
    if "timing" in parts:
        t = part_timing(rules)
        print(json.dumps({k: ({m: {x: y for x, y in d.items() if x != "runs"} for m, d in v.items()}
                              if k.startswith(("hash_all_rules", "snakemake_dry_run")) else v) for k, v in t.items()}, indent=1))
    (HERE / "meta.json").write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
