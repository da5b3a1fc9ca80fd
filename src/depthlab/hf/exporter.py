"""Export a depthlab checkpoint as a stock Hugging Face `LlamaForCausalLM` directory.

The directory loads with `AutoModelForCausalLM.from_pretrained(dir)`: no depthlab, no remote code. Whatever is a
constant or per-channel gain folds exactly into a stock weight, so the exported model costs nothing extra:

    lns          Norm_g(x) / sqrt(l)     = Norm_{g / sqrt(l)}(x)        (norm weight)
    layerscale   h + diag(lam) W_o y     = h + (diag(lam) W_o) y        (rows of o_proj / down_proj)
    skipinit     h + alpha W_o y         = h + (alpha W_o) y

The other schemes are refused, each with its reason (REFUSED): they change where a norm or a residual add sits,
which a stock Llama block cannot express. We chose refusal over a remote-code modeling file: a second copy of the
model package would drift from the first, and engines that run Llama (vLLM, llama.cpp, lm-eval's `hf`) would still
not run it. Such checkpoints stay depthlab checkpoints (`depthlab eval` works on them directly).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.data.tokenizer import EOT
from depthlab.hf.convert import hf_llama_config_dict, to_hf_llama_state_dict
from depthlab.model import Transformer

_REWIRED = "stock Llama has exactly one pre-norm per branch and a plain residual add"
REFUSED = {
    "post": f"the norm sits on the residual stream after the add; {_REWIRED}",
    "deepnorm": f"the norm sits after the add and the residual is weighted by alpha; {_REWIRED}",
    "mixln": f"its first blocks are Post-LN (norm after the add); {_REWIRED}",
    "sandwich": f"it adds a norm on each branch output; {_REWIRED}",
    "peri": f"it adds a norm on each branch output and one on the embedding; {_REWIRED}",
    "reordered": f"its norms sit on the branch outputs, not the inputs (OLMo-2's own layout also adds q/k norms); "
                 f"{_REWIRED}",
    "rezero": "its blocks have no norm, and a Llama RMSNorm cannot be made the identity",
    "dyt": "DyT (tanh) replaces RMSNorm, which stock Llama cannot express",
}
GPAS_REFUSAL = ("gpas scales the residual stream after every add (and RMSNorm's epsilon makes that scale not exactly "
                "foldable); stock Llama's residual add is plain")
_BRANCH_OUTPUTS = {"attn_gain": "attn.o_proj", "mlp_gain": "mlp.down_proj"}


def is_depthlab_path(path: str | Path) -> bool:
    """A depthlab checkpoint or run directory (as opposed to a Hugging Face model directory)."""
    path = Path(path)
    return (path / "meta.json").is_file() or (path / "checkpoints").is_dir()


@torch.no_grad()
def stock_llama_model(model: Transformer) -> Transformer:
    """An equivalent `pre`/`lns` model: LayerScale / SkipInit gains folded into the output projections.
    Refuses (UserError) the schemes stock Llama cannot express."""
    cfg = model.cfg
    if cfg.gpas:
        raise UserError(f"cannot export {cfg.norm_scheme} + gpas as a stock Llama checkpoint: {GPAS_REFUSAL}")
    if cfg.norm_scheme in REFUSED:
        raise UserError(f"cannot export scheme {cfg.norm_scheme!r} as a stock Llama checkpoint: "
                        f"{REFUSED[cfg.norm_scheme]}")
    if cfg.norm_scheme not in ("layerscale", "skipinit"):
        return model
    from dataclasses import replace

    plain = Transformer(replace(cfg, norm_scheme="pre"), init=False)
    state = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[-1] not in _BRANCH_OUTPUTS}
    plain.load_state_dict(state, strict=True)
    for ours, layer in zip(model.layers, plain.layers):
        for gain, proj in _BRANCH_OUTPUTS.items():
            layer.get_submodule(proj).weight.mul_(getattr(ours, gain).reshape(-1, 1))  # rows = output channels
    return plain


def hf_tokenizer(tok):
    """Our `tokenizers.Tokenizer` as a transformers tokenizer; <|endoftext|> is both document start and end."""
    from transformers import PreTrainedTokenizerFast

    special = {"bos_token": EOT, "eos_token": EOT} if tok.token_to_id(EOT) is not None else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def export(src: str | Path, out_dir: str | Path) -> Path:
    """Write a stock LlamaForCausalLM directory for a depthlab checkpoint or run (its newest checkpoint)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from depthlab.data.tokenizer import load_tokenizer
    from depthlab.train.checkpoint import TOKENIZER, find_checkpoint, load_checkpoint

    ckpt = find_checkpoint(src)
    model, cfg, meta = load_checkpoint(ckpt)
    state = to_hf_llama_state_dict(stock_llama_model(model))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = hf_tokenizer(load_tokenizer(ckpt / TOKENIZER)) if (ckpt / TOKENIZER).is_file() else None
    fields = {k: v for k, v in hf_llama_config_dict(cfg.model).items() if k not in ("architectures", "torch_dtype")}
    hf_cfg = LlamaConfig(**fields, bos_token_id=getattr(tok, "bos_token_id", None),
                         eos_token_id=getattr(tok, "eos_token_id", None))
    hf_cfg.architectures = ["LlamaForCausalLM"]
    hf_cfg.dtype = "float32"
    hf_cfg.save_pretrained(out)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if tok is not None:
        tok.save_pretrained(out)
    provenance = {"source": str(ckpt), "scheme": cfg.model.norm_scheme, "step": meta.get("step"),
                  "lns_folded": cfg.model.norm_scheme == "lns",
                  "note": "norm scales are folded into the weights: load as a plain LlamaForCausalLM"}
    (out / "depthlab_export.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return out

