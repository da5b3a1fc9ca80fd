"""The llama family: the LLaMA block as it is (depthlab.model.families.base.Family), and the paper's presets."""

from __future__ import annotations

from depthlab.config import Config, DataConfig, ModelConfig, TrainConfig
from depthlab.model.families.base import Family, register

# The paper's LLaMA sizes (docs/method.md section 3): sequence 256, global batch 512, cosine to 10%, Adam, wd 0,
# embedding std sqrt(2/5) as in the paper-era reference code.
PAPER = {
    #            dim, layers, heads, ffn,  lr,   warmup, steps
    "llama-71m": (512, 12, 8, 1368, 1e-3, 1000, 10_000),
    "llama-130m": (768, 12, 12, 2048, 1e-3, 2000, 20_000),
    "llama-250m": (768, 24, 16, 2560, 1e-3, 4000, 40_000),
    "llama-350m": (1024, 24, 16, 2736, 5e-4, 6000, 60_000),
    "llama-1b": (2048, 24, 32, 5461, 5e-4, 1000, 100_000),
}


def paper_preset(name: str) -> Config:
    dim, layers, heads, ffn, lr, warmup, steps = PAPER[name]
    # The paper used T5's tokenizer (32,100 tokens); 32,128 = T5's own embedding size, a multiple of 64.
    model = ModelConfig(vocab_size=32128, dim=dim, n_layers=layers, n_heads=heads, ffn_dim=ffn, max_seq_len=256,
                        norm_scheme="lns", embed_std=(2 / 5) ** 0.5)
    data = DataConfig(seq_len=256)
    train = TrainConfig(max_steps=steps, global_batch=512, batch_size=64, grad_accum=8, lr=lr, warmup_steps=warmup,
                        dtype="bf16", eval_every=1000, log_every=10, ckpt_every=1000)
    if dim >= 2048:  # >= 1B parameters: sharded (DDP would hold the full model, gradients and AdamW on every GPU)
        train.parallel = "fsdp"
    return Config(model, data, train, preset=name)


@register("llama")
class Llama(Family):
    """LLaMA: RMSNorm with a weight, no biases, SwiGLU, rotate-half RoPE."""

    hf_class = "LlamaForCausalLM"
    hf_names = {"llama": "Llama"}
    presets = {"cpu-tiny": lambda name: Config(), **{name: paper_preset for name in PAPER}}
