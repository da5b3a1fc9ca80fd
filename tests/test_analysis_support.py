"""Builders shared by the analysis tests: tiny depthlab models and checkpoints, tiny HF models with a tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from depthlab.analysis.calibration import Batch
from depthlab.config import Config
from tests.conftest import tiny_model_config

TEXT = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}  # line {i}" for i in range(300))


def tiny_tokenizer(vocab: int = 300):
    from depthlab.data.tokenizer import train_bpe

    return train_bpe([TEXT], vocab)


def zero_block(model, l: int) -> None:
    """Make depthlab block l (0-based) an exact identity: both branches end in a zero projection."""
    blk = model.layers[l]
    torch.nn.init.zeros_(blk.attn.o_proj.weight)
    torch.nn.init.zeros_(blk.mlp.down_proj.weight)


def random_batches(vocab: int, n: int = 2, B: int = 2, T: int = 24, seed: int = 0) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [Batch(torch.randint(0, vocab, (B, T), generator=g), torch.ones(B, T, dtype=torch.bool)) for _ in range(n)]


def write_checkpoint(path: Path, model, cfg: Config, meta: dict, tokenizer) -> Path:
    from depthlab.checkpoint import save_checkpoint

    return save_checkpoint(path, model.state_dict(), cfg, meta, tokenizer)


def save_depthlab_checkpoint(path: Path, scheme: str = "pre", n_layers: int = 4, zero: int | None = None) -> Path:
    from depthlab.model import Transformer

    tok = tiny_tokenizer()
    cfg = Config()
    cfg.model = tiny_model_config(norm_scheme=scheme, n_layers=n_layers, vocab_size=tok.get_vocab_size(),
                                  max_seq_len=64)
    cfg.data.seq_len = 32
    model = Transformer(cfg.model)
    with torch.no_grad():  # larger weights than N(0, 0.02), so blocks do visible work in a few tokens
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    if zero is not None:
        zero_block(model, zero)
    return write_checkpoint(path, model, cfg, {"step": 0}, tok)


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


def save_hf_model(path: Path, family: str) -> Path:
    import transformers

    from depthlab.data.tokenizer import EOT

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), eos_token=EOT, pad_token=EOT)
    model = tiny_hf_model(family, vocab=len(tok))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
