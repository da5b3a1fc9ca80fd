"""The checkpoint format lives in depthlab.checkpoint (rundir and the trainer both ask it); this is its old import
path, kept for code that imports it from here."""

from depthlab.checkpoint import *  # noqa: F403
from depthlab.checkpoint import (  # noqa: F401
    _sha256,
    load_sharded_state,
    load_trainer_state,
    prune_checkpoints,
    save_checkpoint,
    save_sharded,
    tidy_after_kill,
)
from depthlab.rundir import find_checkpoint, load_checkpoint  # noqa: F401
