"""Hugging Face interop: export to stock Llama, apply schemes to HF models, import HF weights, prune, and
multiple-choice evaluation.

The public names load on first use, so that `depthlab --help` (which imports depthlab.hf.cli) stays fast.
"""

_API = {
    "apply_scheme": "apply", "load_pretrained": "apply", "export": "exporter", "import_hf": "importer",
    "evaluate_tasks": "mc_eval", "prune": "pruning", "prune_layers": "pruning",
}
__all__ = list(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'depthlab.hf' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"depthlab.hf.{_API[name]}"), name)
