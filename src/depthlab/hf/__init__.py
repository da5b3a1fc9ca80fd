"""Hugging Face interop: export to stock Llama, apply schemes to HF models, import HF weights, rework a model's
blocks (the scorers, lm-evaluation-harness's bridge included, are depthlab.eval's; the prune and duplicate commands,
which choose the blocks, are depthlab.surgery's).

    convert.py    weight mapping between depthlab's Transformer and stock HF models, LNS scale folded
    exporter.py   a depthlab checkpoint -> a stock HF model directory (`depthlab export`)
    adapter.py    a LoRA fine-tune's adapters -> a peft adapter directory (`depthlab export --adapter-only`)
    importer.py   an HF Llama-family checkpoint -> a depthlab Transformer / checkpoint (`depthlab import`)
    vit.py        a depthlab ViT <-> stock ViTForImageClassification (export's ViT branch; import_hf_vit)
    pruning.py    remove decoder blocks, or repeat a span of them, and save the stock HF model (the mechanics of
                  `depthlab prune` and `depthlab duplicate`)
    cli.py        `depthlab export | import`

apply_scheme / load_pretrained (LNS on an HF model) live in depthlab.model.apply, below every command, and
are re-exported here as the public API. The public names load on first use, so that `depthlab --help` (which
imports depthlab.hf.cli) stays fast.
"""

_API = {
    "apply_scheme": "depthlab.model.apply", "load_pretrained": "depthlab.model.apply",
    "export": "exporter", "import_hf": "importer",
    "import_hf_vit": "vit", "prune": "pruning", "prune_layers": "pruning",
    "duplicate": "pruning", "duplicate_layers": "pruning",
}
__all__ = list(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'depthlab.hf' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name] if "." in _API[name] else f"depthlab.hf.{_API[name]}"), name)
