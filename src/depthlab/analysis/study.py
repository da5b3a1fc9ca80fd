"""The old import path of depthlab.analysis.analyze (the whole-model and layer-by-layer analysis runs), kept for
code that imports `analyze` from here; the module was renamed for what it holds."""

from depthlab.analysis.analyze import (  # noqa: F401
    Options,
    analyze,
    analyze_layerwise,
    classifier_notes,
    heatmap_blocks,
    observe_states,
    summary_lines,
)
