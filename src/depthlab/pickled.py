"""Files in PyTorch's pickle format (a checkpoint's trainer.pt, an HF directory's pytorch_model.bin) are read with
`torch.load(weights_only=True)`, which unpickles tensors and plain containers only: anything else in the file
(a class, a function) would run code from it. What it refuses is a one-line UserError that names the file and
what it asked for, not PyTorch's 40-line advice on how to load it anyway."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

from depthlab import UserError


def refusal(path: str | Path, error: pickle.UnpicklingError) -> UserError:
    """The one line for a pickle that weights_only refused (`error`, torch.load's); `path` the file, or the model
    directory (transformers' load does not say which file it read) whose pickles are then named."""
    path = Path(path)
    if path.is_dir():
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        path = path / pickles[0] if len(pickles) == 1 else f"{path} ({', '.join(pickles) or 'a pickle'})"
    text = str(error)
    asked = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    what = f"it holds {asked.group(1)}" if asked else next(
        (line.strip() for line in text.splitlines() if "WeightsUnpickler error" in line), "it holds other objects")
    return UserError(f"{path} is a pickle that depthlab will not load: {what.removeprefix('WeightsUnpickler error: ')}"
                     ", not only tensors, and unpickling it would run code from the file; save the weights as "
                     "safetensors (or load it yourself if you trust its source)")


def load_tensors(path: str | Path, **kwargs):
    """torch.load of a pickle that may hold tensors and plain containers only; a refusal in one line."""
    import torch

    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        raise refusal(path, e) from None
