"""Typed configs: model, data, train. JSON/YAML files, dotted `--set` overrides.

Data only: checking values against the scheme, family and init registries (and every range check) is
depthlab.model.validate.validate, next to those registries; this module imports nothing from depthlab.model. The
presets (`--preset`) are the model families' (depthlab.model.families.preset).

Every run directory and every checkpoint stores the fully resolved config as JSON, so a run can always be
rebuilt exactly (the reference code kept the scheme in an environment variable and lost it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from depthlab import UserError


@dataclass
class ModelConfig:
    """The model: its family, shape, scheme and that scheme's constants, its init, and for a ViT its images.
    Data only; `depthlab.model.build_model` builds it and `depthlab.model.validate` checks it."""

    family: str = "llama"  # the model's family, one of depthlab.model.families.FAMILIES (llama, qwen2, olmo, vit, ...)
    vocab_size: int = 4096
    dim: int = 128
    n_layers: int = 8
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (no grouped-query attention)
    head_size: int | None = None  # each attention head's width; None: dim / n_heads (Gemma-2's is its own)
    ffn_dim: int = 344
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    clip_qkv: float | None = None  # olmo: q, k, v projections clamped to [-c, c] (OLMo-1.7's 8.0); None: off
    sliding_window: int | None = None  # mistral: each token attends to itself and the sliding_window - 1 before it
    # (gemma2: in every other layer)
    attn_softcap: float | None = None  # gemma2: attention scores capped as c * tanh(s / c) (Gemma-2's 50); None: off
    logit_softcap: float | None = None  # gemma2: the logits capped as c * tanh(z / c) (Gemma-2's 30); None: off
    query_pre_attn_scalar: int | None = None  # gemma2: attention scores times this^(-1/2); None: head_dim's
    tie_embeddings: bool = False
    norm_scheme: str = "lns"  # see depthlab.model.schemes.SCHEMES
    lns_power: float = 0.5  # lns: block l's norm outputs times l^(-lns_power)
    mixln_ratio: float = 0.25  # mixln: blocks l <= floor(ratio * n_layers) are Post-LN
    layerscale_init: float = 0.1  # layerscale: initial per-channel gain
    skip_alpha_init: float = 0.0  # skipinit / rezero: initial residual gain
    dyt_alpha_init: float = 0.5  # dyt: initial alpha in gamma * tanh(alpha * x) + beta
    gpas: bool = False  # add-on for pre / lns: gradient-preserving activation scaling after each residual add
    gpas_gate: str = "per_block"  # per_block: one gate shared by a block's two adds (as GPAS's reference); per_add
    init: str = "auto"  # normal | scaled | depth_scaled | deepnorm | auto: the scheme's default_init
    init_std: float | str = 0.02  # a number, or "auto": sqrt(2 / (5 * dim)), width-matched (0.02 at dim 1000)
    embed_std: float = 0.02  # the paper-era reference code used sqrt(2/5) ~ 0.632; tied embeddings use init_std
    lns_placement: str = "norm"  # lns: the norm outputs (norm, the LLM placement), the branch outputs (branch), or
    # one norm only (attn_only, mlp_only; docs/method.md)
    # (branch: h + l^(-p) F(Norm(h)), the paper's best placement for ViT)
    norm_gain_init: str = "1"  # 1 | depth: block l's norm gains start at l^(-lns_power) (LNS's scale, as a gain) |
    # uniform: every block's gains start at norm_gain_const (docs/method.md section 5)
    norm_gain_const: float = 0.0  # norm_gain_init=uniform: the constant; 0: the mean over l of l^(-lns_power)
    # depth parameterizations (depthlab.model.depth; docs/method.md section 5)
    depth_alpha: float = 0.0  # each branch times (n_layers / depth_base)^(-alpha): 1 CompleteP, 0.5 depth-muP, 0 off
    depth_base: int = 0  # L_base, the depth whose tuned rate is to carry over (needed with depth_alpha)
    prores_steps: int = 0  # ProRes: block l's branches ramp linearly from 0 to 1 over its first l * prores_steps steps
    branch_scale: str = "none"  # none | 1/L | 1/sqrtL | 1/sqrtl: a fixed multiplier on every branch output
    # the stream scalars (nanochat's per-layer lambdas; docs/method.md): before block l, h = r_l h + a_l x0, x0 the
    # embedding output, r_l and a_l learnable (their own optimizer groups, train.scalar_lr_mult); every pre-norm scheme
    resid_lambda: bool = False  # r_l, a learnable multiplier on the stream before each block
    x0_lambda: bool = False  # a_l, a learnable share of the embedding output added to the stream before each block
    resid_lambda_init: float = 1.0  # r_l at initialisation (1: the plain stream)
    x0_lambda_init: float = 0.0  # a_l at initialisation (0: no x0 yet; with both at their defaults step 0 is the
    # plain model's)
    # model.family=vit only: images in, classes out (depthlab.model.vit)
    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 1000
    pool: str = "cls"  # cls: a class token; mean: the mean of the patch tokens
    pos_embed: str = "learned"  # learned | sincos (fixed 2-D sine-cosine)

    @property
    def weight_std(self) -> float:
        """init_std as a number: "auto" is the "small init" rule sqrt(2 / (5 d)) of Nguyen & Salazar (2019),
        which keeps each block's relative update at initialisation about the same at every width."""
        return (2 / (5 * self.dim)) ** 0.5 if self.init_std == "auto" else float(self.init_std)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    @property
    def is_vit(self) -> bool:
        return self.family == "vit"

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass
class DataConfig:
    paths: list[str] = field(default_factory=list)  # empty: the built-in corpus
    tokenizer: str | None = None  # a tokenizer.json; None: train byte-level BPE on the data
    seq_len: int = 128
    val_fraction: float = 0.05  # share of documents held out for validation
    builtin_mb: float = 4.0  # how much of the built-in corpus to use
    fatal_bad_files: bool = False  # non-UTF-8 / binary files: skip and report (default) or fail
    text_field: str = "text"  # JSON / parquet / hf: sources: the field holding each document's text
    hf_streaming: bool = False  # hf: sources: stream instead of downloading the whole dataset first


# train.lora.targets / --lora-targets name -> the projection in a depthlab block (HF Llama calls them q_proj ...)
LORA_TARGETS = {"q": "attn.q_proj", "k": "attn.k_proj", "v": "attn.v_proj", "o": "attn.o_proj",
                "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


@dataclass
class LoraConfig:
    """LoRA adapters (depthlab finetune --lora; depthlab.model.lora): rank 0 trains every weight."""

    rank: int = 0
    alpha: float = 64.0  # the adapters' output is scaled by alpha / rank
    dropout: float = 0.05  # on the adapters' input
    targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "up", "down"])  # LLM-Adapters' LLaMA set


@dataclass
class TrainConfig:
    out_dir: str = "runs"
    seed: int = 0
    max_steps: int = 600
    batch_size: int = 16  # sequences per micro-batch, per rank (derived from global_batch when that is set)
    grad_accum: int = 1
    global_batch: int = 0  # sequences per optimizer step over all ranks: batch_size = global_batch / (grad_accum x
    # ranks) at the world size the run has; 0: batch_size as given (the global batch grows with the ranks)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to this fraction of the peak
    warmup_steps: int = 60
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0  # 0 disables clipping
    dtype: str = "fp32"  # fp32 | bf16 (autocast)
    device: str = "auto"
    eval_every: int = 200
    log_every: int = 10
    threads: int = 0  # torch intra-op threads; 0 = PyTorch's default
    ckpt_every: int = 0  # 0: only at the end
    keep_last: int = 3  # checkpoints kept (the newest k)
    on_nonfinite: str = "stop"  # stop | skip (skip the batch and count it)
    max_skips: int = 10  # with skip: consecutive skipped steps after which the run stops
    monitor_every: int = 50  # depth monitors (per-layer variance, update ratio, grad norm); 0 disables
    parallel: str = "ddp"  # under torchrun: ddp | fsdp (FSDP2 fully_shard)
    dist_timeout_s: float = 1800.0  # under torchrun: how long a collective may wait for the other ranks
    dp_replicate: int = 1  # fsdp: HSDP, a 2-D mesh of dp_replicate groups (nodes) x dp_shard ranks, sharded within
    dp_shard: int = 0  # a group and replicated across groups; 0: all ranks / dp_replicate
    compile: bool = False  # torch.compile the model
    activation_checkpointing: bool = False
    loss_chunk: int = 1024  # tokens per chunk of the LM head + cross-entropy (never the full logits); 0: unchunked
    peak_flops: float = 0.0  # for MFU; 0: a table for known GPUs, a measured matmul peak on CPU
    tensorboard: bool = False
    wandb: bool = False
    trackio: bool = False  # Trackio's local store (depthlab[trackio]): what TensorBoard gets
    init_from: str | None = None  # a checkpoint whose weights start the run (continued pretraining, e.g. an import)
    norm_gain_lr: str = "1"  # 1 | depth: block l's norm gains learn at lr * l^(-model.lns_power)
    block_lr: str = "1"  # 1 | depth: every parameter of block l learns at lr * l^(-model.lns_power)
    optimizer: str = "adamw"  # adamw | muon: torch.optim.Muon on the blocks' 2-D weights, AdamW (lr) on the rest
    muon_lr: float = 0.02  # Muon's peak rate; the schedule and the depth multipliers scale it as they scale lr
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0  # decoupled, as AdamW's weight_decay
    muon_adjust_lr: str = "original"  # original: lr sqrt(max(1, A/B)) | match_rms_adamw: lr 0.2 sqrt(max(A, B))
    scalar_lr_mult: float = 25.0  # model.x0_lambda's AdamW rate: lr times this; model.resid_lambda's: 1/100 of that
    # (nanochat's rule: a multiplier on the stream compounds over the blocks); 25: nanochat's scalar rate over its
    # Muon rate (0.5 / 0.02)
    lora: LoraConfig = field(default_factory=LoraConfig)  # rank > 0: only LoRA adapters train, the weights frozen


# Switches that act only together with a companion setting: switch -> {companion: the companion's values with which
# the switch acts} (any one of them; SET: any value but the companion's default). Set without one (away from the
# value its preset gives it), a switch would be silently ignored and the run train the plain model, so validation
# refuses it in one line (missing_companion), as depthlab.flags' only_with does for command-line flags.
SET = "set"
COMPANIONS: dict[str, dict[str, tuple | str]] = {
    "model.depth_base": {"model.depth_alpha": SET},
    "model.norm_gain_const": {"model.norm_gain_init": ("uniform",)},
    "model.lns_power": {"model.norm_scheme": ("lns",), "model.norm_gain_init": ("depth", "uniform"),
                        "train.norm_gain_lr": ("depth",), "train.block_lr": ("depth",)},
    # a scheme's own setting acts with the schemes whose block reads it: the scheme registry fills these in from each
    # block's `reads` (depthlab.model.schemes.register), so no second list of scheme names lives here
    **{f"model.{name}": {"model.norm_scheme": ()}
       for name in ("lns_placement", "mixln_ratio", "layerscale_init", "skip_alpha_init", "dyt_alpha_init")},
    "model.gpas_gate": {"model.gpas": (True,)},
    "model.resid_lambda_init": {"model.resid_lambda": (True,)},
    "model.x0_lambda_init": {"model.x0_lambda": (True,)},
    "train.scalar_lr_mult": {"model.resid_lambda": (True,), "model.x0_lambda": (True,)},
    **{f"model.{name}": {"model.family": ("vit",)}
       for name in ("image_size", "patch_size", "channels", "num_classes", "pool", "pos_embed")},
    "data.builtin_mb": {"data.paths": ([],)},  # the built-in corpus
    "train.max_skips": {"train.on_nonfinite": ("skip",)},
    "train.dp_replicate": {"train.parallel": ("fsdp",)},
    "train.dp_shard": {"train.parallel": ("fsdp",)},
    **{f"train.lora.{name}": {"train.lora.rank": SET} for name in ("alpha", "dropout", "targets")},
    **{f"train.muon_{name}": {"train.optimizer": ("muon",)}
       for name in ("lr", "momentum", "weight_decay", "adjust_lr")},
}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    preset: str = "cpu-tiny"

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        return _build(cls, d, "")

    @classmethod
    def load(cls, path: str | Path) -> Config:
        path = Path(path)
        try:
            text = path.read_text()
            d = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise UserError(f"cannot read config {path}: {e}") from None
        return cls.from_dict(d or {})


# Keys renamed since depthlab began saving configs, old dotted name -> new. A saved config (a run's or a checkpoint's
# config.json, a --config file) reads the old name as the new one, so what was written before still loads and
# resumes; --set, where a person is typing, refuses the old name and says the new one.
RENAMED = {"model.arch": "model.family"}


def _build(cls, d: dict, prefix: str):
    if not isinstance(d, dict):
        raise UserError(f"config section '{prefix or 'root'}' must be a mapping, got {d!r}")
    new = {k: RENAMED[prefix + k].rpartition(".")[2] for k in d if prefix + k in RENAMED}
    both = [k for k in new if new[k] in d]
    if both:
        raise UserError(f"config has both {prefix + both[0]} and {RENAMED[prefix + both[0]]}, one key under its old "
                        "and new names: keep the new one")
    d = {new.get(k, k): v for k, v in d.items()}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise UserError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
                        f"valid: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in d.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, hint, prefix + name)
    return cls(**kwargs)


def _coerce(value, hint, key: str):
    """Check / convert a parsed value to the field's annotated type."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:  # the first type that accepts the value, e.g. float | str: 0.02 or "auto"
            try:
                return _coerce(value, option, key)
            except UserError:
                pass
        hint = options[-1]
    origin = typing.get_origin(hint)
    if origin is list:
        if isinstance(value, (str, int, float)):
            value = [value]
        if not isinstance(value, list):
            raise UserError(f"{key} must be a list, got {value!r}")
        return [_coerce(v, typing.get_args(hint)[0], key) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "2e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise UserError(f"{key} must be of type {hint.__name__}, got {value!r}")


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.key=value` strings (values parsed as YAML scalars: 1e-3, true, null, [a, b])."""
    d = cfg.to_dict()
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set expects key=value, got {item!r}")
        if new := RENAMED.get(key.strip()):
            raise UserError(f"{key.strip()} is now {new}: --set {new}={raw}")
        node, *parts = key.strip().split(".")
        target = d
        path = [node, *parts]
        for p in path[:-1]:
            if not isinstance(target.get(p), dict):
                raise UserError(f"unknown config key {key!r}; sections: model, data, train")
            target = target[p]
        if path[-1] not in target:
            raise UserError(f"unknown config key {key!r}; valid in this section: {', '.join(sorted(target))}")
        try:
            target[path[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            target[path[-1]] = raw
    return Config.from_dict(d)


def value_of(cfg: Config, key: str):
    """A dotted key's value (train.lora.rank)."""
    return functools.reduce(getattr, key.split("."), cfg)


def _shown(value) -> str:
    return json.dumps(value) if isinstance(value, (bool, list)) else str(value)


def missing_companion(cfg: Config, base: Config) -> str | None:
    """Why a switch of COMPANIONS that cfg sets (to another value than `base`, the config it started from, gives
    it) has no effect, in one line; None when every switch set has its companion."""
    default = Config()
    for switch, companions in COMPANIONS.items():
        if value_of(cfg, switch) == value_of(base, switch) or any(
                value_of(cfg, key) != value_of(default, key) if values == SET else value_of(cfg, key) in values
                for key, values in companions.items()):
            continue
        now = ", ".join(f"{key}={_shown(value_of(cfg, key))}" for key in companions)
        needs = [f"{key} set (not {_shown(value_of(default, key))})" if values == SET else
                 f"{key}={'/'.join(map(_shown, values))}" for key, values in companions.items()]
        needs = " or ".join(needs) if len(needs) < 3 else f"{', '.join(needs[:-1])} or {needs[-1]}"
        return (f"{switch}={_shown(value_of(cfg, switch))} has no effect with {now}: it acts only with {needs} "
                f"(set that too, or drop {switch})")
    return None


def per_rank_batch(t: TrainConfig, world_size: int) -> int:
    """train.batch_size at this world size: global_batch / (grad_accum x ranks) when global_batch is set. The
    global micro-batch (ranks x batch_size) stays global_batch / grad_accum, so a run resumes on another number of
    ranks with the same sequences in every step."""
    if not t.global_batch:
        return t.batch_size
    share, rest = divmod(t.global_batch, t.grad_accum * world_size)
    if rest or not share:
        raise UserError(f"train.global_batch={t.global_batch} does not split into train.grad_accum={t.grad_accum} "
                        f"micro-batches on each of {world_size} rank(s): make it a multiple of "
                        f"{t.grad_accum * world_size}, or change train.grad_accum")
    return share
