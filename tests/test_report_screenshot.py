"""benchmarks/report_screenshot.py: a page wider than its window, or with its verdict below the first screen, fails;
with Chromium installed, a real report renders with its verdict on the first screen and no sideways scroll."""

import shutil

import pytest

from benchmarks.report_screenshot import check, main


def test_a_page_that_scrolls_sideways_or_hides_its_verdict_fails():
    fits = {"page_width": 1400, "window_width": 1400, "verdict_bottom": 157.0}
    assert check(fits, 900) == []
    assert "scrolls sideways" in check({**fits, "page_width": 1650}, 900)[0]
    assert "below the first screen" in check({**fits, "verdict_bottom": 1200.0}, 900)[0]
    assert check({**fits, "verdict_bottom": None}, 900) == ["the page has no verdict"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_a_report_with_a_wide_table_fits_its_window(tmp_path):
    from depthlab.analysis.report import CSS, _table

    rows = [{f"a rather long column name {i}": 1.0 for i in range(40)}]  # a table far wider than 1,400 px
    page = tmp_path / "report.html"
    page.write_text(f"<!doctype html><html><head><style>{CSS}</style></head><body><p class='verdict'>verdict: "
                    f"x</p>{_table(rows, list(rows[0]), 'wide')}</body></html>")
    assert main([str(page), str(tmp_path / "shot.png")]) == 0
    assert (tmp_path / "shot.png").stat().st_size > 1000
    page.write_text(page.read_text().replace("<div class='scroll'>", "<div>").replace("max-width:1200px", ""))
    assert main([str(page), str(tmp_path / "shot.png")]) == 1  # without its own scroll box the page scrolls
