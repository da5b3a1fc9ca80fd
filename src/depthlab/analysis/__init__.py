"""Curse-of-depth diagnostics for any causal LM, and for depthlab ViTs.

    layers.py       discover blocks / final norm / head of a depthlab or HF model; capture and replay blocks
    calibration.py  calibration text -> batches with a mask of real tokens; a ViT's validation images
    removal.py      layer removal from cached prefix activations
    jacobian.py     block and output Jacobians by random projections, one token's block Jacobian
    analyze.py      the analysis runs: `analyze` (whole-model mode) and `analyze_layerwise`
    results.py      what a result is: its kind (a language model's or an image classifier's), read by the report
    layerwise.py    the one-block skeleton for layer-by-layer mode
    report.py       metrics.json, CSV, PNG plots, self-contained HTML
    run.py, cli.py  `depthlab analyze | compare | theory`
"""
