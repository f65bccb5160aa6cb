# cs336sys: CS336 Assignment 2 (Systems and Parallelism), measured and written up.
#   snakemake -c1 writeup/report.pdf                      # main grid (GPU results), renders the report
#   snakemake -c1 writeup/report.pdf --config grid=smoke  # tiny CPU grid, everything under smoke/
#   snakemake -n --config grid=next                       # the overlay: what is ahead of the committed report
# See README.md. The rule of a result file results/<experiment>/... is registered in
# workflow/rules/<part>.smk; rules.smk turns the registrations into rules.
# `python -m cs336sys.jobs which FILE` names a file's rule and point; `... rule RULE` lists its files.


# The configuration: config.yaml names the grid to run, config/ holds the grids (one file each, top-level
# keys main, next, smoke). Snakemake merges the files key by key and re-applies --configfile/--config after
# each, so the command line wins whichever file it touches. cs336sys.workflow_helpers.CONFIG_FILES lists
# the same files for the tools that read them without Snakemake.
configfile: f"{workflow.basedir}/config.yaml"
configfile: f"{workflow.basedir}/config/main.yaml"
configfile: f"{workflow.basedir}/config/next.yaml"
configfile: f"{workflow.basedir}/config/smoke.yaml"


# what `snakemake --report report.html` says first (every table and figure of the writeup follows)
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


if "smoke" in config["grid"].split("+"):

    workdir: f"{workflow.basedir}/smoke"


include: "workflow/rules/benchmarking.smk"
include: "workflow/rules/precision.smk"
include: "workflow/rules/profiling.smk"
include: "workflow/rules/attention.smk"
include: "workflow/rules/ddp.smk"
include: "workflow/rules/sharding.smk"
include: "workflow/rules/accounting.smk"
include: "workflow/rules/leaderboard.smk"
include: "workflow/rules/rules.smk"


rule all:
    default_target: True
    input:
        f"{VIEW}writeup/report.pdf",
        # the index of the report's tables and figures that Snakemake's report reads (made with report.md)
        REPORT_ITEMS,
