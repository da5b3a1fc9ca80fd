"""Studies as library code: one runner, one statistics module, one verdict vocabulary.

    stats.py     mean ± std, paired differences, bootstrap intervals, binomial standard errors, spreads as text
    verdicts.py  the one vocabulary every study reports in, and the rules that choose a word
    records.py   the runs.jsonl schema: one record per finished cell, appended at once, read back by key
    probe.py     a trained (or checkpointed) model probed on seeded windows over the whole validation split
    runner.py    rate grid -> each variant's best rate by a declared metric -> seeds, resumable; probes along
                 training at token budgets
"""
