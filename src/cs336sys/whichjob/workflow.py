"""The workflow of a checkout as Snakemake parses it, and the two questions asked of it: which rule makes a
file, and what a rule's files are; each with Snakemake's verdict on its job and why in words."""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from cs336sys import codehash, knobs, provenance, registry
from cs336sys import pins as pins_lib
from cs336sys import why as why_lib
from cs336sys.whichjob.model import (
    REPORT_RULES,
    Output,
    Rule,
    Unknown,
    WorkflowParseError,
    _point_diff,
    _recorded_point,
    _registrations,
    find_repo,
)
from cs336sys.whichjob.render import _listed


class Workflow:
    """The workflow of a checkout, parsed by Snakemake for one grid, and its rules' files.

    A context manager: inside it the working directory is the workflow's (`smoke/` for the smoke
    grid); on exit it, the environment and `sys.path` are what they were. `which` and `rule_outputs`
    answer the two questions; each builds Snakemake's DAG of what it asks about to judge whether it is
    up to date.
    """

    def __init__(self, repo: Path | None = None, config: dict[str, Any] | None = None):
        self.repo = find_repo(repo)
        self.config = dict(config or {})
        self._stack = contextlib.ExitStack()
        self._explained: dict[str, list[str]] = {}

    # --- parsing ------------------------------------------------------------------------------------

    def __enter__(self) -> Workflow:
        from snakemake.api import SnakemakeApi
        from snakemake.settings.types import ConfigSettings, OutputSettings, Quietness, ResourceSettings

        # parsing sets the job environment (os.environ) and puts the checkout's src/ on sys.path: undone on exit
        cwd, environ, path = os.getcwd(), dict(os.environ), list(sys.path)
        self._stack.callback(_restore, cwd, environ, path)
        os.chdir(self.repo)
        api = self._stack.enter_context(SnakemakeApi(OutputSettings(quiet={Quietness.ALL})))
        self._api = api.workflow(resource_settings=ResourceSettings(),
                                 config_settings=ConfigSettings(config=self.config),
                                 snakefile=self.repo / "Snakefile")
        said = io.StringIO()  # what the workflow prints while parsing (stale jobs): said here per file
        try:
            with contextlib.redirect_stderr(said):
                self.snakemake = self._api._workflow
        except BaseException as e:
            self._stack.close()
            raise WorkflowParseError(f"{said.getvalue()}{type(e).__name__}: {e}") from e
        self.workdir = Path.cwd()
        self.grid = str(self.snakemake.config.get("grid", "main"))
        self.pins_on = self.snakemake.config.get("pins", "on") == "on"
        registered = _registrations(self.repo)
        self.rules: dict[str, Rule] = {}
        for r in self.snakemake.rules:
            self.rules[r.name] = self._rule(r, registered)
        self.outputs: dict[str, Output] = {o.path: o for r in self.rules.values() for o in r.outputs}
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _rule(self, r: Any, registered: dict[str, list[str]]) -> Rule:
        from snakemake.io import is_flagged

        params = dict(r.params.items())
        sections = {s.rule: s.name for s in registry.SECTIONS.values()}
        declared = [(str(f), is_flagged(f, "directory")) for f in r.output]
        extra = [Output(str(f), r.name, "log") for f in r.log]
        if r.benchmark:
            extra.append(Output(str(r.benchmark), r.name, "benchmark"))
        if "problem" in params and "points" in params:
            results = list(params["results"])
            outputs = []
            for path, _ in declared:
                if path in results:
                    outputs.append(Output(path, r.name, "result", results.index(path)))
                else:  # a rendered folder: its result file's path without .json
                    outputs.append(Output(path, r.name, "rendered", results.index(f"{path}.json")))
            return Rule(r.name, "experiment", outputs + extra, params, experiment=params["problem"],
                        function=params["function"],
                        points=[knobs.with_defaults(params["problem"], p) for p in json.loads(params["points"])],
                        registered_in=registered.get(f"experiment:{params['problem']}", []))
        outputs = [Output(path, r.name, "output") for path, _ in declared] + extra
        if r.name in sections:
            name = sections[r.name]
            return Rule(r.name, "section", outputs, params, section=name, function=registry.section(name).module,
                        registered_in=registered.get(f"section:{name}", []))
        where = [f"{Path(r.snakefile).relative_to(self.repo)}:{r.lineno}"] if r.snakefile else []
        return Rule(r.name, "report" if r.name in REPORT_RULES else "target", outputs, params, registered_in=where)

    # --- paths ----------------------------------------------------------------------------------------

    def relative(self, path: str | Path) -> str:
        """A path as the workflow sees it (relative to its working directory); `path` is absolute or
        relative to the checkout."""
        full = Path(path) if Path(path).is_absolute() else self.repo / path
        return os.path.normpath(os.path.relpath(full, self.workdir))

    def shown(self, path: str) -> str:
        """A workflow path as the checkout sees it (`smoke/results/...` on the smoke grid)."""
        return os.path.normpath(os.path.relpath(self.workdir / path, self.repo))

    def locate(self, path: str) -> tuple[str, Output | None, list[Output]]:
        """(the path as the workflow sees it, the output that is it or holds it, or None and the outputs
        under it, a folder); Unknown if neither."""
        p = self.relative(path)
        if p in self.outputs:
            return p, self.outputs[p], []
        holder = next((o for o in self.outputs.values() if p.startswith(o.path + "/")), None)
        if holder is not None:
            if os.path.isdir(holder.path) and not os.path.exists(p):
                raise Unknown(f"no rule makes {self.shown(p)}: rule {holder.rule} makes the folder "
                              f"{self.shown(holder.path)}/, which holds no such file")
            return p, holder, []
        inside = [o for o in self.outputs.values() if o.path.startswith(p + "/") or p == "."]
        if inside:
            return p, None, inside
        close = difflib.get_close_matches(p, list(self.outputs), n=3, cutoff=0.85)
        hint = f"; close: {', '.join(self.shown(c) for c in close)}" if close else ""
        top = Path(self.shown(p)).parts[0]
        if top in ("smoke", "next") and top not in self.grid.split("+"):
            hint = f" (files under {top}/ are grid {top}'s: --config grid={top})"
        elif self.grid == "main":
            hint += " (of grid main; the overlay's jobs are in --config grid=next)"
        grid = "" if self.grid == "main" else f" of grid {self.grid}"
        raise Unknown(f"no rule{grid} makes {self.shown(p)}{hint}")

    def rule(self, name: str) -> Rule:
        if name in self.rules:
            return self.rules[name]
        of_experiment = sorted(r.name for r in self.rules.values() if r.experiment == name)
        if of_experiment:
            raise Unknown(f"{name} is an experiment, not a rule; its rules: {', '.join(of_experiment)}")
        close = difflib.get_close_matches(name, list(self.rules), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `snakemake --list-rules` lists them"
        grid = "" if self.grid == "main" else f" (grid {self.grid})"
        raise Unknown(f"the workflow{grid} has no rule {name!r}{hint}")

    # --- verdicts -------------------------------------------------------------------------------------

    def _judge(self, targets: set[str]) -> dict[str, Any]:
        """Snakemake's DAG of `targets` (files or rule names): rule name -> its job."""
        from snakemake.settings.types import DAGSettings

        self._api.dag(DAGSettings(targets=targets, force_incomplete=True))
        w = self.snakemake
        w._prepare_dag(forceall=False, ignore_incomplete=False, lock_warn_only=True, nolock=True)
        w._build_dag()
        return {job.rule.name: job for job in w.dag.jobs}

    def _code(self, rule: Rule) -> dict[str, Any]:
        """The `code` the rule passes now; for an experiment also the hash of its code as it is (`live`)
        and its pin, if it has one."""
        out: dict[str, Any] = {"rule": rule.params.get("code")}
        if rule.kind != "experiment":
            return out
        live = codehash.code_hash(rule.function, codehash.RUNNER)
        out["live"] = live
        pins = pins_lib.load(self.repo / "workflow" / "pins.yaml") if self.pins_on else []
        pin = next((p for p in pins if rule.name in p.rules), None)
        if pin is not None:
            state = pins_lib.state(pin.rules[rule.name], live, pin.outputs.get(rule.name, []),
                                   at=pin.code.get(rule.name))
            out["pin"] = {"state": state, "hash": pin.rules[rule.name], "reason": pin.reason,
                          "pinned_at": (pin.pinned_at or "?")[:10]}
        return out

    def _job(self, rule: Rule, job: Any) -> dict[str, Any]:
        """Snakemake's verdict on the rule's job, and why in words: the reasons it gives, the rules whose
        files must be re-made first, a change of code (with the statements that changed) or of points,
        or the pin that keeps the results although their code changed."""
        code = self._code(rule)
        dag = self.snakemake.dag
        needrun = bool(job is not None and dag.needrun(job))
        made = sorted({h for f in rule.declared if (h := provenance.recorded_hash(f))})
        why: list[str] = []
        changed: dict[str, list[str]] = {}  # output -> the parameters it was made with other values of
        if needrun:
            reason = dag.reason(job)
            why.append(f"Snakemake: {', '.join(reason.get_names())}")
            upstream = sorted({self.outputs[str(f)].rule for f in reason.updated_input_run if str(f) in self.outputs})
            if upstream:
                why.append(f"inputs to be re-made first, by: {_listed(upstream)}")
                roots = self._roots(job)
                if roots != upstream:
                    why.append(f"  at the root: {_listed(roots)} (stale for reasons of their own)")
            if reason.forced:
                why.append("incomplete: a run of it was cut off")
            for f in rule.declared:
                if os.path.exists(f) and provenance.record(f) is not None:
                    changed[f] = self._changed_params(job, f)
            names = {n for ns in changed.values() for n in ns}
            if "code" in names:
                why.append(f"code: made with {', '.join(made)}, the rule now passes {code['rule']}")
                if rule.kind == "experiment":
                    why += [f"  {line}" for line in self._explain(rule)]
            if "points" in names:
                why.append("points: the job's points changed")
            if names - {"code", "points"}:
                why.append(f"parameters changed: {', '.join(sorted(names - {'code', 'points'}))}")
        pin = code.get("pin")
        pinned = bool(pin and pin["state"] == "effective" and code["rule"] != code["live"])
        if pinned and not needrun:
            why.append(f"pinned at {pin['pinned_at']}: {pin['reason']}")
            why.append(f"code: made with {', '.join(made)}, which the pin keeps; the code is now {code['live']}")
            why += [f"  {line}" for line in self._explain(rule)]
        elif pin is not None and pin["state"] == "outdated":
            why.append(f"its pin is outdated (the code changed again since it was pinned): {pin['reason']}")
        return {"up_to_date": not needrun, "pinned": pinned and not needrun, "code": code, "made_with": made,
                "why": why, "changed": changed}

    def _roots(self, job: Any) -> list[str]:
        """The rules upstream of `job` that must run for a reason of their own (not only because
        something they read is re-made)."""
        dag, seen, roots, todo = self.snakemake.dag, set(), set(), [job]
        while todo:
            j = todo.pop()
            for dep in dag.dependencies[j]:
                if dep not in seen and dag.needrun(dep):
                    seen.add(dep)
                    todo.append(dep)
                    if not dag.reason(dep).updated_input_run:
                        roots.add(dep.rule.name)
        return sorted(roots)

    def _file(self, rule: Rule, output: Output, verdict: dict[str, Any]) -> dict[str, Any]:
        """One output's status: its job's verdict, and what is its own (missing, no provenance record, its
        point changed). A log or timing record is only its job's (logs are git-ignored: a clone has none)."""
        exists = os.path.exists(output.path)
        if output.role in ("log", "benchmark"):
            status = ("stale" if not verdict["up_to_date"] else "up to date" if exists
                      else "not here (its job is up to date)")
            return {"status": status, "exists": exists, "why": []}
        rec = provenance.record(output.path)
        why = []
        if exists and rec is None:
            why.append("no provenance record in .snakemake/metadata (Snakemake keeps the file as it is)")
        if "points" in verdict["changed"].get(output.path, []) and output.index is not None:
            before = knobs.with_defaults(rule.experiment, _recorded_point(rec, rule.results[output.index]) or {})
            diff = _point_diff(before, rule.points[output.index])
            why.append(f"its point changed: {'; '.join(diff)}" if diff else "its own point is unchanged")
        status = ("missing" if not exists else "stale" if not verdict["up_to_date"]
                  else "up to date, pinned" if verdict["pinned"] else "up to date")
        return {"status": status, "exists": exists, "recorded_code": provenance.code_param(rec), "why": why}

    def _changed_params(self, job: Any, path: str) -> list[str]:
        """The names of the job's parameters whose values differ from those `path` was made with."""
        from snakemake.persistence import UNREPRESENTABLE

        persistence = self.snakemake.persistence
        change = persistence.params_changed(job, file=job.output[[str(f) for f in job.output].index(path)])
        if not change:
            return []
        serialize = persistence._serialize_param
        names = [n for n, v in job.params.items()
                 if (s := serialize(v)) is not UNREPRESENTABLE and s in change.only_new]
        return names or ["(one the rule no longer has)"]

    def _explain(self, rule: Rule) -> list[str]:
        """What changed in an experiment's code since its results' commit, or its outdated pin (once per rule)."""
        if rule.name not in self._explained:
            pins = pins_lib.load(self.repo / "workflow" / "pins.yaml") if self.pins_on else []
            entries = (rule.function, codehash.RUNNER)
            self._explained[rule.name] = why_lib.explain(rule.name, entries, rule.results, pins)
        return self._explained[rule.name]

    def _describe(self, rule: Rule) -> dict[str, Any]:
        d: dict[str, Any] = {"rule": rule.name, "kind": rule.kind, "registered_in": rule.registered_in}
        if rule.kind == "experiment":
            d.update(experiment=rule.experiment, function=rule.function, points=len(rule.points))
        elif rule.kind == "section":
            d.update(section=rule.section, module=rule.function)
        return d

    def _output(self, rule: Rule, output: Output, verdict: dict[str, Any]) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.shown(output.path), "role": output.role}
        if output.index is not None:
            d.update(point_index=output.index, point=rule.points[output.index])
        return {**d, **self._file(rule, output, verdict)}

    # --- the two questions ----------------------------------------------------------------------------

    def which(self, paths: list[str]) -> list[dict[str, Any]]:
        """Per path: the rule and point that make it and its status (`why`: its job's reasons, then its
        own); for a folder, the rules with files in it; for a path no rule makes, an `error`."""
        located: list[tuple[str, tuple[str, Output | None, list[Output]] | Unknown]] = []
        for path in paths:
            try:
                located.append((path, self.locate(path)))
            except Unknown as e:
                located.append((path, e))
        targets = set()
        for _, found in located:
            if not isinstance(found, Unknown):
                _, holder, inside = found
                if holder is not None and holder.role in ("result", "rendered", "output"):
                    targets.add(holder.path)
                else:
                    targets |= {o.rule for o in ([holder] if holder else inside)}
        jobs = self._judge(targets) if targets else {}
        out = []
        for path, found in located:
            if isinstance(found, Unknown):
                out.append({"path": path, "error": str(found)})
                continue
            p, holder, inside = found
            if holder is not None:
                rule = self.rules[holder.rule]
                verdict = self._job(rule, jobs.get(rule.name))
                entry = {"path": self.shown(p), **self._describe(rule)}
                if p != holder.path:
                    entry["in"] = self.shown(holder.path)
                own = self._output(rule, holder, verdict)
                own.pop("path")
                out.append({**entry, **own, "up_to_date": verdict["up_to_date"], "code": verdict["code"],
                            "made_with": verdict["made_with"], "why": verdict["why"] + own["why"]})
                continue
            listed = []
            for name in sorted({o.rule for o in inside}):
                job = jobs.get(name)
                files = [o for o in inside if o.rule == name and o.role in ("result", "rendered", "output")]
                needrun = bool(job is not None and self.snakemake.dag.needrun(job))
                listed.append({**self._describe(self.rules[name]), "files": len(files), "up_to_date": not needrun})
            out.append({"path": self.shown(p), "folder": True, "rules": listed})
        return out

    def rule_outputs(self, name: str) -> dict[str, Any]:
        """The rule, its job's verdict (`why` once for the job), and each of its files with its point and
        status (`why`: what is the file's own)."""
        rule = self.rule(name)
        jobs = self._judge({rule.name})
        verdict = self._job(rule, jobs.get(rule.name))
        d = {**self._describe(rule), **{k: v for k, v in verdict.items() if k != "changed"}}
        d["outputs"] = [self._output(rule, o, verdict) for o in rule.outputs]
        if rule.kind == "target":
            d["inputs"] = sorted(self.shown(str(f)) for f in self.snakemake.get_rule(rule.name).input)
        return d


def _restore(cwd: str, environ: dict[str, str], path: list[str]) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path
