"""The prose of docs/results.md: what the measured numbers mean. Numbers themselves come from the result files
(benchmarks/report.py); where prose quotes one, it names the file it comes from."""

INTRO = [
    "# Results",
    "",
    "Every figure below comes from a result file under `benchmarks/results/`, written by the command shown next to "
    "it; this page is generated from those files by `python -m benchmarks.report` (prose in "
    "`benchmarks/findings.py`). CPU figures were measured on a 2-core machine shared with other work: every "
    "comparison is interleaved (contenders timed back to back, order alternating) and reported as a paired ratio "
    "with its spread, which cancels most of the load drift; absolute tokens/s are not comparable across tables.",
]

FINDINGS: dict[str, list[str]] = {}

NOT_DONE: list[str] = []
