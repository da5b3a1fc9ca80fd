"""Normalization schemes: one block class per scheme, registered by name. This module is the scheme registry.

Everything the rest of depthlab asks about a scheme is declared once, on its class:

    forward                 where the norms and residual adds sit                the model
    norm_scale(cfg, l)      constant multiplier on block l's norm outputs        hf.apply_scheme
    norm_scales(cfg, l)     the (attention, MLP) norms' own multipliers          the block
    residual_alpha(cfg)     weight of the skip path in alpha * h + F             the block
    norm_cls, embed_norm    RMSNorm or DyT; a norm on the embedding output       the model
    default_init            what model.init=auto picks                           model.init
    init_warnings           {init: why that pairing was measured worse}          model.init
    supports_gpas *         the GPAS add-on (model.gpas) may be used with it     validate
    hf_patchable *          hf.apply_scheme can patch it onto any HF decoder     hf.apply
    hf_export *             the stock HF class it exports to ("family": the      hf.exporter, hf.convert
                            family's own, e.g. Llama; or a family's name: "gemma2", its class), or None with
                            hf_export_refusal, the reason
    norms_after_branch      its norms sit on the branch outputs (reordered; the   the block
                            olmo2 family sets it for every scheme it runs)
    norms_around_branch     a norm before and after each branch (sandwich,        the block
                            peri; the gemma2 family sets it for every scheme it
                            runs, the scales then on the norms after the branch)
    branch_gains            attn_gain / mlp_gain multiply the branch outputs;    hf.exporter
                            export folds them into o_proj / down_proj
    branch_multiplier(cfg, l)  constant multiplier on block l's branch outputs   the block's residual adds; export
                            (depth parameterizations, LNS's branch placement)
    depth_alpha_refusal     why model.depth_alpha makes no sense for it, or ""   validate
    stream_scalars_refusal  why model.resid_lambda / x0_lambda make no sense     validate
                            for it, or "" (every pre-norm scheme takes them)

To add a scheme, subclass PreLNBlock (or the scheme closest to yours), override what differs and decorate it
with @register("name"); config validation, `depthlab schemes`, init, export, analysis and hf.apply_scheme read
the class, nothing else changes. The starred attributes must be stated in the class body of every registered
scheme (register checks): inherited, they would silently be wrong for a block wired differently.

Where the norms sit, one of the block's two branches drawn (F is attention, then the MLP; l is the 1-based block
index, N the number of blocks; formulas with their sources: docs/method.md section 2). Every scheme keeps the
model's final norm before the LM head, unscaled.

    pre, lns, dyt       h ─┬────────────(+)─>         lns: norm output times l^(-p)
                           └─ norm ─ F ──┘            dyt: norm = gamma * tanh(alpha x) + beta
    post, deepnorm      h ─┬─────(+)─ norm ─>         deepnorm: the skip path times
                           └─ F ──┘                   alpha = (2N)^(1/4)
    mixln               post for blocks l <= floor(r N), pre after
    sandwich, peri      h ─┬───────────────────(+)─>  peri: also a norm on the
                           └─ norm ─ F ─ norm ──┘     embedding output
    reordered           h ─┬────────────(+)─>
                           └─ F ─ norm ──┘
    layerscale,         h ─┬──────────────────(+)─>   g: per-channel (layerscale) or
    skipinit               └─ norm ─ F ─ x g ──┘      scalar (skipinit)
    rezero              skipinit without the norm
    + resid_lambda,     before each block: h = resid_lambda_l h + x0_lambda_l x0, x0 the embedding output; two
      x0_lambda         learnable scalars per block (StreamMix), on every pre-norm scheme
    + gpas (pre, lns)   after each (+): x (1 - SiLU(a)) forward, x 1 backward; a: one per block (the default,
                        model.gpas_gate=per_block, as GPAS's reference) or one per add (per_add)

Model families (model.family: llama, qwen2, olmo, olmo2, ...; depthlab.model.families) change the parts, not the
wiring: the block asks its family for the norm (OLMo-1's LayerNorm without weight), the attention (biases, QK-norm)
and the MLP. The exceptions are olmo2, whose block puts its norms on the branch outputs, and gemma2, whose block
has a norm before and after each branch (Sandwich-LN); there the schemes that wire their own block are refused
(family_refusal), and those that only change the norms (lns, dyt) run the family's block with their norms.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from depthlab import UserError
from depthlab.config import COMPANIONS, ModelConfig
from depthlab.model import depth as depth_options
from depthlab.model.families import Family, family_of
from depthlab.model.parts import DyT, GPASGate, GPASResidual, Residual, RMSNorm, StreamMix

SCHEMES: dict[str, type[PreLNBlock]] = {}
_MUST_DECLARE = ("supports_gpas", "hf_patchable", "hf_export")


def register(name: str):
    """Class decorator: make the block class the scheme `name`."""

    def deco(cls):
        missing = [attr for attr in _MUST_DECLARE if attr not in vars(cls)]
        if missing:
            raise TypeError(f"scheme {name!r}: {cls.__name__} must declare {', '.join(missing)} itself")
        if cls.hf_export is None and not cls.hf_export_refusal:
            raise TypeError(f"scheme {name!r}: {cls.__name__} has no stock HF form and must say why "
                            "(hf_export_refusal)")
        SCHEMES[name] = cls
        cls.scheme = name
        for setting in cls.reads:  # the setting acts with this scheme (config.COMPANIONS)
            row = COMPANIONS[f"model.{setting}"]
            row["model.norm_scheme"] = (*row["model.norm_scheme"], name)
        return cls

    return deco


def scheme_class(name: str) -> type[PreLNBlock]:
    """The block class of scheme `name`."""
    if name not in SCHEMES:
        raise UserError(f"unknown norm scheme {name!r}; valid: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def build_block(cfg: ModelConfig, layer_id: int) -> PreLNBlock:
    """Block `layer_id` (1-based) of a model with config `cfg`."""
    return scheme_class(cfg.norm_scheme)(cfg, layer_id)


def gpas_schemes() -> list[str]:
    return [name for name, cls in SCHEMES.items() if cls.supports_gpas]


GPAS_EXPORT_REFUSAL = ("gpas scales the residual stream after every add (and RMSNorm's epsilon makes that scale not "
                       "exactly foldable); stock residual adds are plain")
_REWIRED = "stock Llama and Gemma-2 blocks keep norms on the branches and a plain residual add"


def family_refusal(cls: type[PreLNBlock], family: Family) -> str:
    """Why scheme `cls` cannot run on `family`, or "" when it can. olmo2 and gemma2 fix where their norms sit
    (OLMo-2: on the branch outputs, with QK-norm; Gemma-2: before and after each branch); there a scheme runs if
    it is the family's own block (hf_scheme: pre on olmo2, sandwich on gemma2) or takes the family's wiring as it
    is, changing only what the norms are (lns, dyt); pre, on a family whose block has another name, is refused."""
    def runs(c):
        if not (family.norms_after_branch or family.norms_around_branch) or c.scheme == family.hf_scheme:
            return True
        own_wiring = c.norms_after_branch or c.norms_around_branch or c.embed_norm
        return c.forward is PreLNBlock.forward and not own_wiring and c is not PreLNBlock

    if runs(cls):
        return ""
    ok = [name for name, c in SCHEMES.items() if runs(c)]
    what = (cls.__doc__ or "").split("\n")[0].split(". ")[0].rstrip(".")
    wiring = "h + Norm(F(h))" if family.norms_after_branch else "h + Norm(F(Norm(h)))"
    return (f"model.family={family.name} fixes the block's wiring ({wiring}{', QK-norm' * family.qk_norm}), and scheme "
            f"{cls.scheme!r} wires its own ({what}); with {family.name} use {', '.join(ok)}")


@register("pre")
class PreLNBlock(nn.Module):
    """Pre-LN: h = h + Attn(Norm(h)); h = h + MLP(Norm(h)). Every other scheme is a small variant of it.

        h ─┬──────────────────────(+)─┬──────────────────────(+)─>
           └─ attn_norm ─ attn ────┘  └─ mlp_norm ─ mlp ──────┘

    layer_id is 1-based (LayerNorm Scaling counts blocks from 1).
    """

    scheme: ClassVar[str]  # set by @register
    norm_cls: ClassVar[type[nn.Module]] = RMSNorm  # DyT swaps this; the model's final norm uses it too
    embed_norm: ClassVar[bool] = False  # Peri-LN also normalises the embedding output
    default_init: ClassVar[str] = "normal"
    init_warnings: ClassVar[dict[str, str]] = {}
    branch_gains: ClassVar[bool] = False
    hf_export_refusal: ClassVar[str] = ""
    supports_gpas: ClassVar[bool] = True
    hf_patchable: ClassVar[bool] = True
    hf_export: ClassVar[str | None] = "family"
    norms_after_branch: ClassVar[bool] = False
    norms_around_branch: ClassVar[bool] = False
    depth_alpha_refusal: ClassVar[str] = ""
    stream_scalars_refusal: ClassVar[str] = ""
    reads: ClassVar[tuple[str, ...]] = ()  # the model settings only this scheme (and its subclasses) acts on

    @classmethod
    def norm_scale(cls, cfg: ModelConfig, layer_id: int) -> float:
        """The constant, non-learned multiplier on the outputs of block `layer_id`'s norms."""
        return 1.0

    @classmethod
    def norm_scales(cls, cfg: ModelConfig, layer_id: int) -> tuple[float, float]:
        """The constant multipliers on the outputs of block `layer_id`'s (attention, MLP) norms."""
        s = cls.norm_scale(cfg, layer_id)
        return s, s

    @classmethod
    def residual_alpha(cls, cfg: ModelConfig) -> float:
        return 1.0

    @classmethod
    def branch_multiplier(cls, cfg: ModelConfig, layer_id: int) -> float:
        """The constant multiplier on block `layer_id`'s branch outputs: the depth parameterization's
        (depthlab.model.depth), 1 without one."""
        return depth_options.branch_multiplier(cfg, layer_id)

    @classmethod
    def make_norm(cls, cfg: ModelConfig, scale: float = 1.0) -> nn.Module:
        """The scheme's norm (DyT replaces it), else the family's: RMSNorm, or OLMo-1's LayerNorm (no weight)."""
        if cls.norm_cls is DyT:
            return DyT(cfg.dim, cfg.dyt_alpha_init, scale)
        return family_of(cfg).make_norm(cfg, scale)

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        family = family_of(cfg)
        self.output_norms = self.norms_after_branch or family.norms_after_branch  # reordered, olmo2
        self.sandwiched = self.norms_around_branch or family.norms_around_branch  # sandwich, peri, gemma2
        attn_scale, mlp_scale = self.norm_scales(cfg, layer_id)
        # sandwiched, the scales go on the norms after the branches: the norm after a branch sets what it adds
        self.attn_norm = self.make_norm(cfg, 1.0 if self.sandwiched else attn_scale)
        self.attn = family.attention(cfg, layer_id)
        self.mlp_norm = self.make_norm(cfg, 1.0 if self.sandwiched else mlp_scale)
        self.mlp = family.feed_forward(cfg)
        alpha = self.residual_alpha(cfg)
        self.prores_steps = cfg.prores_steps  # ProRes: block l's branches ramp up over l * prores_steps steps
        branch = {"branch_multiplier": self.branch_multiplier(cfg, layer_id), "ramp": cfg.prores_steps > 0}
        if not cfg.gpas:
            self.attn_add, self.mlp_add = Residual(alpha, **branch), Residual(alpha, **branch)
        elif cfg.gpas_gate == "per_add":
            self.attn_add, self.mlp_add = GPASResidual(alpha, **branch), GPASResidual(alpha, **branch)
        else:  # per_block, as in the GPAS reference: one gate, registered here, applied after both adds
            self.gpas = GPASGate()
            self.attn_add = GPASResidual(alpha, self.gpas, **branch)
            self.mlp_add = GPASResidual(alpha, self.gpas, **branch)
        if self.sandwiched:
            self.attn_out_norm = self.make_norm(cfg, attn_scale)
            self.mlp_out_norm = self.make_norm(cfg, mlp_scale)
        # model.resid_lambda / x0_lambda: the block's own scalars, so that FSDP shards them with it and a block
        # removed or repeated takes its scalars along
        self.stream_mix = StreamMix(cfg) if cfg.resid_lambda or cfg.x0_lambda else None

    def mix_in(self, h: torch.Tensor, x0: torch.Tensor | None) -> torch.Tensor:
        """The stream this block reads: h, or resid_lambda h + x0_lambda x0 where the model passes x0 (the
        embedding output; only a model with the stream scalars does)."""
        return h if x0 is None else self.stream_mix(h, x0)

    @property
    def branch_multiplier_now(self) -> float:
        """The multiplier on both branch outputs now (constant times ProRes's ramp): what export folds."""
        return self.attn_add.branch_multiplier_now

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                x0: torch.Tensor | None = None) -> torch.Tensor:
        h = self.mix_in(h, x0)
        if self.output_norms:  # reordered, and the olmo2 family: h + Norm(F(h))
            h = self.attn_add(h, self.attn_norm(self.attn(h, rope)))
            return self.mlp_add(h, self.mlp_norm(self.mlp(h)))
        if self.sandwiched:  # sandwich, peri, and the gemma2 family: h + Norm(F(Norm(h)))
            h = self.attn_add(h, self.attn_out_norm(self.attn(self.attn_norm(h), rope)))
            return self.mlp_add(h, self.mlp_out_norm(self.mlp(self.mlp_norm(h))))
        h = self.attn_add(h, self.attn(self.attn_norm(h), rope))
        h = self.mlp_add(h, self.mlp(self.mlp_norm(h)))
        return h


@register("lns")
class LNSBlock(PreLNBlock):
    """LayerNorm Scaling (arXiv 2502.05795): Pre-LN with both norm outputs of block l scaled by l^(-p).

    model.lns_placement picks where s = l^(-p) goes (the paper's Table 8 for language models, and its ViT finding):

        norm        h + Attn(s Norm(h)),  then + MLP(s Norm(.))     the paper's LNS (default)
        branch      h + s Attn(Norm(h)),  then + s MLP(Norm(.))     the paper's best for ViT
        attn_only   h + Attn(s Norm(h)),  then + MLP(Norm(.))
        mlp_only    h + Attn(Norm(h)),    then + MLP(s Norm(.))

    Where the norms already sit on the branch outputs (olmo2), norm and branch are the same function.
    """

    reads = ("lns_placement",)
    supports_gpas = hf_patchable = True
    hf_export = "family"  # Norm_g(x) * s == Norm_{g * s}(x): the scale folds into the norm weight (or, for a norm
    # without one, into the layers reading its output: W (s x) + b == (s W) x + b); on the branch, into the output
    # projections: s (W y + b) == (s W) y + s b
    init_warnings = {"scaled": "lns with scaled init was measured worse than lns alone in the paper "
                               "(PPL 25.80 vs 25.76 at 130M, 20.79 vs 20.35 at 250M)"}

    @classmethod
    def norm_scale(cls, cfg: ModelConfig, layer_id: int) -> float:
        return 1.0 if cfg.lns_placement == "branch" else layer_id ** -cfg.lns_power

    @classmethod
    def norm_scales(cls, cfg: ModelConfig, layer_id: int) -> tuple[float, float]:
        s = layer_id ** -cfg.lns_power
        return {"norm": (s, s), "branch": (1.0, 1.0), "attn_only": (s, 1.0), "mlp_only": (1.0, s)}[cfg.lns_placement]

    @classmethod
    def branch_multiplier(cls, cfg: ModelConfig, layer_id: int) -> float:
        """lns_placement=branch: l^(-p) on the branch outputs (the residual add applies it; olmo2: h + s Norm(F(h)))
        times the depth parameterization's multiplier."""
        s = layer_id ** -cfg.lns_power if cfg.lns_placement == "branch" else 1.0
        return s * super().branch_multiplier(cfg, layer_id)


@register("post")
class PostLNBlock(PreLNBlock):
    """Post-LN: h = Norm(h + Attn(h)); h = Norm(h + MLP(h))."""

    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = f"the norm sits on the residual stream after the add; {_REWIRED}"
    depth_alpha_refusal = ("a norm after every add already resets the stream's scale, so there is no sum of L "
                           "branches for m^(-alpha) to keep depth-free; use pre, lns or another pre-norm scheme")
    stream_scalars_refusal = ("a norm after every add resets the stream's scale, so a multiplier on the stream "
                              "before the block is undone by it; use pre, lns or another pre-norm scheme")

    def forward(self, h, rope):
        h = self.attn_norm(self.attn_add(h, self.attn(h, rope)))
        h = self.mlp_norm(self.mlp_add(h, self.mlp(h)))
        return h


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet's residual weight for a decoder-only model: (2N)^(1/4)."""
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet's init gain for v, o and MLP weights: (8N)^(-1/4) (the reference code inverted it)."""
    return (8 * n_layers) ** -0.25


@register("deepnorm")
class DeepNormBlock(PostLNBlock):
    """DeepNorm: h = Norm(alpha * h + F(h)), alpha = (2N)^(1/4); pair with the `deepnorm` init."""

    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = f"the norm sits after the add and the residual is weighted by alpha; {_REWIRED}"
    depth_alpha_refusal = ("DeepNorm is a depth parameterization already: its skip weight (2N)^(1/4) and init gain "
                           "(8N)^(-1/4) set the branch's share with depth, and a norm follows every add")
    stream_scalars_refusal = PostLNBlock.stream_scalars_refusal
    default_init = "deepnorm"

    @classmethod
    def residual_alpha(cls, cfg: ModelConfig) -> float:
        return deepnorm_alpha(cfg.n_layers)


@register("mixln")
class MixLNBlock(PreLNBlock):
    """Mix-LN: blocks l <= floor(r * N) are Post-LN, the rest Pre-LN."""

    reads = ("mixln_ratio",)
    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = f"its first blocks are Post-LN (norm after the add); {_REWIRED}"
    depth_alpha_refusal = ("its first blocks are Post-LN, whose norm after the add resets the stream's scale; one "
                           "m^(-alpha) cannot serve both kinds of block")
    stream_scalars_refusal = ("its first blocks are Post-LN, whose norm after the add resets the stream's scale "
                              "(a multiplier on the stream is undone there); use pre, lns or another pre-norm scheme")

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.is_post = layer_id <= math.floor(cfg.mixln_ratio * cfg.n_layers)

    def forward(self, h, rope):
        return (PostLNBlock.forward if self.is_post else PreLNBlock.forward)(self, h, rope)


@register("sandwich")
class SandwichBlock(PreLNBlock):
    """Sandwich-LN: h = h + Norm(F(Norm(h)))."""

    norms_around_branch = True  # PreLNBlock wires it
    supports_gpas = hf_patchable = False
    hf_export = "gemma2"  # Gemma-2's block is exactly Sandwich-LN


@register("peri")
class PeriLNBlock(SandwichBlock):
    """Peri-LN (arXiv 2502.02732): the sandwich block, plus a norm on the embedding output."""

    embed_norm = True
    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = ("it normalises the embedding output, which neither stock Llama nor Gemma-2 (the sandwich "
                         "block) does")


@register("reordered")
class ReorderedBlock(PreLNBlock):
    """OLMo-2 style: h = h + Norm(F(h)); the norms sit on the branch outputs."""

    norms_after_branch = True  # PreLNBlock.forward wires it
    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = (f"its norms sit on the branch outputs, not the inputs (OLMo-2's own block also adds q/k "
                         f"norms: model.family=olmo2 with scheme pre is that block); {_REWIRED}")


@register("layerscale")
class LayerScaleBlock(PreLNBlock):
    """LayerScale: h = h + diag(lambda) F(Norm(h)), lambda learnable per channel."""

    reads = ("layerscale_init",)
    supports_gpas = hf_patchable = False
    hf_export = "family"  # h + diag(lam) W_o y == h + (diag(lam) W_o) y
    branch_gains = True

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_gain = nn.Parameter(torch.full((cfg.dim,), cfg.layerscale_init))
        self.mlp_gain = nn.Parameter(torch.full((cfg.dim,), cfg.layerscale_init))

    def forward(self, h, rope, x0=None):
        h = self.mix_in(h, x0)
        h = self.attn_add(h, self.attn_gain * self.attn(self.attn_norm(h), rope))
        h = self.mlp_add(h, self.mlp_gain * self.mlp(self.mlp_norm(h)))
        return h


@register("skipinit")
class SkipInitBlock(PreLNBlock):
    """SkipInit: h = h + alpha F(Norm(h)), alpha a learnable scalar per branch."""

    reads = ("skip_alpha_init",)
    supports_gpas = hf_patchable = False
    hf_export = "family"  # h + alpha W_o y == h + (alpha W_o) y
    branch_gains = True

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_gain = nn.Parameter(torch.tensor(cfg.skip_alpha_init))
        self.mlp_gain = nn.Parameter(torch.tensor(cfg.skip_alpha_init))

    forward = LayerScaleBlock.forward


@register("rezero")
class ReZeroBlock(SkipInitBlock):
    """ReZero: h = h + alpha F(h), no norms in the block."""

    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = "its blocks have no norm, and a Llama RMSNorm cannot be made the identity"

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_norm = self.mlp_norm = nn.Identity()


@register("dyt")
class DyTBlock(PreLNBlock):
    """Dynamic Tanh: every norm (the final one too) replaced by gamma * tanh(alpha x) + beta."""

    reads = ("dyt_alpha_init",)
    norm_cls = DyT
    supports_gpas = hf_patchable = False
    hf_export = None
    hf_export_refusal = "DyT (tanh) replaces RMSNorm, which no stock model expresses"
