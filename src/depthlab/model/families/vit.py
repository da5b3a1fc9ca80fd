"""The vit family: the Vision Transformer's block (the model around it: depthlab.model.vit), and its presets."""

from __future__ import annotations

from depthlab.config import Config, DataConfig, ModelConfig, TrainConfig
from depthlab.model.families.base import Family, register, require

# The original ViT's Ti / S / B shapes at patch 16 and 224 px for ImageNet, with DeiT's recipe (AdamW, lr 1e-3 at
# global batch 1024, weight decay 0.05, 300 epochs, 5 warmup epochs), and LNS on the branch outputs, the placement
# the paper found best for ViT. vit-digits is the CPU preset: scikit-learn's 8 x 8 handwritten digits (shipped with
# the package), patch 2, a deep-thin 12 x 64 model.
SHAPES = {
    #          dim, layers, heads
    "vit-ti": (192, 12, 3),
    "vit-s": (384, 12, 6),
    "vit-b": (768, 12, 12),
}


def imagenet_preset(name: str) -> Config:
    dim, layers, heads = SHAPES[name]
    model = ModelConfig(family="vit", dim=dim, n_layers=layers, n_heads=heads, ffn_dim=4 * dim, norm_eps=1e-6,
                        norm_scheme="lns", lns_placement="branch")
    epoch = 1_281_167 // 1024
    train = TrainConfig(max_steps=300 * epoch, batch_size=128, grad_accum=8, lr=1e-3, warmup_steps=5 * epoch,
                        weight_decay=0.05, dtype="bf16", eval_every=epoch, log_every=10)
    return Config(model, DataConfig(), train, preset=name)


def digits_preset(name: str) -> Config:
    model = ModelConfig(family="vit", dim=64, n_layers=12, n_heads=4, ffn_dim=256, norm_eps=1e-6, image_size=8,
                        patch_size=2, channels=1, num_classes=10, norm_scheme="lns", lns_placement="branch")
    train = TrainConfig(max_steps=1500, batch_size=64, lr=1e-3, warmup_steps=150, weight_decay=0.05,
                        eval_every=250, log_every=50)
    return Config(model, DataConfig(val_fraction=0.2), train, preset=name)


@register("vit")
class ViTFamily(Family):
    """The ViT: LayerNorm with weight and bias, biases on every projection, a GELU MLP, bidirectional attention
    and no RoPE (positions are added to the patch embeddings). Images in, classes out."""

    hf_class = "ViTForImageClassification"
    hf_names = {"vit": "ViT"}
    qkv_bias = out_bias = True
    norm = "layernorm_affine"
    mlp, activation = "plain", "gelu"
    causal = False
    presets = {**{name: imagenet_preset for name in SHAPES}, "vit-digits": digits_preset}

    def check(self, m: ModelConfig) -> None:
        for name in ("image_size", "patch_size", "channels", "num_classes"):
            require(getattr(m, name) > 0, f"model.{name} must be positive, got {getattr(m, name)}")
        require(m.image_size % m.patch_size == 0,
                f"model.patch_size={m.patch_size} must divide model.image_size={m.image_size}")
        require(m.pool in ("cls", "mean"), f"model.pool must be cls or mean, got {m.pool!r}")
        require(m.pos_embed in ("learned", "sincos"), f"model.pos_embed must be learned or sincos, got {m.pos_embed!r}")
        require(m.pos_embed != "sincos" or m.dim % 4 == 0,
                f"model.pos_embed=sincos needs model.dim divisible by 4, got {m.dim}")
        require(not m.tie_embeddings, "model.tie_embeddings has no meaning for a ViT (no token embedding)")
        require(m.head_size is None, "model.head_size is not a ViT's: its heads are dim / n_heads wide")

    def outer_matmul_params(self, cfg: ModelConfig, seq_len: int) -> float:
        """A token is a patch: its embedding is a matmul, and the class head runs once per image (seq_len
        tokens)."""
        return cfg.channels * cfg.patch_size ** 2 * cfg.dim + cfg.dim * cfg.num_classes / seq_len
