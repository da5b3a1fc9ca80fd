"""The checkpoint format lives in depthlab.checkpoint (paths, loading and the trainer ask it); this is its old import
path, kept for the code that still imports these names from here (depthlab.hf.importer, tests). New code imports
depthlab.checkpoint, find_checkpoint from depthlab.paths and load_checkpoint from depthlab.loading."""

from depthlab.checkpoint import (  # noqa: F401
    WEIGHTS,
    CorruptCheckpoint,
    list_checkpoints,
    prune_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)
from depthlab.loading import load_checkpoint  # noqa: F401
from depthlab.paths import find_checkpoint  # noqa: F401
