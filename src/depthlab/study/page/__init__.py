"""The two generated pages, rendered from the records and result files (`python -m benchmarks.report`):

    science.py   docs/results.md: does LNS help and why (lns.py: first screen, claims table, sections 1-4;
                 depth.py: the depth study and the ViT study), every word from depthlab.study.claims / verdicts
    systems.py   docs/benchmarks.md: speed, what LNS costs, the GPU run, memory, scale-out
    screen.py    docs/results.md's first screen (the answer in nats and % perplexity under AdamW and Muon, the scale and
                 what it cannot say, one figure, why, the curse, the cost, the real-model panel) and the answer in
                 detail below it (every family each plan declares, by its rule), and the README's results block
    own.py       docs/results.md's own-rate section: grids, the pair at each scheme's own rate, words by plan.json,
                 intervals over test documents and seeds (stats.document_bootstrap), the cells still missing
    muon.py      docs/results.md's Muon section: the same tables under Muon, beside AdamW's own-rate numbers,
                 the best rate's slope on depth and what N = 6's rate costs deeper, words by its plan.json
    rates.py     the best rate against depth by a plan's `rate_exponent` family (own-rate and Muon studies)
    text.py      what every section prints alike: a comparison with n and its interval, a rate grid, a result file

Formatting only: every number is computed from the runs (depthlab.study.summary, claims, verdicts); nothing is
typed by hand.
"""
