"""Depth parameterizations: how each residual branch is scaled with the depth L, and what that asks of Adam.

    depth_alpha (alpha)   every branch times m^(-alpha), m = L / depth_base          CompleteP (alpha = 1),
                          block parameters learn at lr m^(alpha - 1), eps m^(-alpha)  depth-muP (alpha = 1/2)
    branch_scale          every branch times 1/L, 1/sqrt(L) or 1/sqrt(l)               ProRes's static ablations
    prores_steps (T)      block l's branches times a(l, t) = min(1, t / (l T))        ProRes (arXiv 2603.05369)
    norm_gain_init        uniform: every block's norm gains start at one constant c   LNS's control

The multipliers are constants of the residual add (depthlab.model.parts.Residual) and fold into the branch's output
projection at export; the ProRes ramp is a buffer the optimizer advances after each step (train.optim), kept in
checkpoints so that a run resumes, evaluates and exports at the point of the warm-up where it stopped.
Formulas, sources and when to use which: docs/method.md section 5.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from depthlab.config import ModelConfig

BRANCH_SCALES = {  # model.branch_scale: block l's branch multiplier in a model of L blocks
    "none": lambda l, L: 1.0,
    "1/L": lambda l, L: 1.0 / L,
    "1/sqrtL": lambda l, L: L ** -0.5,
    "1/sqrtl": lambda l, L: l ** -0.5,
}


def depth_ratio(cfg: ModelConfig) -> float:
    """m = L / L_base; 1 when depth_alpha is off."""
    return cfg.n_layers / cfg.depth_base if cfg.depth_alpha else 1.0


def branch_multiplier(cfg: ModelConfig, layer_id: int) -> float:
    """The constant multiplier on block `layer_id`'s branch outputs: m^(-alpha) times the static branch scale."""
    return depth_ratio(cfg) ** -cfg.depth_alpha * BRANCH_SCALES[cfg.branch_scale](layer_id, cfg.n_layers)


def block_lr_scale(cfg: ModelConfig) -> float:
    """Under depth_alpha, every block parameter's learning rate is lr m^(alpha - 1) (Adam's update is invariant to
    the gradient's scale, so the branch's m^(-alpha) alone would leave each block's contribution m^(-alpha) times
    a fixed-size step; the rule makes the per-block update of the stream m^(-1), the sum over L blocks depth-free)."""
    return depth_ratio(cfg) ** (cfg.depth_alpha - 1)


def block_eps_scale(cfg: ModelConfig) -> float:
    """Adam's epsilon for block parameters times m^(-alpha): their gradients shrink by m^(-alpha), and an epsilon
    that did not would damp deep models' updates more."""
    return depth_ratio(cfg) ** -cfg.depth_alpha


def prores_ramp(layer_id: int, step: int, steps_per_block: int) -> float:
    """ProRes's linear warm-up a(l, t) = min(1, t / (l T)): 0 at step 0, block l at 1 from step l T on."""
    return min(1.0, step / (layer_id * steps_per_block))


def uniform_gain(cfg: ModelConfig) -> float:
    """norm_gain_init=uniform's constant: norm_gain_const, or the mean over l of l^(-p), so that the model's total
    damping matches LNS's while its depth profile is flat."""
    if cfg.norm_gain_const:
        return cfg.norm_gain_const
    return sum(l ** -cfg.lns_power for l in range(1, cfg.n_layers + 1)) / cfg.n_layers


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's blocks (modules with a 1-based layer_id), through DDP's and torch.compile's wrappers."""
    return [m for m in model.modules() if hasattr(m, "layer_id")]


@torch.no_grad()
def set_prores_step(model: nn.Module, step: int) -> None:
    """Set every block's ProRes ramp to a(l, step); a no-op for a model without ProRes."""
    for block in blocks(model):
        for add in (block.attn_add, block.mlp_add):
            if add.ramp is not None:
                add.ramp.fill_(prores_ramp(block.layer_id, step, block.prores_steps))


def is_off(cfg: ModelConfig) -> bool:
    """No depth option is set: the model is today's Pre-LN/LNS/... as it was."""
    return not cfg.depth_alpha and not cfg.prores_steps and cfg.branch_scale == "none"


def check(cfg: ModelConfig, refusal: str, require) -> None:
    """The depth options' ranges, and the scheme's refusal of depth_alpha (`refusal`, "" when it takes it)."""
    require(math.isfinite(cfg.depth_alpha) and 0 <= cfg.depth_alpha <= 1,
            f"model.depth_alpha must be in [0, 1] (1 CompleteP, 0.5 depth-muP, 0 off), got {cfg.depth_alpha}")
    require(not cfg.depth_alpha or cfg.depth_base > 0, f"model.depth_alpha={cfg.depth_alpha} needs model.depth_base, "
            "the depth whose tuned learning rate is to carry over (e.g. model.depth_base=6)")
    require(cfg.depth_base >= 0, f"model.depth_base must be >= 0, got {cfg.depth_base}")
    require(not cfg.depth_alpha or not refusal, f"model.depth_alpha with scheme {cfg.norm_scheme!r}: {refusal}")
    require(cfg.prores_steps >= 0, f"model.prores_steps must be >= 0 (0: off), got {cfg.prores_steps}")
    require(cfg.branch_scale in BRANCH_SCALES,
            f"model.branch_scale must be {' or '.join(BRANCH_SCALES)}, got {cfg.branch_scale!r}")
    require(math.isfinite(cfg.norm_gain_const) and cfg.norm_gain_const >= 0,
            f"model.norm_gain_const must be a number >= 0 (0: the mean of l^(-p)), got {cfg.norm_gain_const}")
