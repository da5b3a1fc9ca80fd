"""Switch a Hugging Face decoder (Llama, Mistral, Qwen2, OLMo-2, or any with discoverable blocks) to a scheme.

`lns` multiplies the output of every norm of block l by l^(-p) through a forward hook, so training sees the
explicit constant scale, exactly as in depthlab's own model. The scheme is recorded on the model config
(`depthlab_scheme`, `depthlab_lns_power`, and each block's scale in `depthlab_layer_scales`) and the model's state
dict always holds the *folded* weights (gamma * l^(-p)): `model.save_pretrained(dir)` therefore writes a stock
checkpoint that any engine for that family runs correctly, and `load_pretrained(dir)` divides the scale back out
and re-installs the hooks to continue training.
A patched model can never be saved in a form that silently reloads without its scale (docs/method.md section 4).

Which schemes can be patched is declared on each scheme (`hf_patchable`, depthlab.model.schemes), and the scale
of block l is the scheme's own `norm_scale`. Schemes that rewire the block (post, sandwich, ...) cannot be patched
onto an arbitrary HF block; import the weights into a depthlab Transformer with `import_hf` and train that instead.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from depthlab import UserError
from depthlab.model.blocks import block_norms, find_blocks
from depthlab.pickled import refusal

_HANDLES = "_depthlab_handles"


def block_scales(model: nn.Module, layer_scales: list[float]) -> list[tuple[str, nn.Module, float]]:
    """(name, norm, scale of its block) for every norm of every block."""
    prefix, blocks = find_blocks(model, with_norms=True)
    if len(layer_scales) != len(blocks):
        raise UserError(f"{len(layer_scales)} recorded layer scales for {len(blocks)} blocks")
    return [(f"{prefix}.{i}.{name}", norm, layer_scales[i])
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


_RECORD = ("depthlab_scheme", "depthlab_lns_power", "depthlab_layer_scales")


def current_scheme(model: nn.Module) -> str:
    return getattr(model.config, "depthlab_scheme", None) or "pre"


def apply_scheme(model: nn.Module, scheme: str = "lns", lns_power: float = 0.5):
    """Patch `model` in place to train under `scheme` (one whose class says `hf_patchable`); returns the model.

    The weights are taken as they are: switching a pretrained Pre-LN model to lns changes its function, which is
    the point of continued pretraining with LNS. Block l (from 1) gets the scheme's norm scale, l^(-lns_power)
    for lns.
    """
    from depthlab.config import ModelConfig
    from depthlab.model.schemes import SCHEMES

    if scheme not in SCHEMES or not SCHEMES[scheme].hf_patchable:
        why = ("it rewires the block (where the norms and residual adds sit), which cannot be patched onto an "
               "arbitrary HF block; import the weights with depthlab.hf.import_hf and train a depthlab Transformer "
               "with that scheme") if scheme in SCHEMES else f"it is not a scheme (valid: {', '.join(SCHEMES)})"
        raise UserError(f"cannot apply scheme {scheme!r} to a Hugging Face model: {why}")
    if lns_power <= 0:
        raise UserError(f"lns_power must be positive, got {lns_power}")
    if not _uninstall(model) and current_scheme(model) != "pre":
        raise UserError(f"this model was saved with depthlab scheme {current_scheme(model)!r}: its norm weights hold "
                        "the folded scale; load it with depthlab.hf.load_pretrained to continue training")
    for attr in _RECORD:
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    n = len(find_blocks(model, with_norms=True)[1])
    cfg = ModelConfig(norm_scheme=scheme, n_layers=n, lns_power=lns_power)
    scales = [SCHEMES[scheme].norm_scale(cfg, l) for l in range(1, n + 1)]
    if any(s != 1.0 for s in scales):  # pre: nothing to patch and nothing to record
        _patch(model, scales, weights_folded=False)
        model.config.depthlab_scheme, model.config.depthlab_lns_power = scheme, lns_power
    return model


def _patch(model: nn.Module, layer_scales: list[float], weights_folded: bool) -> None:
    """Install the scale hooks; with weights_folded, first divide the scale out of the norm weights.
    The per-layer scales are recorded (not just the power): pruning keeps each kept layer's own scale."""
    scales = block_scales(model, layer_scales)
    weightless = [name for name, norm, _ in scales if getattr(norm, "weight", None) is None]
    if weightless:
        raise UserError(f"cannot apply lns to {type(model).__name__}: norm {weightless[0]} has no weight to fold the "
                        "scale into (OLMo-1's LayerNorm); import it instead, `depthlab import HF_DIR CKPT --scheme "
                        "lns`, whose export folds the scale into the layers reading the norm")
    bad = [name for name, norm, _ in scales if not _foldable(norm)]
    if bad:
        raise UserError(f"cannot apply lns to {type(model).__name__}: norm {bad[0]} does not scale linearly with "
                        "its weight, so the scale could not be folded into a stock checkpoint")
    for _, norm, scale in scales:
        if weights_folded:
            _scale_params(norm, 1 / scale)
        _install(norm, scale)
    model.config.depthlab_layer_scales = list(layer_scales)


def load_pretrained(path, **kwargs):
    """`AutoModelForCausalLM.from_pretrained`, plus the depthlab scheme recorded in its config, ready to train.
    A plain HF directory loads as plain HF. What it reads is verified (verify_loaded): every weight the config
    implies is in the files with its shape, none is left over, all are finite; else one UserError line."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the load report is replaced by our own check below
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                           ignore_mismatched_sizes=True, **kwargs)
    except pickle.UnpicklingError as e:  # a pytorch_model.bin that weights_only refuses: one line, not 40
        raise refusal(path, e) from None
    except (OSError, ValueError, RuntimeError, KeyError, EOFError) + _safetensors_errors() as e:
        why = one_line(e) if Path(path).exists() else "no such directory (and not in the local Hugging Face cache)"
        raise UserError(f"cannot load Hugging Face model {path}: {why}") from None
    finally:
        logging.set_verbosity(verbosity)
    verify_loaded(model, info, path)
    if current_scheme(model) != "pre":
        _patch(model, model.config.depthlab_layer_scales, weights_folded=True)
    return model


def _safetensors_errors() -> tuple:
    try:
        from safetensors import SafetensorError
    except ImportError:
        return ()
    return (SafetensorError,)


def one_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _few(keys, n: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def verify_loaded(model: nn.Module, info: dict, path) -> None:
    """UserError naming the first few keys when the weight files and config.json disagree (transformers would
    initialise missing or wrongly shaped weights at random and drop extra ones, with only a log message), or when
    a weight holds NaN or inf."""
    where = f"{path}: the weights do not fit its config.json"
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        shown = "; ".join(f"{k} is {tuple(theirs)} in the files, {tuple(ours)} by the config"
                          for k, theirs, ours in sorted(mismatched, key=lambda m: m[0])[:2])
        raise UserError(f"{where} ({len(mismatched)} wrongly shaped: {shown}; is config.json (hidden_size, "
                        "intermediate_size, heads) the one saved with these weights?)")
    missing, unexpected = info.get("missing_keys") or [], info.get("unexpected_keys") or []
    if missing or unexpected:
        parts = ([f"missing {_few(missing)}"] if missing else []) + \
            ([f"left over {_few(unexpected)}"] if unexpected else [])
        layers = getattr(model.config, "num_hidden_layers", None)
        hint = f"; config.json says num_hidden_layers={layers}" if layers is not None else ""
        raise UserError(f"{where}: {'; '.join(parts)}{hint}")
    state = model.state_dict()
    unread = [name for name, t in state.items() if t.is_meta]
    if unread:  # no values to check, and any use of them fails deep inside torch
        raise UserError(f"{path}: {len(unread)} weight(s) were never read from the files (left on the meta "
                        f"device): {_few(unread)}")
    bad = [name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise UserError(f"{path}: {len(bad)} weight(s) hold NaN or inf: {_few(bad)}")
