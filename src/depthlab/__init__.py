"""depthlab: train and diagnose LLMs whose every layer counts (LayerNorm Scaling and friends)."""

__version__ = "0.1.0"


class UserError(Exception):
    """A mistake the user can fix (bad flag, bad file, bad config). The CLI prints it in one line, exit 2."""
