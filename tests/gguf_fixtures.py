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


GEMMA3_PARTS = {**{k: v for k, v in PARTS.items() if k != "post_attention_layernorm"},
                "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}
BIASES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v"}  # Qwen2's


SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def sentencepiece_pieces() -> list[str]:
    """A Gemma-style vocabulary (what a Gemma GGUF carries: SentencePiece pieces, no merges): the specials, the
    characters of TEXT with "\u2581" for a space, and its words: what `write_gguf` writes for a Gemma-3."""
    chars = sorted(set(TEXT.replace(" ", "\u2581")))
    words = sorted({"\u2581" + w for w in TEXT.split()})
    return [*SPECIALS, *chars, *(w for w in words if w not in chars)]


def _sentencepiece_vocab(w, tok) -> None:
    pieces = sentencepiece_pieces()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores([-float(i) for i in range(len(pieces))])
    w.add_token_types([gguf.TokenType.CONTROL if p in SPECIALS[:3] else gguf.TokenType.UNKNOWN if p == "<unk>"
                       else gguf.TokenType.NORMAL for p in pieces])
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)


def tiny_qwen2(vocab_size: int, n_layers: int = 4):
    """A tiny random Qwen2 (biases on q, k, v, made non-zero here; an untied head)."""
    config = transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      bos_token_id=0, eos_token_id=0)
    return _nontrivial(transformers.Qwen2ForCausalLM(config))


def gguf_gemma3(vocab_size: int, n_layers: int = 6):
    """A tiny random Gemma-3 as its GGUF reader rebuilds it: blocks 1-5 sliding-window (window 8, RoPE base 10,000),
    block 6 global (base 1,000,000); a tied head; sandwich and q/k norms."""
    config = transformers.Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=8, sliding_window=8, max_position_embeddings=64,
                                           rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return _nontrivial(transformers.Gemma3ForCausalLM(config))


def _nontrivial(model):
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
    return model


def write_gguf(path, model, tok, matrix_dtype=np.float16, leave_out=()) -> None:
    """`model` (a Llama, Qwen2 or Gemma-3 for causal LM) and `tok` as a GGUF file as llama.cpp's converter writes it:
    matrices in `matrix_dtype` (float16: type F16; float64: F64, a type no GGUF reader dequantizes), norms and
    biases in float32; Llama's q and k rows permuted, Gemma's norm weights stored as 1 + w. The tensors named in
    `leave_out` (GGUF names, e.g. "output_norm.weight") are not stored, though the header still implies them."""
    cfg = model.config
    arch = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3"}[cfg.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    if arch == "gemma3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(cfg.sliding_window)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if matrix_dtype == np.float16 else gguf.LlamaFileType.ALL_F32)
    if arch == "gemma3":
        _sentencepiece_vocab(w, tok)
    else:
        d = json.loads(tok.to_str())
        vocab = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list([t for t, _ in vocab])
        w.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL
                           for t, _ in vocab])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]])
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def put(name, a, matrix=True):
        if name in leave_out:
            return
        if arch == "gemma3" and not matrix and name.endswith("norm.weight"):
            a = a + 1  # llama.cpp stores Gemma's (1 + w); the reader takes the 1 off
        w.add_tensor(name, np.ascontiguousarray(a.astype(matrix_dtype if matrix else np.float32)))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, ours in (GEMMA3_PARTS if arch == "gemma3" else PARTS).items():
            a = sd[f"model.layers.{i}.{hf}.weight"]
            if arch == "llama" and ours == "attn_q":
                a = _permute(a, cfg.num_attention_heads)
            elif arch == "llama" and ours == "attn_k":
                a = _permute(a, cfg.num_key_value_heads)
            put(f"blk.{i}.{ours}.weight", a, matrix=a.ndim == 2)
        for hf, ours in BIASES.items() if arch == "qwen2" else ():
            put(f"blk.{i}.{ours}.bias", sd[f"model.layers.{i}.{hf}.bias"], matrix=False)
    put("output_norm.weight", sd["model.norm.weight"], matrix=False)
    if "lm_head.weight" in sd and not getattr(cfg, "tie_word_embeddings", False):
        put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
