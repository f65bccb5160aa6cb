"""The report's numbering, cross-references, PDF conversion and artefact checks, on small documents."""

from __future__ import annotations

import pytest

from cs336sys.writeup import lint, markup, typst
from cs336sys.writeup.markup import answers, figure, ref, table


def doc(body: str) -> str:
    return "# Title\n\n" + body


def test_sections_tables_and_figures_are_numbered_in_order_and_references_resolve_forwards():
    text = doc(f"""## Summary {{: .unnumbered}}

See {ref("later")} and {ref("b")} and {ref("plot")}.

## First {{: #a}}

{table("t1", "One.")}

| x | y (ms) |
|:---|---:|
| a | 1.0 |

### Part {{: #b}}
{answers("p-a", "p-b")}

{figure("plot", "f.png", "A plot.")}

{markup.APPENDIX}

## Extra {{: #later}}

### More

{table("t2", "Two.")}

| x | y (ms) |
|:---|---:|
| b | 2.0 |
""")
    md, d = markup.render(text)
    assert "[Section A](#a-extra)" in md and "[Section 1.1](#11-part)" in md and "[Figure 1](#fig-plot)" in md
    assert "## 1 First" in md and "### 1.1 Part" in md and "## A Extra" in md and "### A.1 More" in md
    assert "## Summary" in md  # unnumbered
    assert '<a id="tbl-t1"></a>**Table 1.** One.' in md and '<a id="tbl-t2"></a>**Table 2.** Two.' in md
    assert d.answered["p-a"].text == "1.1 Part" and d.answered["p-b"].anchor == "11-part"
    assert "\u27e6" not in md and markup.APPENDIX_MARK in md
    assert lint.problems(md) == []


@pytest.mark.parametrize("body, error", [
    (f"## A\n\n{ref('nowhere')}\n", "names no table, figure or heading"),
    (f"## A\n\n{table('x', 'a')}\n\n| a |\n|---|\n| 1 |\n\n{table('x', 'b')}\n\n| a |\n|---|\n| 1 |\n", "used twice"),
    ("## A {: #k}\n\n## B {: #k}\n", "used twice"),
    (f"## A\n{answers('d')}\n\n## B\n{answers('d')}\n", "answered twice"),
    ("## A\n\n#### Too deep\n", "use a caption"),
    ("## A {: .wide}\n", "only {: #key}"),
    ("### Orphan\n", "before any numbered section"),
])
def test_markup_mistakes_are_errors_that_say_what_is_wrong(body, error):
    with pytest.raises(ValueError, match=error):
        markup.render(doc(body))


def test_keys_are_checked_when_written():
    with pytest.raises(ValueError, match="lower case"):
        table("Bad Key", "x")


def test_heading_anchors_are_githubs():
    assert markup.gfm_slug("3.2 Time per step (fp32, ms)") == "32-time-per-step-fp32-ms"
    assert markup.gfm_slug("FSDP × FSDP2: ours/theirs") == "fsdp--fsdp2-ourstheirs"
    md, _ = markup.render(doc("## Same {: .unnumbered}\n\n## Same {: .unnumbered}\n\n## Contents {: .unnumbered}\n\n"
                              + markup.TOC + "\n\n## One\n"))
    assert "- [1 One](#1-one)" in md
    src, _ = typst.to_pandoc(md)
    assert "## Same {#same .unlisted}" in src and "## Same {#same-1 .unlisted}" in src


def test_the_pdf_source_has_real_captions_labels_and_page_numbers_in_the_index():
    text = doc(f"""## Part {{: #part}}
{answers("q-a")}

{figure("f", "plot.png", "What is drawn, on which GPU.")}

{table("t", "A table, ms.")}

| a | b (ms) |
|:---|---:|
| x | 1 |

{markup.APPENDIX}

## Index

{table("index", "Index.")}

{markup.INDEX}
""")
    md, _ = markup.render(text, index=lambda d: "| part | where |\n|:---|:---|\n" + "\n".join(
        f"| {k} | [{h.text}](#{h.anchor}) |" for k, h in d.answered.items()))
    src, title = typst.to_pandoc(md)
    assert title == "Title" and "# Title" not in src
    assert "![**Figure 1.** What is drawn, on which GPU.](plot.png){#fig-f}" in src
    assert "Table: **Table 1.** A table, ms. {#tbl-t}" in src
    assert src.index("| x | 1 |") < src.index("Table: **Table 1.**")
    assert "[1 Part](#1-part), p. `#context counter(page).at(<1-part>).first()`{=typst}" in src
    assert "#pagebreak(weak: true)" in src and "<!--" not in src.replace("<!-- ", "")


def test_a_caption_without_its_table_is_an_error():
    md = '<a id="tbl-x"></a>**Table 1.** Lonely.\n\nJust text.\n'
    with pytest.raises(ValueError, match="not followed by a table"):
        typst.to_pandoc(md)


CAPTION = '<a id="tbl-t"></a>**Table 1.** Caption.\n\n'
INDEXED = "## 7.7 The saving\n\nText.\n\n<!-- index -->\n{}\n<!-- /index -->\n"


@pytest.mark.parametrize("text, finding", [
    ("SDPA chose the backend nan (bf16).", "not a number"),
    ("falls by 0.03 GB (-0% of it)", "minus zero"),
    ("from 51.2× to 51.2× the FLOPs", "two ends are equal"),
    ("between 2026-11-23 and 2026-11-23", "two ends are equal"),
    ("a bucket of 1.04858 MB", "many decimals"),
    ("peak 8.190 GB, and elsewhere 2.0 GiB", "one unit convention"),
    ("the value {{ x }} leaked", "template syntax"),
    ("(no result file yet)", "template syntax"),
    ("## " + "a very long heading " * 5, "a heading of"),
    ("![plot](f.png)\n\nno caption\n", "figure without a numbered caption"),
    ("| a | b |\n|---|---|\n| 1 | 2 |\n", "table without a numbered caption"),
    (CAPTION + "| a | b (ms) |\n|---|---:|\n| x |  |\n| y |  |\n", "empty in every row"),
    (CAPTION + "| a | b (%) |\n|---|---:|\n| x | 0.0 |\n| y | 0.00 |\n", "zero in every row"),
    (CAPTION + "| a | comm. (ms) |\n|---|---:|\n| x | -19.5 |\n| y | 3.0 |\n", "negative value"),
    (CAPTION + "| a | calls |\n|---|---:|\n| x | 84.0 |\n| y | 3.0 |\n", "prints fractions"),
    (CAPTION + "| a | b (ms) |\n|---|---:|\n| x | 1.0 |\n| x | 3.0 |\n", "same label"),
    (CAPTION + "| a | b (ms) |\n|---|---:|\n| x | None |\n| y | 3.0 |\n", "Python value"),
    # issue 60's rendering faults, as the report printed them: a Jinja block tag at a line's end ate the
    # newline, and a raw sympy relation reached the text
    ("([Table 89](#tbl-t) has each rank's figures.)### fsdp_accounting (b): in time? {: #shard-trace}",
     "a heading glued to the text before it"),
    ("([Table 89](#tbl-t) has each rank's figures.)### fsdp_accounting (b): in time? {: #shard-trace}",
     "an attribute list left in the text"),
    ("a sentence.\n### (b) a heading {: #key}", "an attribute list left in the text"),
    ("([Table 88](#tbl-t) has each rank's figures.)**2.7B on 2 ranks.** The model state falls",
     "a paragraph glued to the one before it"),
    ("a ceiling 14.5× lower than bf16's.[Section 9](#9-x) divides by", "a paragraph glued to the one before it"),
    ("our Triton kernels 5.30 ms (0.99×)(the course's Spring 2025 leaderboard", "a paragraph glued to the one before"),
    ("stop at context 1024 (2 points ran out of memory, listed above)and no longer", "a paragraph glued"),
    ("[Figure 12](#fig-x) shows every sequence length.At short sequences one head", "a sentence glued"),
    ("xl 59.3 ms (1.13×, within); 2.7B 95.0 ms (1.09×, within).The FLOPs count attention's", "a sentence glued"),
    ("- **ddp_step**: the gloo DDP tests pass unchanged).- **flash_benchmarking**: made at commits",
     "a list item glued to the text before it"),
    ("the changes, in order: a refactor).2. an option, off by default", "a list item glued to the text before it"),
    ("sympy gives `B >= 25301.7106024295`: the overall batch must be at least", "15 significant digits"),
    ("the model state falls from 50.765 to 25.384 GiB", "5 significant digits"),
    ("$B \\geq 1581.42$ rows", "6 significant digits"),
    # found in review (issue 60): a template's eaten line break glued a unit to its bracket, and an exact
    # match was printed as a zero to six places
    ("the variants' peaks save 10.87 to 21.21 GiB(73% to 81% of the expected).", "glued to the bracket"),
    ("the best any size reaches on this machine(met by construction here", "glued to the bracket"),
    ("The largest relative difference is 0.000000 (Table 114).", "a zero printed to many decimals"),
    (INDEXED.format("[7.7](#77-the-saving) and [7.8](#78-in-time)"), "an index entry whose target is not a rendered"),
    ("see [Table 3](#tbl-nothing) for every point", "a link to an anchor the report does not have"),
])
def test_each_artefact_is_found(text, finding):
    found = lint.problems(text)
    assert any(finding in f for f in found), found


@pytest.mark.parametrize("text", [
    "None of these numbers are results; infinite loops and the info page are fine.",
    "`x = nan` in code, and $O(N^{2})$ in maths, and 2026-11-22 to 2026-11-23.",
    "The H100 80GB HBM3 and 8.0 GiB of memory, 190 GB/s of bandwidth.",
    CAPTION + "| a | change (ms) |\n|---|---:|\n| x | -19.5 |\n| y | 3.0 |\n",
    '<a id="tbl-t"></a>**Table 1.** A negative wait means the rank waited less than the model says.\n\n'
    "| a | wait (ms) |\n|---|---:|\n| x | -1.5 |\n| y | 3.0 |\n",
    CAPTION + "| a | b | c (ms) |\n|---|---|---:|\n| x | 1 | 1.0 |\n| x | 2 | 3.0 |\n",
    # versions, counts, dates and rounded decimals; a table column keeps its digits
    "Python 3.11.7, driver 580.159.04, 3,406,809,600 parameters, 1,234 GiB, 0.001234 s and 12.34 % at the end 12.34.",
    "- **Software:** PyTorch 2.11.0+cu130; CUDA 13.0, driver 570.00; Python 3.12.3.",
    CAPTION + "| a | B (rows) |\n|---|---:|\n| x | 25301.7106 |\n| y | 3.0 |\n",
    CAPTION + "| a | # of GPUs |\n|---|---:|\n| x | 2 |\n| y | 4 |\n",
    "A dash - between words, e.g. this; (a list.) Then text. Issue #60 and C# are no headings.",
    "Runs took 5 ms (s) and 12 % (of the step).",
    CAPTION + "| a | d (×) |\n|---|---:|\n| x | 0.000000 |\n| y | 3.0 |\n",
    "the loop inherited from cs336sys.optim.AdamW (the same state), and `torch.Tensor` objects.",
    CAPTION.strip() + " [Table 1](#tbl-t)\n\n" + INDEXED.format("[7.7](#77-the-saving)"),
])
def test_what_is_not_an_artefact_passes(text):
    assert lint.problems(text) == []


def test_long_names_in_table_cells_may_break_after_their_underscores_and_nothing_else_changes():
    """A table's narrow column: a name of three or more parts joined by `_`, in code or not, gets a break
    opportunity (a zero-width space) after each underscore; link targets and shorter names stay whole."""
    row = ("| ours_sdpa_fused_keep_attention_checkpoint_24 | `ours_fused_keep_attention` | "
           "[4.7](#47-gradient_checkpointing_b_c) | naive_compiled | 2.7B |")
    out = typst.breakable(row)
    assert out.replace("\u200b", "") == row
    assert "ours_\u200bsdpa_\u200bfused_\u200bkeep_\u200battention_\u200bcheckpoint_\u200b24 |" in out
    assert "`ours_\u200bfused_\u200bkeep_\u200battention`" in out
    assert out.count("\u200b") == 9  # the link target and naive_compiled are untouched
    md = ('<a id="tbl-x"></a>**Table 1.** A table.\n\n| config | s |\n|:---|---:|\n'
          '| ours_fused_keep_attention | 1.0 |\n')
    src, _ = typst.to_pandoc(md)
    assert "ours_\u200bfused_\u200bkeep_\u200battention" in src
