# Makes the rules: one per registered experiment job, one per report section, and the report.
# Included after every part's rule file (the parts register jobs and sections; see common.smk).

for _job in EXPERIMENT_JOBS:
    _function = registry.function_of(_job.experiment, _job.points)

    rule:
        name:
            _job.rule
        output:
            _job.results,
            [directory(d) for d in _job.rendered_dirs],
        log:
            _job.log,
        benchmark:
            _job.benchmark
        resources:
            gpu=_job.gpus,
        params:
            problem=_job.experiment,
            function=_function,
            points=points_json(_job.experiment, _job.points),
            results=_job.results,
            rendered="--rendered" if _job.rendered else "",
            nproc=_job.ranks,  # ranks to start; `resources: gpu` above may be capped by --resources
            code=job_code(_job, _function),
        shell:
            EXPERIMENT


# Snakemake's own report (`snakemake --report report.html`): every numbered table and figure of the
# writeup, with the caption, section (category) and heading (subcategory) the rendered report gives it,
# and the provenance of the rule that made its file. report_markdown writes the index of those items
# beside the report (cs336sys.writeup.items); it is read only when a report is made. Report flags are no
# rerun trigger.
REPORT_ITEMS = f"{VIEW}writeup/report_items"
REPORT_INDEX = ReportIndex(os.path.join(REPORT_ITEMS, "index.json"))


for _name, _section in SECTION_INPUTS.items():

    rule:
        name:
            registry.section(_name).rule
        input:
            _section["inputs"],
        output:
            report(
                directory(f"{VIEW}results/sections/{_name}"),
                patterns=["{name}.{ext,csv|png}"],
                caption=os.path.abspath(os.path.join(REPORT_ITEMS, f"{_name}.rst")),
                category=lambda wildcards, s=_name: REPORT_INDEX.category(
                    s, f"{wildcards.name}.{wildcards.ext}", registry.section(s).title
                ),
                subcategory=lambda wildcards, s=_name: REPORT_INDEX.subcategory(
                    s, f"{wildcards.name}.{wildcards.ext}"
                ),
                labels=lambda wildcards, s=_name: REPORT_INDEX.labels(s, f"{wildcards.name}.{wildcards.ext}"),
            ),
        log:
            f"{VIEW}logs/sections/{_name}.log",
        localrule: True
        params:
            section=_name,
            extra=json.dumps(_section["extra"], sort_keys=True),
            code=code_hash(registry.section(_name).module),  # cs336sys.why.entries_of says the same
        shell:
            ANALYSIS


# A name in the registry that no rule file uses is an error, whichever grid runs.
_missing = [name for name in registry.SECTIONS if name not in SECTION_INPUTS]
if _missing:
    raise WorkflowError(f"sections {_missing} are in cs336sys.registry.SECTIONS but no rule file registers them")
_missing = sorted(set(registry.EXPERIMENTS) - DECLARED_EXPERIMENTS)
if _missing:
    raise WorkflowError(f"experiments {_missing} are in cs336sys.registry.EXPERIMENTS but no rule file runs them")


rule report_markdown:
    input:
        sections=[f"{VIEW}results/sections/{s}" for s in registry.SECTIONS],
        # every template: the report's, each section's and its appendix's
        templates=sorted(
            os.path.relpath(p, os.getcwd())
            for p in glob.glob(os.path.join(REPO, "writeup", "templates", "**", "*.j2"), recursive=True)
        ),
    output:
        md=f"{VIEW}writeup/report.md",
        # the results kept across a code change (pins), with their reasons: a file the report links
        earlier_code=f"{VIEW}writeup/earlier_code.md",
        # the report's numbered tables and figures for Snakemake's report (the tables it lays out itself too)
        report_items=report(
            directory(REPORT_ITEMS),
            patterns=["tables/{name}.{ext,csv}"],
            caption=os.path.abspath(os.path.join(REPORT_ITEMS, "report.rst")),
            category=lambda wildcards: REPORT_INDEX.category(None, f"{wildcards.name}.{wildcards.ext}", WRITEUP),
            subcategory=lambda wildcards: REPORT_INDEX.subcategory(None, f"{wildcards.name}.{wildcards.ext}"),
            labels=lambda wildcards: REPORT_INDEX.labels(None, f"{wildcards.name}.{wildcards.ext}"),
        ),
    log:
        f"{VIEW}logs/report/markdown.log",
    localrule: True
    params:
        code=code_hash(*why_lib.REPORT_ENTRIES["report_markdown"]),
        grid=REPORT_GRID,
        # the pins in effect, as the report lists them (a pin spent or added changes the report)
        pins=json.dumps(
            pins_lib.for_report(
                PINS,
                {j.rule: experiment_code(registry.function_of(j.experiment, j.points)) for j in EXPERIMENT_JOBS},
                experiment_of={j.rule: j.experiment for j in EXPERIMENT_JOBS},
            ),
            sort_keys=True,
        ),
        # the templates' folder, the one all of them share (derived from the inputs: no rerun trigger of its own)
        templates=lambda wildcards, input: os.path.commonpath(input.templates),
    shell:
        '"$CS336SYS_PYTHON" -m cs336sys.report md --sections {input.sections:q} --templates {params.templates:q} '
        "--grid {params.grid} --pins {params.pins:q} --out {output.md:q} > {log} 2>&1 && "
        '"$CS336SYS_PYTHON" -m cs336sys.writeup.items {output.md:q} --sections {input.sections:q} '
        "--out {output.report_items:q} >> {log} 2>&1"


rule report_pdf:
    input:
        rules.report_markdown.output.md,
    output:
        report(
            f"{VIEW}writeup/report.pdf",
            caption="../report/writeup.rst",
            category=WRITEUP,
            subcategory="The report",
            labels={"in the writeup": "the whole report", "file": "report.pdf"},
        ),
    log:
        f"{VIEW}logs/report/pdf.log",
    localrule: True
    params:
        code=code_hash(*why_lib.REPORT_ENTRIES["report_pdf"]),
    shell:
        '"$CS336SYS_PYTHON" -m cs336sys.report pdf {input:q} --out {output:q} > {log} 2>&1 && '
        'echo "report: $(pwd)/{output}"'


onstart:
    say_stale_by_code()
    refuse_corrupt_results(workflow, EXPERIMENT_JOBS, REPO)
    refuse_experiments_this_host_cannot_run(workflow, EXPERIMENT_JOBS, DEVICE)


onsuccess:
    if "smoke" in GRID_PARTS:
        print(
            f"smoke grid (CPU pipeline check, not results) written under {os.getcwd()}/: "
            "writeup/report.pdf, results/, logs/",
            file=sys.stderr,
        )
