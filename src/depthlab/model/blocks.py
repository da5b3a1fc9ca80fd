"""Find the decoder blocks of a Hugging Face model, and the norms of each block, without knowing its family.

A decoder block list is the longest `nn.ModuleList` whose entries share one class (and, where norms are
needed, own a norm as a direct child). Block norms are the direct children whose class is a norm (RMSNorm /
LayerNorm by any name): Llama's `input_layernorm` / `post_attention_layernorm`, OLMo-2's
`post_attention_layernorm` / `post_feedforward_layernorm`.
Norms nested deeper (OLMo-2's `self_attn.q_norm`, `k_norm`) act on queries and keys, not on the residual branch,
and are left out.
"""

from __future__ import annotations

from torch import nn

from depthlab import UserError


def is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.lower().endswith("norm")


def block_norms(block: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, child) for name, child in block.named_children() if is_norm(child)]


def find_blocks(model: nn.Module, with_norms: bool = False) -> tuple[str, nn.ModuleList]:
    """(qualified name, module list) of the decoder blocks: the longest ModuleList whose entries share one class
    and hold parameters (and, with_norms, own a norm as a direct child)."""
    candidates = [(name, m) for name, m in model.named_modules()
                  if isinstance(m, nn.ModuleList) and len(m) > 0 and len({type(b) for b in m}) == 1
                  and any(True for _ in m[0].parameters()) and (not with_norms or block_norms(m[0]))]
    if not candidates:
        lists = [f"{n} ({len(m)} x {', '.join(sorted({type(x).__name__ for x in m}))})"
                 for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
        need = "repeated blocks" + (" with a norm layer as a direct child" if with_norms else "")
        raise UserError(f"cannot find the decoder blocks of {type(model).__name__}: no list of {need}; "
                        f"module lists found: {', '.join(lists) or 'none'}")
    return max(candidates, key=lambda c: len(c[1]))


def set_blocks(model: nn.Module, path: str, blocks) -> None:
    """Make `blocks` the model's block list (at `path`, as `find_blocks` names it), each attention's `layer_idx`
    (its place in the KV cache) renumbered to its new position: what removing blocks from a model takes. A
    ModuleList is put in place as it is (a model's own list, restored)."""
    for new, block in enumerate(blocks):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new
    parent, _, attr = path.rpartition(".")
    setattr(model.get_submodule(parent), attr, blocks if isinstance(blocks, nn.ModuleList) else nn.ModuleList(blocks))
