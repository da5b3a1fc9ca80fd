"""A tiny GGUF file written here, from a tiny random Llama and a byte-level BPE tokenizer trained on the spot, as
llama.cpp's converter writes one (its tensor names, its q/k row order, its metadata keys): what the GGUF tests read.
No tests here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TEXT = ("the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. "
        "def add(a, b):\n    return a + b\n") * 20
PARTS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def bpe_tokenizer(vocab_size: int = 300):
    """A byte-level BPE (GPT-2's kind, as SmolLM2's) with <|endoftext|> as token 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def tiny_llama(vocab_size: int, n_layers: int = 4):
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for q and k (interleaved rotary halves)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, tok, matrix_dtype=np.float16) -> None:
    """`model` (a LlamaForCausalLM) and `tok` as a GGUF file: matrices in `matrix_dtype` (float16: type F16;
    float64: F64, a type no GGUF reader dequantizes), norms in float32."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta if hasattr(cfg, "rope_theta") else 10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if matrix_dtype == np.float16 else gguf.LlamaFileType.ALL_F32)
    d = json.loads(tok.to_str())
    vocab = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def put(name, a, matrix=True):
        w.add_tensor(name, np.ascontiguousarray(a.astype(matrix_dtype if matrix else np.float32)))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, ours in PARTS.items():
            a = sd[f"model.layers.{i}.{hf}.weight"]
            if ours == "attn_q":
                a = _permute(a, cfg.num_attention_heads)
            elif ours == "attn_k":
                a = _permute(a, cfg.num_key_value_heads)
            put(f"blk.{i}.{ours}.weight", a, matrix=a.ndim == 2)
    put("output_norm.weight", sd["model.norm.weight"], matrix=False)
    put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
