# The report: section directories -> writeup/report.md -> writeup/report.pdf (both cheap, local).

SECTIONS = ["benchmarking", "precision", "attention"]
TEMPLATES = os.path.relpath(os.path.join(REPO, "writeup", "templates"), os.getcwd())


rule report_markdown:
    localrule: True
    input:
        sections=[f"results/sections/{s}" for s in SECTIONS],
        templates=sorted(
            os.path.join(TEMPLATES, p)
            for p in ["report.md.j2", "macros.md.j2"] + [f"sections/{s}.md.j2" for s in SECTIONS]
        ),
    output:
        "writeup/report.md",
    params:
        code=code_hash("cs336sys.report"),
    log:
        "logs/report/markdown.log",
    shell:
        '"$CS336SYS_PYTHON" -m cs336sys.report md --sections {input.sections:q} --templates {TEMPLATES:q} '
        "--out {output:q} > {log} 2>&1"


rule report_pdf:
    localrule: True
    input:
        rules.report_markdown.output,
    output:
        "writeup/report.pdf",
    params:
        code=code_hash("cs336sys.report"),
    log:
        "logs/report/pdf.log",
    shell:
        '"$CS336SYS_PYTHON" -m cs336sys.report pdf {input:q} --out {output:q} > {log} 2>&1'
