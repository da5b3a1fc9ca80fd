"""Config validation: every impossible or out-of-range setting becomes one UserError line (exit 2 in the CLI).

It lives next to the scheme, family and init registries it asks, so that depthlab.config stays plain data; what
only one family checks is that family's `check` (depthlab.model.families).
"""

from __future__ import annotations

import dataclasses
import math

from depthlab.config import LORA_TARGETS, Config, DataConfig, LoraConfig, ModelConfig, TrainConfig, missing_companion
from depthlab.model import depth
from depthlab.model.families import FAMILIES, PRESETS, family_of, require
from depthlab.model.init import INITS
from depthlab.model.parts import GPAS_GATES
from depthlab.model.schemes import family_refusal, gpas_schemes, scheme_class


def validate(cfg: Config) -> Config:
    """Raise UserError on impossible settings; return cfg unchanged."""
    _check_model(cfg.model)
    _check_data(cfg.data, cfg.model)
    _check_train(cfg.train)
    _check_lora(cfg)
    problem = missing_companion(cfg, PRESETS[cfg.preset]() if cfg.preset in PRESETS else Config())
    require(problem is None, problem)  # a switch without the setting it acts with (config.COMPANIONS)
    return cfg


def check_lora(lora: LoraConfig) -> None:
    """One line for LoRA settings that cannot work (rank 0: LoRA is off and the rest is unused)."""
    require(lora.rank >= 0, f"the LoRA rank must be a positive integer, got {lora.rank}")
    if not lora.rank:
        return
    # inf scales every adapter's output to inf or NaN
    require(math.isfinite(lora.alpha) and lora.alpha > 0, f"the LoRA alpha must be a positive finite number, got "
            f"{lora.alpha}")
    require(0 <= lora.dropout < 1, f"the LoRA dropout must be in [0, 1), got {lora.dropout}")
    unknown = [t for t in lora.targets if t.removesuffix("_proj") not in LORA_TARGETS]
    what = f"unknown LoRA target {unknown[0]!r}" if unknown else "no LoRA targets given"
    require(not unknown and lora.targets, f"{what}; valid: {', '.join(LORA_TARGETS)} (the block's projections "
            "q_proj ... down_proj)")
    require(len({t.removesuffix("_proj") for t in lora.targets}) == len(lora.targets),
            f"LoRA target given twice: {', '.join(lora.targets)}")


def _check_lora(cfg: Config) -> None:
    """train.lora, and its rank against the widths of the layers it adapts, on the model built without memory
    (the meta device), before any data or weights are read."""
    import torch

    from depthlab.model.transformer import build_model

    lora = cfg.train.lora
    check_lora(lora)
    if lora.rank > 0:  # every block's projections have the first two's shapes
        with torch.device("meta"):
            model = build_model(dataclasses.replace(cfg.model, n_layers=min(cfg.model.n_layers, 2)), init=False)
        check_lora_rank(model, lora.rank, [LORA_TARGETS[t.removesuffix("_proj")] for t in lora.targets])


def check_lora_rank(model, rank: int, modules: list[str]) -> None:
    """A rank above a target's smaller side adds values (rank x (in + out)) but no freedom: B A changes an out x in
    weight by a matrix of rank min(in, out) at most, whatever the rank. `modules`: suffixes of module names."""
    from torch import nn

    shapes = {name: (m.out_features, m.in_features) for name, m in model.named_modules()
              if name.endswith(tuple("." + t for t in modules)) and isinstance(m, nn.Linear)}
    if shapes:
        name, shape = min(shapes.items(), key=lambda kv: min(kv[1]))
        require(rank <= min(shape), f"LoRA rank {rank} is above the width of {name} ({shape[0]} x {shape[1]}), "
                f"where no adapter reaches a rank above {min(shape)}: use a rank of at most {min(shape)} "
                "(--lora-rank, train.lora.rank)")


def train_warnings(cfg: Config) -> list[str]:
    """Settings that train but are probably not what was meant; `depthlab train` prints each."""
    out = []
    m, t = cfg.model, cfg.train
    family = family_of(m)
    if family.fixed_norm_eps is not None and m.norm_eps != family.fixed_norm_eps and not m.is_vit:
        out.append(f"model.norm_eps={m.norm_eps} with model.family={family.name}: {family.hf_class} fixes its norm's "
                   f"epsilon at {family.fixed_norm_eps}, so this run will not export; set model.norm_eps="
                   f"{family.fixed_norm_eps}")
    if t.warmup_steps > t.max_steps:
        out.append(f"train.warmup_steps={t.warmup_steps} is more than train.max_steps={t.max_steps}: the learning "
                   f"rate never reaches train.lr={t.lr} (at most {t.lr * t.max_steps / t.warmup_steps:.3g})")
    return out


def approx_params(m: ModelConfig) -> int:
    """Parameters of the model a config builds, from its shapes (norms and biases left out)."""
    q, kv = m.n_heads * m.head_dim, (m.n_kv_heads or m.n_heads) * m.head_dim
    block = 2 * m.dim * q + 2 * m.dim * kv + 3 * m.dim * m.ffn_dim
    embed = 0 if m.is_vit else m.vocab_size * m.dim * (1 if m.tie_embeddings else 2)
    return m.n_layers * block + embed


def _host_memory() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_host(cfg: Config) -> None:
    """For a run on the CPU: a model whose fp32 weights or one batch's activations exceed the machine's memory is
    refused before anything is allocated (the allocator's own failure is a traceback, a tokenizer's an abort, or
    the kernel's OOM killer). Not part of `validate`: a config is valid whatever machine reads it."""
    mem, m = _host_memory(), cfg.model
    params = approx_params(m)
    require(4 * params <= mem, f"a model of {params:,} parameters needs {4 * params / 2**30:,.0f} GiB for its fp32 "
            f"weights alone; this machine has {mem / 2**30:,.0f} GiB (model.dim={m.dim}, model.n_layers="
            f"{m.n_layers}, model.vocab_size={m.vocab_size})")
    tokens = cfg.train.batch_size * (1 if m.is_vit else cfg.data.seq_len)
    require(4 * tokens * m.dim <= mem, f"train.batch_size={cfg.train.batch_size:,}: one batch's activations alone "
            f"need {4 * tokens * m.dim / 2**30:,.0f} GiB; this machine has {mem / 2**30:,.0f} GiB")


def _number(obj, section: str, name: str, ok, what: str) -> None:
    """section.name must be finite (NaN and inf never are) and pass ok; what says what it must be."""
    v = getattr(obj, name)
    require(math.isfinite(v) and ok(v), f"{section}.{name} must be {what}, got {v}")


def _check_model(m: ModelConfig) -> None:
    scheme, family = scheme_class(m.norm_scheme), family_of(m)
    refusal = family_refusal(scheme, family)
    require(not refusal, refusal)
    readers: dict[str, list[str]] = {}  # a family's own fields stay null under every family that does not read them
    for other in FAMILIES.values():
        for name, what in other.options.items():
            readers.setdefault(name, []).append(f"{what} (model.family={other.name})")
    for name, what in readers.items():
        require(name in family.options or getattr(m, name) is None,
                f"model.{name} is {' and '.join(what)}, not {family.name}'s")
    require(m.init == "auto" or m.init in INITS, f"unknown init {m.init!r}; valid: auto, {', '.join(INITS)}")
    require(not m.gpas or scheme.supports_gpas,
            f"gpas combines with {' and '.join(gpas_schemes())} only, not {m.norm_scheme!r}")
    require(m.gpas_gate in GPAS_GATES, f"model.gpas_gate must be {' or '.join(GPAS_GATES)}, got {m.gpas_gate!r}")
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len"):
        require(getattr(m, name) > 0, f"model.{name} must be positive, got {getattr(m, name)}")
    require(m.head_size is None or m.head_size > 0, f"model.head_size must be positive or null, got {m.head_size}")
    require(m.head_size is not None or m.dim % m.n_heads == 0,
            f"model.n_heads={m.n_heads} does not divide model.dim={m.dim} (or set model.head_size)")
    params = approx_params(m)  # PyTorch counts a tensor's bytes in int64: beyond that no device builds it
    require(4 * params < 2**63, f"a model of {params:.3g} parameters (model.dim={m.dim}, model.n_layers="
            f"{m.n_layers}, model.vocab_size={m.vocab_size}) has more fp32 bytes than any machine addresses (2^63)")
    require(m.head_dim % 2 == 0 or not family.causal,
            f"head dimension {m.head_dim} ({'model.head_size' if m.head_size else 'dim / n_heads'}) must be even "
            "for RoPE")
    kv = m.n_kv_heads or m.n_heads
    require(kv > 0 and m.n_heads % kv == 0, f"model.n_kv_heads={kv} must divide model.n_heads={m.n_heads}")
    require(not (isinstance(m.init_std, str) and m.init_std != "auto") and math.isfinite(m.weight_std)
            and m.weight_std > 0, f"model.init_std must be a positive number or auto, got {m.init_std!r}")
    _number(m, "model", "mixln_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    _number(m, "model", "lns_power", lambda v: v >= 0, "a number >= 0")
    for name in ("norm_eps", "rope_theta", "embed_std"):
        _number(m, "model", name, lambda v: v > 0, "a positive number")
    for name in ("layerscale_init", "skip_alpha_init", "dyt_alpha_init"):
        _number(m, "model", name, lambda v: True, "a finite number")
    require(m.lns_placement in LNS_PLACEMENTS,
            f"model.lns_placement must be {' or '.join(LNS_PLACEMENTS)}, got {m.lns_placement!r}")
    require(str(m.norm_gain_init) in (*GAIN_RULES, "uniform"),
            f"model.norm_gain_init must be {' or '.join(GAIN_RULES)} or uniform, got {m.norm_gain_init!r}")
    depth.check(m, scheme.depth_alpha_refusal, require)
    if m.resid_lambda or m.x0_lambda:
        option = "model.resid_lambda" if m.resid_lambda else "model.x0_lambda"
        require(not scheme.stream_scalars_refusal, f"{option} with scheme {m.norm_scheme!r}: "
                f"{scheme.stream_scalars_refusal}")
        require(not m.is_vit, f"{option} is the language model's (x0 is the token embedding's output), not "
                "model.family=vit's")
    for name in ("resid_lambda_init", "x0_lambda_init"):
        _number(m, "model", name, lambda v: True, "a finite number")
    family.check(m)


LNS_PLACEMENTS = ("norm", "branch", "attn_only", "mlp_only")
MUON_ADJUST_LR = ("original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn
GAIN_RULES = ("1", "depth")  # norm_gain_init / norm_gain_lr: unchanged, or times l^(-lns_power) in block l


def _check_data(d: DataConfig, m: ModelConfig) -> None:
    require(m.is_vit or 0 < d.seq_len <= m.max_seq_len,
            f"data.seq_len={d.seq_len} must be in 1..model.max_seq_len={m.max_seq_len}")
    require(0 < d.val_fraction < 1, f"data.val_fraction must be in (0, 1), got {d.val_fraction}")
    _number(d, "data", "builtin_mb", lambda v: v > 0, "a positive number")


def _check_train(t: TrainConfig) -> None:
    for name in ("max_steps", "batch_size", "grad_accum", "eval_every", "log_every"):
        require(getattr(t, name) > 0, f"train.{name} must be positive, got {getattr(t, name)}")
    _number(t, "train", "lr", lambda v: v > 0, "a positive number")
    require(t.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {t.warmup_steps}")
    _number(t, "train", "min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    for name in ("beta1", "beta2"):
        _number(t, "train", name, lambda v: 0 <= v < 1, "in [0, 1)")
    _number(t, "train", "dist_timeout_s", lambda v: v > 0, "a positive number of seconds")
    for name in ("weight_decay", "grad_clip", "peak_flops"):
        _number(t, "train", name, lambda v: v >= 0, "a number >= 0")
    require(t.loss_chunk >= 0, f"train.loss_chunk must be >= 0 (0: unchunked), got {t.loss_chunk}")
    require(t.threads >= 0, f"train.threads must be >= 0 (0: PyTorch's default), got {t.threads}")
    require(0 <= t.seed < 2**32, f"train.seed must be in 0..2**32-1, got {t.seed}")
    require(t.on_nonfinite in ("stop", "skip"), f"train.on_nonfinite must be stop or skip, got {t.on_nonfinite!r}")
    require(t.max_skips >= 0, f"train.max_skips must be >= 0, got {t.max_skips}")
    require(t.parallel in ("ddp", "fsdp"), f"train.parallel must be ddp or fsdp, got {t.parallel!r}")
    require(t.global_batch >= 0 and t.dp_replicate >= 1 and t.dp_shard >= 0,
            "train.global_batch and train.dp_shard must be >= 0, train.dp_replicate >= 1")
    require(t.ckpt_every >= 0 and t.keep_last >= 1 and t.monitor_every >= 0,
            "train.ckpt_every and train.monitor_every must be >= 0, train.keep_last >= 1")
    require(t.dtype in ("fp32", "bf16"), f"train.dtype must be fp32 or bf16, got {t.dtype!r}")
    require(t.optimizer in ("adamw", "muon"), f"train.optimizer must be adamw or muon, got {t.optimizer!r}")
    _number(t, "train", "muon_lr", lambda v: v > 0, "a positive number")
    _number(t, "train", "scalar_lr_mult", lambda v: v > 0, "a positive number")
    _number(t, "train", "muon_momentum", lambda v: 0 <= v < 1, "in [0, 1)")
    _number(t, "train", "muon_weight_decay", lambda v: v >= 0, "a number >= 0")
    require(t.muon_adjust_lr in MUON_ADJUST_LR,
            f"train.muon_adjust_lr must be {' or '.join(MUON_ADJUST_LR)}, got {t.muon_adjust_lr!r}")
    for name in ("norm_gain_lr", "block_lr"):
        require(str(getattr(t, name)) in GAIN_RULES,
                f"train.{name} must be {' or '.join(GAIN_RULES)}, got {getattr(t, name)!r}")
