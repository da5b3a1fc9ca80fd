"""Switch a Hugging Face decoder (Llama, Mistral, Qwen2, OLMo-2, or any with discoverable blocks) to a scheme.

`lns` multiplies the output of every norm of block l by l^(-p) through a forward hook, so training sees the
explicit constant scale, exactly as in depthlab's own model. The scheme is recorded on the model config
(`depthlab_scheme`, `depthlab_lns_power`) and the model's state dict always holds the *folded* weights
(gamma * l^(-p)): `model.save_pretrained(dir)` therefore writes a stock checkpoint that any Llama engine runs
correctly, and `load_pretrained(dir)` divides the scale back out and re-installs the hooks to continue training.
A patched model can never be saved in a form that silently reloads without its scale (DESIGN.md section 4).

Schemes that rewire the block (post, sandwich, ...) cannot be patched onto an arbitrary HF block; import the
weights into a depthlab Transformer with `import_hf` and train that instead.
"""

from __future__ import annotations

import torch
from torch import nn

from depthlab import UserError
from depthlab.hf.blocks import block_norms, find_blocks

HF_SCHEMES = ("pre", "lns")
_HANDLES = "_depthlab_handles"


def norm_scales(model: nn.Module, lns_power: float) -> list[tuple[str, nn.Module, float]]:
    """(name, norm, l^(-p)) for every norm of every block, l counted from 1."""
    prefix, blocks = find_blocks(model)
    return [(f"{prefix}.{i}.{name}", norm, (i + 1) ** -lns_power)
            for i, block in enumerate(blocks) for name, norm in block_norms(block)]


def _foldable(norm: nn.Module) -> bool:
    """True if norm's output is linear in its weight (and bias), so a constant scale folds into them exactly.
    Checked numerically because some families parametrise the gain differently (Gemma's 1 + w)."""
    if getattr(norm, "weight", None) is None:
        return False
    params = [p for p in (norm.weight, getattr(norm, "bias", None)) if isinstance(p, torch.Tensor)]
    x = torch.randn(2, norm.weight.shape[-1], generator=torch.Generator().manual_seed(0)).to(norm.weight)
    with torch.no_grad():
        want = norm(x) * 0.5
        saved = [p.detach().clone() for p in params]
        for p in params:
            p.mul_(0.5)
        got = norm(x)
        for p, s in zip(params, saved):
            p.copy_(s)
    return torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def _scale_params(norm: nn.Module, factor: float, sd: dict | None = None, prefix: str = "") -> None:
    """Multiply norm's weight and bias by factor, in place or (with sd) in a state dict."""
    for pname in ("weight", "bias"):
        if isinstance(getattr(norm, pname, None), torch.Tensor):
            if sd is None:
                with torch.no_grad():
                    getattr(norm, pname).mul_(factor)
            elif prefix + pname in sd:
                sd[prefix + pname] = sd[prefix + pname] * factor


def _install(norm: nn.Module, scale: float) -> None:
    def forward_hook(module, args, output):
        return output * scale

    def fold_on_save(module, state_dict, prefix, local_metadata):
        _scale_params(module, scale, state_dict, prefix)

    def unfold_on_load(module, state_dict, prefix, *args):
        _scale_params(module, 1 / scale, state_dict, prefix)

    setattr(norm, _HANDLES, [norm.register_forward_hook(forward_hook),
                             norm.register_state_dict_post_hook(fold_on_save),
                             norm.register_load_state_dict_pre_hook(unfold_on_load)])


def _uninstall(model: nn.Module) -> bool:
    found = False
    for module in model.modules():
        for handle in getattr(module, _HANDLES, ()):
            handle.remove()
            found = True
        if hasattr(module, _HANDLES):
            delattr(module, _HANDLES)
    return found


def current_scheme(model: nn.Module) -> str:
    return getattr(model.config, "depthlab_scheme", None) or "pre"


def apply_scheme(model: nn.Module, scheme: str = "lns", lns_power: float = 0.5, *, weights_folded: bool = False):
    """Patch `model` in place to train under `scheme` (see HF_SCHEMES); returns the model.

    The weights are taken as they are: switching a pretrained Pre-LN model to lns changes its function, which is
    the point of continued pretraining with LNS. weights_folded=True says the norm weights already hold the scale
    (a checkpoint saved by a patched model); they are divided by it first, so the function is kept.
    """
    from depthlab.model.schemes import SCHEMES

    if scheme not in HF_SCHEMES:
        why = ("it rewires the block (where the norms and residual adds sit), which cannot be patched onto an "
               "arbitrary HF block; import the weights with depthlab.hf.import_hf and train a depthlab Transformer "
               "with that scheme") if scheme in SCHEMES else f"it is not a scheme (valid: {', '.join(SCHEMES)})"
        raise UserError(f"cannot apply scheme {scheme!r} to a Hugging Face model: {why}")
    if lns_power <= 0:
        raise UserError(f"lns_power must be positive, got {lns_power}")
    installed = _uninstall(model)
    if not installed and not weights_folded and current_scheme(model) != "pre":
        raise UserError(f"this model was saved with depthlab scheme {current_scheme(model)!r}: its norm weights hold "
                        "the folded scale; load it with depthlab.hf.load_pretrained to continue training")
    if scheme == "lns":
        scales = norm_scales(model, lns_power)
        bad = [name for name, norm, _ in scales if not _foldable(norm)]
        if bad:
            raise UserError(f"cannot apply lns to {type(model).__name__}: norm {bad[0]} does not scale linearly with "
                            "its weight, so the scale could not be folded into a stock checkpoint")
        for _, norm, scale in scales:
            if weights_folded:
                _scale_params(norm, 1 / scale)
            _install(norm, scale)
        model.config.depthlab_scheme, model.config.depthlab_lns_power = "lns", lns_power
    else:
        for attr in ("depthlab_scheme", "depthlab_lns_power"):
            if hasattr(model.config, attr):
                delattr(model.config, attr)
    return model


def load_pretrained(path, **kwargs):
    """`AutoModelForCausalLM.from_pretrained`, plus the depthlab scheme recorded in its config, ready to train."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    scheme = current_scheme(model)
    if scheme != "pre":
        apply_scheme(model, scheme, getattr(model.config, "depthlab_lns_power", 0.5), weights_folded=True)
    return model
