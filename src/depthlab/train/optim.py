"""AdamW with decay only on matrices (p.dim() >= 2), or (train.optimizer=muon) Muon on the blocks' matrices and AdamW
on the rest; linear warmup then cosine decay to a floor; the depth parameterizations' per-group rates and epsilons,
ProRes's ramp advanced after every step (depthlab.model.depth); the stream scalars in AdamW groups of their own
(stream_scalars)."""

from __future__ import annotations

import math
import re

import torch
from torch.distributed.tensor import DTensor

from depthlab.config import Config, ModelConfig, TrainConfig
from depthlab.model.depth import block_eps_scale, block_lr_scale, blocks, set_prores_step
from depthlab.model.init import block_norm_gains

NO_DECAY = ("cls_token", "pos_embed")  # a ViT's class token and positions, excluded as in timm / DeiT
ADAM_EPS = 1e-8  # torch's default; the depth parameterizations scale it per group


def make_optimizer(model: torch.nn.Module, config: Config) -> torch.optim.AdamW | Optimizers:
    """AdamW over every trainable parameter; under train.optimizer=muon, Muon (torch.optim.Muon) over the hidden
    matrices (muon_params) and AdamW over the rest, both in one Optimizers list. Every group's rate is its
    optimizer's peak times its parameters' lr_scales multiplier. `config` is the run's: its train section sets the
    optimizer, its model section the depth rules (the model is not asked for a config of its own)."""
    cfg = config.train
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = muon_params(model) if cfg.optimizer == "muon" else set()
    scales, eps = lr_scales(model, config), eps_scales(model, config.model)
    rest = [(n, p) for n, p in named if id(p) not in hidden]
    groups = []
    for decayed, wd in ((True, cfg.weight_decay), (False, 0.0)):  # matrices; norms, gains, scalars
        params = [p for n, p in rest if (p.dim() >= 2 and n.rsplit(".", 1)[-1] not in NO_DECAY) == decayed]
        groups += scaled_groups(params, scales, eps, cfg.lr, wd)
    # The fused kernel: on CPU the default is a per-tensor loop that took up to a third of a step
    # (docs/results.md); FSDP2's DTensor parameters keep the default implementation.
    fused = not any(isinstance(p, DTensor) for _, p in named)
    opt = adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=ADAM_EPS, fused=fused)
    if cfg.optimizer == "muon":
        # Adam's epsilon multipliers do not apply: Muon's eps only guards the Newton-Schulz normalization
        muon = torch.optim.Muon(scaled_groups([p for _, p in named if id(p) in hidden], scales, {}, cfg.muon_lr,
                                              cfg.muon_weight_decay),
                                lr=cfg.muon_lr, weight_decay=cfg.muon_weight_decay, momentum=cfg.muon_momentum,
                                adjust_lr_fn=cfg.muon_adjust_lr)
        opt = Optimizers([adamw, muon])
    if any(getattr(b.attn_add, "ramp", None) is not None for b in blocks(model)):
        advance_prores(adamw, model)  # AdamW always steps (it holds the embeddings) and counts the steps
    return opt


def scaled_groups(params: list, scales: dict[int, float], eps: dict[int, float], lr: float, wd: float) -> list[dict]:
    """One parameter group per (learning-rate, epsilon) multiplier (the scheduler scales each group's own peak);
    one empty group when there are no parameters, so that the groups' layout does not depend on the model."""
    by_scale: dict[tuple[float, float], list] = {}
    for p in params:
        by_scale.setdefault((scales.get(id(p), 1.0), eps.get(id(p), 1.0)), []).append(p)
    return [{"params": ps, "weight_decay": wd, **({"lr": lr * s} if s != 1.0 else {}),
             **({"eps": ADAM_EPS * e} if e != 1.0 else {})}
            for (s, e), ps in (by_scale or {(1.0, 1.0): []}).items()]


def muon_params(model: torch.nn.Module) -> set[int]:
    """Ids of the parameters Muon takes under train.optimizer=muon: the trainable 2-D weights inside the blocks (the
    attention and MLP matrices). AdamW keeps the embeddings, the head, the norm gains and every scalar or vector
    (LayerScale, ReZero/SkipInit, DyT and GPAS gates)."""
    return {id(p) for block in blocks(model) for p in block.parameters() if p.requires_grad and p.dim() == 2}


class Optimizers(list):
    """Several optimizers stepped as one (train.optimizer=muon: [AdamW, Muon]). torch.distributed.checkpoint's
    state-dict functions take the list as it is (one state dict keyed by parameter names); make_scheduler gives
    each optimizer the same schedule."""

    def step(self) -> None:
        for opt in self:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self for g in opt.param_groups]


class Schedules(list):
    """One LambdaLR per optimizer of an Optimizers list, stepped, saved and restored together."""

    def step(self) -> None:
        for s in self:
            s.step()

    def get_last_lr(self) -> list[float]:
        return [lr for s in self for lr in s.get_last_lr()]

    def state_dict(self) -> dict:
        return {"schedules": [s.state_dict() for s in self]}

    def load_state_dict(self, state: dict) -> None:
        for s, sd in zip(self, state["schedules"], strict=True):
            s.load_state_dict(sd)


def optimizer_split(model: torch.nn.Module, opt) -> str:
    """One line per optimizer: its name, how many tensors and parameters it takes, and their names with block
    numbers as * (printed at the start of a run)."""
    names = {id(p): re.sub(r"\.\d+\.", ".*.", n) for n, p in model.named_parameters()}
    lines = []
    for o in opt if isinstance(opt, Optimizers) else [opt]:
        params = [p for g in o.param_groups for p in g["params"]]
        kinds = ", ".join(dict.fromkeys(names.get(id(p), "?") for p in params))
        lines.append(f"{type(o).__name__}: {len(params)} tensors, {sum(p.numel() for p in params):,} parameters "
                     f"({kinds or 'none'})")
    return "; ".join(lines)


def advance_prores(opt: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """After every optimizer step, set ProRes's ramps to a(l, t), t the optimizer's own step count (restored with
    its state on resume; a skipped step takes none); until the first step they stay as built or loaded."""
    def after_step(optimizer, args, kwargs):
        state = next((s for s in optimizer.state.values() if "step" in s), None)
        if state is not None:
            set_prores_step(model, int(state["step"]))

    opt.register_step_post_hook(after_step)


def eps_scales(model: torch.nn.Module, cfg: ModelConfig) -> dict[int, float]:
    """Adam-epsilon multipliers by parameter id (1 where absent): model.depth_alpha puts every block parameter's
    at m^(-alpha)."""
    if not cfg.depth_alpha:
        return {}
    return {id(p): block_eps_scale(cfg) for block in blocks(model) for p in block.parameters()}


def lr_scales(model: torch.nn.Module, config: Config) -> dict[int, float]:
    """Learning-rate multipliers by parameter id (1 where absent): train.block_lr=depth puts every parameter of
    block l at l^(-p), a plain depth-wise rate decay; train.norm_gain_lr=depth block l's norm gains (both: the
    product); model.depth_alpha every block parameter at m^(alpha - 1) (times the others); the embeddings, the
    final norm and the head keep lr; the stream scalars learn at train.scalar_lr_mult (stream_scalars)."""
    out: dict[int, float] = {}
    m, cfg, lns_power = config.model, config.train, config.model.lns_power
    if m.depth_alpha:
        out.update({id(p): block_lr_scale(m) for block in blocks(model) for p in block.parameters()})
    if str(cfg.block_lr) == "depth":
        for block in blocks(model):
            for p in block.parameters():
                out[id(p)] = out.get(id(p), 1.0) * block.layer_id ** -lns_power
    if str(cfg.norm_gain_lr) == "depth":
        for g, s in block_norm_gains(model, lns_power):
            out[id(g)] = out.get(id(g), 1.0) * s
    for p, s in stream_scalars(model, cfg.scalar_lr_mult):
        out[id(p)] = out.get(id(p), 1.0) * s
    return out


RESID_LAMBDA_SHARE = 0.01  # resid_lambda learns at 1/100 of x0_lambda's rate (nanochat: a multiplier compounds)


def stream_scalars(model: torch.nn.Module, mult: float) -> list[tuple[torch.nn.Parameter, float]]:
    """(parameter, rate multiplier) of every block's stream scalars (model.resid_lambda / x0_lambda): x0_lambda at
    train.scalar_lr_mult, resid_lambda at RESID_LAMBDA_SHARE of it. Their multipliers are no other parameter's, so
    each kind gets an AdamW group of its own (scaled_groups), under Muon too (they are not matrices)."""
    out = []
    for block in blocks(model):
        mix = getattr(block, "stream_mix", None)
        if mix is not None:
            out += [(p, mult * share) for p, share in ((mix.resid_lambda, RESID_LAMBDA_SHARE), (mix.x0_lambda, 1.0))
                    if p is not None]
    return out


@torch.no_grad()
def clip_gradients(model: torch.nn.Module, config: Config) -> torch.Tensor:
    """Clip the gradients to norm train.grad_clip (0: no clipping) and return their norm before clipping. Under
    train.norm_gain_lr=depth the norm is measured as LNS measures it, each block-l gain's gradient weighted by
    l^(-p) (LNS's gain gradient is l^(-p) times Pre-LN's), so that clipping keeps the two runs identical."""
    cfg = config.train
    gains = block_norm_gains(model, config.model.lns_power) if str(cfg.norm_gain_lr) == "depth" else []
    for g, s in gains:
        if g.grad is not None:
            g.grad.mul_(s)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
    for g, s in gains:
        if g.grad is not None:
            g.grad.div_(s)
    return norm


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(opt, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR | Schedules:
    """Warmup + cosine (lr_factor) on every group; an Optimizers list gets one schedule per optimizer."""
    if isinstance(opt, Optimizers):
        return Schedules(make_scheduler(o, cfg) for o in opt)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg))
