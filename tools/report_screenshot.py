"""Open Snakemake's HTML report in headless Chromium with one figure shown, and check that it renders.

    snakemake --report build/report.html
    python tools/report_screenshot.py build/report.html --out build/report-figure.png

The report is a single-page app that opens on its rule graph, and it has no address for a result; so a
copy of the page gets a script that, once loaded, opens the first figure of the writeup as a click on
it would (the report's own `app.setView`). Chromium writes a screenshot of that and, in a second run,
the page's DOM: the check fails unless the screenshot is a PNG of some size and the DOM holds the
figure as an image. Needs `chromium` (Debian's package) on the PATH.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OPEN_FIGURE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var p = %s;
  app.setView({content: "img", contentPath: results[p].data_uri, resultPath: p, navbarMode: "resultinfo"});
}, 1000); });
</script>"""


def first_figure(page: str) -> str:
    """The first PNG among the report's results (the writeup's figures are the only PNGs flagged)."""
    results = json.loads(re.search(r"^\s*var results = (\{.*\});\s*$", page, re.M).group(1))
    figures = [p for p, r in results.items() if r["mime_type"] == "image/png"]
    if not figures:
        raise SystemExit("error: the report holds no figure")
    return figures[0]


def chromium(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("error: chromium is not installed (apt-get install -y chromium)")
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1600,1000", "--virtual-time-budget=15000", *args],
                          capture_output=True, text=True, timeout=180)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", type=Path, help="the HTML report (snakemake --report FILE.html)")
    p.add_argument("--out", type=Path, required=True, help="the screenshot (PNG)")
    a = p.parse_args(argv)
    page = a.report.read_text()
    figure = first_figure(page)
    end = page.rfind("</body>")
    with tempfile.TemporaryDirectory() as tmp:
        opened = Path(tmp) / "report.html"
        opened.write_text(page[:end] + OPEN_FIGURE % json.dumps(figure) + page[end:])
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.unlink(missing_ok=True)
        shot = chromium(f"--screenshot={a.out.resolve()}", opened.as_uri())
        dom = chromium("--dump-dom", opened.as_uri())
    size = a.out.stat().st_size if a.out.exists() else 0
    if size < 10_000 or a.out.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        print(shot.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"error: no screenshot of the report ({a.out}: {size} bytes)")
    if not re.search(r'<img[^>]+src="data:image/png;[^"]*base64,', dom.stdout):
        print(dom.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"error: the report did not show the figure {figure} as an image")
    print(f"report rendered {figure}: screenshot {a.out} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
