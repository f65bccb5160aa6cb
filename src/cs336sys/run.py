"""The job runner every experiment rule calls: a batch of points of one experiment, one result each.

    python -m cs336sys.run PROBLEM --function cs336sys.bench:run_point \\
        --points '[{...}, ...]' --outputs a.json b.json ... [--nproc N] [--rendered]

`--function` names `run_point(settings: SettingsDataclass, run: Run) -> dict`; it is imported only
here, so each rule's code hash covers exactly the modules that function's module imports.

With `--nproc 1` the points run in this process. With `--nproc N > 1` this process is the
coordinator: it starts N ranks with `torchrun --standalone` (NCCL on GPUs, gloo for CPU points),
each rank joins the process group (with a timeout) and runs every point; when all ranks finish a
point, rank 0 writes its result. A rank whose point fails (out of memory, unsupported, a bug)
reports that in a file and exits at once; torchrun then stops the other ranks, so nothing waits in a
collective. The coordinator records the one status of that point (`oom`, `unsupported`, or an
error naming the rank, with its traceback, and no result), then starts fresh ranks for the points
after it. A rank that dies without a word (killed, crashed) is an error naming torchrun's exit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cs336sys.jobs import (
    GpuRequired,
    Outcome,
    Run,
    attempt,
    parse_settings,
    require_gpus,
    settings_as_run,
    settings_type,
)
from cs336sys.results import write_json_atomic, write_result

EXIT_POINT_FAILED = 17  # a rank's exit code after it reported a failed point


def resolve(target: str) -> Callable:
    module, _, func = target.partition(":")
    if not func:
        raise SystemExit(f"--function must look like 'package.module:function', got {target!r}")
    return getattr(importlib.import_module(module), func)


def point_dirs(output: str | Path, rendered: bool) -> tuple[Path, Path | None]:
    """(raw artifact dir, committed rendered dir) of the point whose result file is `output`:
    results/a/b.json -> artifacts/a/b/ and results/a/b/."""
    out = Path(output)
    stem = out.with_suffix("")
    rel = stem.relative_to("results") if stem.parts and stem.parts[0] == "results" else stem
    return Path("artifacts") / rel, (stem if rendered else None)


def record(problem: str, settings, outcome: Outcome, output: str | Path, rendered_dir: Path | None) -> None:
    """Write the point's result (ok / oom / unsupported); an error writes nothing."""
    if rendered_dir is not None:  # always present (git keeps no empty folder), with what it holds
        rendered_dir.mkdir(parents=True, exist_ok=True)
        files = sorted(p.name for p in rendered_dir.iterdir() if p.name != "index.json")
        write_json_atomic(rendered_dir / "index.json", {"status": outcome.status, "files": files})
    if outcome.status == "error":
        return
    write_result(output, problem, settings_as_run(settings), outcome.metrics, outcome.status, outcome.reason)


def _describe(i: int, n: int, problem: str, point: dict) -> str:
    return f"[{problem} {i + 1}/{n}] " + " ".join(f"{k}={v}" for k, v in point.items())


def _report(outcome: Outcome) -> str:
    if outcome.status == "ok":
        return f"    -> ok ({outcome.wall_s:.1f} s)"
    where = f" on rank {outcome.rank}" if outcome.rank else ""
    return f"    -> {outcome.status}{where}: {outcome.reason}" + (" (no result written)" if outcome.status == "error"
                                                                 else "")


def run_in_process(problem: str, fn: Callable, points: list[dict], settings: list, outputs: list[str],
                   rendered: bool) -> int:
    from cs336sys.distributed import process_group

    errors = 0
    for i, (point, s, out) in enumerate(zip(points, settings, outputs, strict=True)):
        print(_describe(i, len(points), problem, point), flush=True)
        info = process_group.init(s.device)
        artifacts, rendered_dir = point_dirs(out, rendered)
        outcome = attempt(fn, s, Run(device=info.device, artifact_dir=artifacts, rendered_dir=rendered_dir))
        record(problem, s, outcome, out, rendered_dir)
        if outcome.status == "error":
            print(outcome.traceback, file=sys.stderr, flush=True)
            errors += 1
        print(_report(outcome), flush=True)
    return errors


# --- several ranks ------------------------------------------------------------------------------------

def _outcome_path(state: Path, index: int, rank: int) -> Path:
    return state / f"outcome-{index}-rank{rank}.json"


def worker(state: Path) -> int:
    """One rank under torchrun: every point of the job's state file, in order."""
    import torch.distributed as dist

    from cs336sys.distributed import process_group

    job = json.loads((state / "job.json").read_text())
    fn = resolve(job["function"])
    cls = settings_type(fn)
    info = process_group.init(job["device"])
    for index in job["indices"]:
        s = parse_settings(cls, job["points"][index])
        out = job["outputs"][index]
        artifacts, rendered_dir = point_dirs(out, job["rendered"])
        run = Run(device=info.device, rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                  backend=info.backend, artifact_dir=artifacts, rendered_dir=rendered_dir)
        outcome = attempt(fn, s, run)
        if outcome.status != "ok":
            # Leave at once: the other ranks may be inside a collective of this point; torchrun stops them.
            write_json_atomic(_outcome_path(state, index, info.rank),
                              {**vars(outcome), "metrics": {}, "time": time.time()})
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_POINT_FAILED)
        statuses = [None] * info.world_size
        dist.all_gather_object(statuses, outcome.status)  # every rank finished this point
        if info.is_main:
            record(job["problem"], s, outcome, out, rendered_dir)
    process_group.destroy()
    return 0


def _first_failure(state: Path, index: int, nproc: int) -> Outcome | None:
    reports = [json.loads(p.read_text()) for r in range(nproc) if (p := _outcome_path(state, index, r)).exists()]
    if not reports:
        return None
    first = Outcome(**min(reports, key=lambda r: r.pop("time")))  # later failures are usually its consequences
    silent = sorted(set(range(nproc)) - {r["rank"] for r in reports})
    if silent and first.status == "error":
        first.reason += (f" [rank(s) {silent} did not report: they crashed or were killed, which can be the cause "
                         "of a connection error here, or were stopped by torchrun after this failure]")
    return first


def run_distributed(problem: str, function: str, points: list[dict], settings: list, outputs: list[str],
                    nproc: int, rendered: bool) -> int:
    kinds = {s.device for s in settings}
    if len(kinds) != 1:
        raise ValueError(f"one job runs on one kind of device; got {sorted(kinds)}")
    device = kinds.pop()
    errors, start = 0, 0
    while start < len(points):
        with tempfile.TemporaryDirectory(prefix="cs336sys-job-") as tmp:
            state = Path(tmp)
            indices = list(range(start, len(points)))
            write_json_atomic(state / "job.json", {"problem": problem, "function": function, "points": points,
                                                   "outputs": outputs, "indices": indices, "rendered": rendered,
                                                   "device": device})
            for i in indices:
                print(_describe(i, len(points), problem, points[i]) + f" (ranks: {nproc})", flush=True)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                   "--monitor-interval=1", "-m", "cs336sys.run", "--worker", str(state)]
            rc = subprocess.run(cmd).returncode
            done = [i for i in indices if Path(outputs[i]).exists()]
            failed = next((i for i in indices if i not in done), None)
            if failed is None:
                return errors
            if rc == 0:  # every rank exited cleanly yet a result is missing: a bug in the runner or experiment
                print(f"error: ranks exited cleanly but {outputs[failed]} was not written", file=sys.stderr)
                return errors + len(indices) - len(done)
            outcome = _first_failure(state, failed, nproc)
            if outcome is None:  # killed, crashed, or the group never formed: the same would recur
                print(f"error: torchrun exited with code {rc} in point {failed + 1} and no rank reported why "
                      "(a rank was killed or crashed, or the process group did not form; see the output above); "
                      f"points {failed + 1}..{len(points)} get no result", file=sys.stderr)
                return errors + len(points) - failed
            artifacts, rendered_dir = point_dirs(outputs[failed], rendered)
            record(problem, settings[failed], outcome, outputs[failed], rendered_dir)
            if outcome.status == "error":
                print(f"error in point {failed + 1} on rank {outcome.rank}: {outcome.reason}", file=sys.stderr)
                if outcome.traceback:
                    print(f"--- traceback of rank {outcome.rank} ---\n{outcome.traceback}", file=sys.stderr)
                errors += 1
            print(_report(outcome), flush=True)
            start = failed + 1
    return errors


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(Path(argv[1]))
    parser = argparse.ArgumentParser(prog="python -m cs336sys.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", help="the experiment name recorded in each result (cs336sys.registry)")
    parser.add_argument("--function", required=True, help="module:function computing one point's metrics")
    parser.add_argument("--points", required=True, help="JSON list of settings dicts, one per output")
    parser.add_argument("--outputs", nargs="+", required=True)
    parser.add_argument("--nproc", type=int, default=1, help="ranks: 1 = this process; N = torchrun with N ranks")
    parser.add_argument("--rendered", action="store_true",
                        help="each point also has a committed folder for rendered files (results/.../<point>/)")
    args = parser.parse_args(argv)
    points = json.loads(args.points)
    if len(points) != len(args.outputs):
        parser.error(f"{len(points)} points but {len(args.outputs)} outputs")
    fn = resolve(args.function)
    try:
        cls = settings_type(fn)
        settings = [parse_settings(cls, p) for p in points]
    except (TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if any(s.device.startswith("cuda") for s in settings):
            require_gpus(args.nproc)
    except GpuRequired as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if args.nproc == 1:
        errors = run_in_process(args.problem, fn, points, settings, args.outputs, args.rendered)
    else:
        errors = run_distributed(args.problem, args.function, points, settings, args.outputs, args.nproc,
                                 args.rendered)
    if errors:
        print(f"{errors} point(s) failed with an error; see above", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
