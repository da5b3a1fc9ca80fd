"""Studies as library code: one runner, one decision rule, and the pages they write (their statistics are
depthlab.stats, shared with the task-removal analysis).

    verdicts.py  the one decision rule: every word from an interval, with n and the interval beside it
    claims.py    the paper's claims read by that rule from the LNS study's results
    summary.py   runs files -> per-depth, per-rate and per-variant results (differences paired by seed)
    records.py   the runs.jsonl schema: one record per finished cell, appended at once, read back by key
    corpus.py    the study corpus: deduplicated, with a validation and a test split
    probe.py     a trained (or checkpointed) model probed on seeded windows over the whole validation split
    runner.py    rate grid -> each variant's best rate by a declared metric -> seeds, resumable; probes along
                 training at token budgets
    figures.py   the studies' figures
    wording.py   a comparison and a corpus's held-out splits in prose, as every page and study prints them
    script.py    the study scripts' command lines: depthlab's parser, one-line errors
    transfer.py, own_rate.py, muon.py   the depth-transfer, own-rate and Muon studies: their designs, cell order, plans
    page/        docs/results.md and docs/benchmarks.md, rendered from the records and result files
"""
