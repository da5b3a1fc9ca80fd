"""Tiny random models for the benchmarks that time code on a model of no particular quality, and for the tests
(tests/test_analysis_support.py hands them on): depthlab checkpoints and HF causal LMs with a small BPE tokenizer
trained on a synthetic code-like text, and HF checkpoints of any size saved shard by shard."""

from __future__ import annotations

from pathlib import Path

import torch

from depthlab.config import Config, ModelConfig

TEXT = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}  # line {i}" for i in range(300))


def tiny_tokenizer(vocab: int = 300):
    from depthlab.data.tokenizer import train_bpe

    return train_bpe([TEXT], vocab)


def zero_block(model, l: int) -> None:
    """Make depthlab block l (0-based) an exact identity: both branches end in a zero projection."""
    blk = model.layers[l]
    torch.nn.init.zeros_(blk.attn.o_proj.weight)
    torch.nn.init.zeros_(blk.mlp.down_proj.weight)


def write_checkpoint(path: Path, model, cfg: Config, meta: dict, tokenizer) -> Path:
    from depthlab.checkpoint import save_checkpoint

    return save_checkpoint(path, model.state_dict(), cfg, meta, tokenizer)


def save_depthlab_checkpoint(path: Path, scheme: str = "pre", n_layers: int = 4, zero: int | None = None,
                             step: int = 0, **model) -> Path:
    from depthlab.model import Transformer

    tok = tiny_tokenizer()
    cfg = Config()
    cfg.model = ModelConfig(**{"dim": 32, "n_heads": 4, "ffn_dim": 64, "norm_scheme": scheme, "n_layers": n_layers,
                               "vocab_size": tok.get_vocab_size(), "max_seq_len": 64, **model})
    cfg.data.seq_len = 32
    model = Transformer(cfg.model)
    with torch.no_grad():  # larger weights than N(0, 0.02), so blocks do visible work in a few tokens
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    if zero is not None:
        zero_block(model, zero)
    return write_checkpoint(path, model, cfg, {"step": step}, tok)


HF_FAMILIES = ("llama", "mistral", "qwen2", "gpt2", "olmo2")


def tiny_hf_model(family: str, vocab: int = 300, n_layers: int = 4):
    import transformers

    common = dict(bos_token_id=0, eos_token_id=0, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=n_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfgs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "olmo2": lambda: transformers.Olmo2Config(**common),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=n_layers, n_head=4,
                                                n_positions=64, bos_token_id=0, eos_token_id=0),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfgs[family]())
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return model.eval()


def save_hf_model(path: Path, family: str, n_layers: int = 4) -> Path:
    import transformers

    from depthlab.data.tokenizer import EOT

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), eos_token=EOT, pad_token=EOT)
    model = tiny_hf_model(family, vocab=len(tok), n_layers=n_layers)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_random_hf(folder: Path, config, layers_per_shard: int = 4) -> int:
    """An HF causal LM of any size with N(0, 0.02) weights and unit norms, saved in bf16 shards of a few layers
    (never held whole: the layer-by-layer memory benchmark's model) with a small tokenizer; its parameter count."""
    import json

    import transformers
    from safetensors.torch import save_file

    from depthlab.data.tokenizer import EOT

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in transformers.AutoModelForCausalLM.from_config(config).state_dict().items()}
    group = lambda k: int(k.split(".")[2]) // layers_per_shard if ".layers." in k else -1  # noqa: E731
    weight_map = {}
    for g in sorted(set(map(group, shapes))):
        name = f"model-{g + 1:05d}.safetensors"
        shard = {k: torch.ones(s, dtype=torch.bfloat16) if len(s) == 1 else
                 torch.empty(s, dtype=torch.bfloat16).normal_(0, 0.02) for k, s in shapes.items() if group(k) == g}
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    size = sum(2 * torch.Size(s).numel() for s in shapes.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": size},
                                                                     "weight_map": weight_map}))
    config.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), eos_token=EOT).save_pretrained(folder)
    return sum(torch.Size(s).numel() for s in shapes.values())
