"""`depthlab export RUN OUT --adapter-only`: a LoRA fine-tune's adapters as a peft adapter directory.

OUT holds adapter_config.json and adapter_model.safetensors, the files `peft.PeftModel.from_pretrained(model, OUT)`
reads, for `model` the stock export of the run's base (`depthlab export BASE`); the adapted model's logits come
back. (`depthlab export RUN OUT` without --adapter-only merges the adapters into a stock checkpoint instead.)

The stock export folds a scheme's constants and gains into the weights (depthlab.hf.exporter): LNS's 1/sqrt(l)
into the norm weight, or for OLMo-1's weightless norm into the columns of q, k, v, gate and up; LayerScale's and
SkipInit's gains into the rows of o_proj and down_proj. An adapter must follow the weight it adds to, B A -> diag(r)
B A diag(c), so its factors are exported as diag(r) B and A diag(c). The exporter is the one place that knows
the folds: r and c are read off it, by exporting the base with each adapted weight set to ones (r c^T) and checked
on a second export with random weights, so any fold that is not such a scaling is refused, not mis-exported.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.checkpoint import CONFIG, load_verified, load_weights, save_weights
from depthlab.config import Config
from depthlab.hf.convert import from_hf_state_dict
from depthlab.hf.exporter import hf_weights_and_config
from depthlab.model import build_model
from depthlab.model.lora import adapters, base_weights, peft_config, require_peft
from depthlab.ownership import writing
from depthlab.paths import EXPORT_INFO, find_checkpoint

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def is_adapter_export(path: Path) -> bool:
    """An adapter directory `export --adapter-only` wrote: the kind it may replace."""
    return (path / ADAPTER_CONFIG).is_file() and (path / EXPORT_INFO).is_file()


def export_adapter(src: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    ckpt = find_checkpoint(src)
    cfg = Config.load(ckpt / CONFIG)
    if not cfg.train.lora.rank:
        raise UserError(f"{ckpt} is not a LoRA fine-tune (no adapters: every weight was trained); --adapter-only "
                        "exports a run of `depthlab finetune --lora`; export this one without it")
    require_peft()
    meta = load_verified(ckpt)
    state = load_weights(ckpt)
    pairs = adapters(state)
    base = build_model(cfg.model, init=False)
    base.load_state_dict(base_weights(state), strict=False)  # a verified checkpoint; a tied head is the embedding
    folds = _folds(base, list(pairs))
    weights = {}
    for module, (a, b) in pairs.items():
        hf_module, rows, cols = folds[module]
        weights[f"base_model.model.{hf_module}.lora_A.weight"] = (a * cols).contiguous()
        weights[f"base_model.model.{hf_module}.lora_B.weight"] = (b * rows[:, None]).contiguous()
    hf_targets = sorted({folds[m][0].rsplit(".", 1)[-1] for m in pairs})  # q_proj ...: HF Llama's names too
    config = peft_config(cfg.train.lora, hf_targets)
    config.base_model_name_or_path, config.task_type = cfg.train.init_from, "CAUSAL_LM"
    with writing(out_dir, is_adapter_export, "export --adapter-only", overwrite, [ckpt]) as tmp:
        config.save_pretrained(str(tmp))
        save_weights(weights, tmp / ADAPTER_WEIGHTS, {"format": "pt"})
        info = {"source": str(ckpt), "step": meta.step, "scheme": cfg.model.norm_scheme,
                "base": cfg.train.init_from, "note": "a peft LoRA adapter for the stock export of the base "
                "(`depthlab export BASE`): PeftModel.from_pretrained(that model, this directory)"}
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return Path(out_dir)


@torch.no_grad()
def _folds(model, modules: list[str]) -> dict[str, tuple[str, torch.Tensor, torch.Tensor]]:
    """{module: (its HF name, r, c)}: the stock export writes the module's weight W as diag(r) W diag(c)."""
    weights = {m: model.get_submodule(m).weight for m in modules}
    kept = {m: w.clone() for m, w in weights.items()}
    g = torch.Generator().manual_seed(0)
    probe = {m: torch.rand(w.shape, generator=g) + 0.5 for m, w in weights.items()}
    try:
        for w in weights.values():
            w.fill_(1.0)
        ones, _ = hf_weights_and_config(model)
        for m, w in weights.items():
            w.copy_(probe[m])
        probed, _ = hf_weights_and_config(model)
    finally:
        for m, w in weights.items():
            w.copy_(kept[m])
    ours = {next(iter(from_hf_state_dict({k: torch.empty(0)}, model.cfg))): k for k in ones}
    out = {}
    for m in modules:
        key = ours[m + ".weight"]
        rank1 = ones[key]  # r c^T
        i, j = divmod(int(rank1.abs().argmax()), rank1.shape[1])
        rows, cols = (rank1[:, j], rank1[i] / rank1[i, j]) if rank1[i, j] != 0 else \
            (torch.zeros(rank1.shape[0]), torch.ones(rank1.shape[1]))
        if not torch.allclose(probed[key], rows[:, None] * probe[m] * cols, rtol=1e-5, atol=1e-7):
            raise UserError(f"cannot export the adapter on {m}: the stock export changes its weight in a way "
                            "an adapter cannot follow (not a row and column scaling); export the merged model "
                            "without --adapter-only")
        out[m] = (key.removesuffix(".weight"), rows, cols)
    return out
