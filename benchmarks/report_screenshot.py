"""An analysis report as a browser shows it: headless Chromium renders report.html in a window of --width x --height
(default 1400 x 900), saves the first screen as a PNG, and fails (exit status 1, one line saying why) when the page
is wider than the window (it would scroll sideways) or the verdict is not on the first screen.

    python -m benchmarks.report_screenshot analysis/smollm2/report.html docs/img/report_smollm2.png

Needs Debian's `chromium` (`apt-get install chromium`). Chromium runs with a new empty profile, no network
services and no sandbox (a container's root), twice: once to measure the page (a script added to a copy of it
writes the page's width and the verdict's place into the DOM Chromium prints), once for the screenshot.
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

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--virtual-time-budget=10000"]
# run at load, once the embedded images are laid out: the page's width and where the first verdict line ends
MEASURE = """<script>window.addEventListener('load', () => {
  const v = document.querySelector('.verdict'), d = document.documentElement;
  const out = {page_width: d.scrollWidth, window_width: window.innerWidth, window_height: window.innerHeight,
               verdict_bottom: v ? v.getBoundingClientRect().bottom : null, verdict: v ? v.textContent : null};
  const p = document.createElement('pre'); p.id = 'depthlab-measure'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise SystemExit("report_screenshot: no Chromium found: apt-get install chromium")


def run(args: list[str], width: int, height: int) -> str:
    with tempfile.TemporaryDirectory() as profile:  # a new empty profile each time
        p = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                            *args], capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise SystemExit(f"report_screenshot: chromium failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


def measure(report: Path, width: int, height: int) -> dict:
    """The page's width and the verdict's place in a window of width x height, as Chromium lays the page out."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / report.name
        page.write_text(report.read_text().replace("</body>", MEASURE + "</body>"))
        dom = run(["--dump-dom", page.as_uri()], width, height)
    m = re.search(r'<pre id="depthlab-measure">(.*?)</pre>', dom, re.S)
    if not m:
        raise SystemExit("report_screenshot: the page was not measured (no load event within the time budget)")
    import html

    return json.loads(html.unescape(m.group(1)))


def check(m: dict, height: int) -> list[str]:
    """What is wrong with the page as measured: empty when it fits and shows its verdict on the first screen."""
    wrong = []
    if m["page_width"] > m["window_width"]:
        wrong.append(f"the page is {m['page_width']} px wide in a window of {m['window_width']} px: it scrolls "
                     "sideways")
    if m["verdict_bottom"] is None:
        wrong.append("the page has no verdict")
    elif m["verdict_bottom"] > height:
        wrong.append(f"the verdict ends {m['verdict_bottom']:.0f} px down, below the first screen of {height} px")
    return wrong


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report_screenshot", description=__doc__.split("\n")[0])
    p.add_argument("report", type=Path, help="an analysis folder's report.html")
    p.add_argument("png", type=Path, help="where the first screen goes")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=900)
    a = p.parse_args(argv)
    report = a.report.resolve()
    m = measure(report, a.width, a.height)
    a.png.parent.mkdir(parents=True, exist_ok=True)
    run([f"--screenshot={a.png.resolve()}", report.as_uri()], a.width, a.height)
    print(f"{a.png}: first screen of {report.name} at {a.width} x {a.height}; page {m['page_width']} px wide, "
          f"verdict ends {m['verdict_bottom']:.0f} px down" if m["verdict_bottom"] is not None else
          f"{a.png}: first screen; no verdict on the page")
    wrong = check(m, a.height)
    for w in wrong:
        print(f"report_screenshot: {w}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
