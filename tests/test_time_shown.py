"""Time you can see: every plain progress line says the time elapsed and, once something is counted, the time left;
a command's declared phases read "phase k of n"; `train` names its run directory first."""

import time

from depthlab import progress
from depthlab.progress import clock, eta_text, numbered, plan_phases, unnumbered


def test_the_estimate_reads_the_rate_so_far():
    start = time.monotonic() - 60
    assert eta_text(start, 0, 0, 10) == "elapsed 1:00"  # nothing counted yet: no estimate
    assert eta_text(start, 0, 3, 6) == "elapsed 1:00, about 1:00 left"
    assert eta_text(start, 2, 4, 6).endswith("about 1:00 left")  # the rate since the run resumed at 2
    assert (clock(42), clock(187), clock(3723)) == ("42 s", "3:07", "1:02:03")


def test_declared_phases_are_numbered_and_others_are_not():
    plan_phases("analyze: ", ["loading the model", "metrics", "writing the report"])
    try:
        assert numbered("analyze: metrics") == "analyze (phase 2 of 3): metrics"
        assert numbered("analyze: something else") == "analyze: something else"
        with unnumbered():
            assert numbered("analyze: metrics") == "analyze: metrics"
        assert numbered("analyze: metrics").startswith("analyze (phase 2")
    finally:
        plan_phases("", [])


def test_a_plain_line_says_what_is_left(capsys, monkeypatch):
    monkeypatch.setattr(progress, "START_S", 0.0)
    bar = progress.PlainProgress(desc="eval", total=4, unit="batch")
    bar.update(2)
    bar._say("")
    bar.close()
    first = capsys.readouterr().err.splitlines()[-2]
    assert first.startswith("depthlab: eval: ") and ", 2/4 batch, about " in first and first.endswith(" left")
