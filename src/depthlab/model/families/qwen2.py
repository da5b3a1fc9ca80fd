"""The qwen2 family: LLaMA's block with biases on the q, k and v projections; exported as the Llama it equals where
transformers would give the export a tokenizer other than the run's."""

from __future__ import annotations

import torch

from depthlab.model.families.base import Family, register, released_preset

O_BIAS = ".self_attn.o_proj.bias"


@register("qwen2")
class Qwen2(Family):
    """Qwen2 / Qwen2.5: biases on q, k, v (every released one has nonzero ones), none on o or the MLP."""

    hf_class = "Qwen2ForCausalLM"
    hf_names = {"qwen2": "Qwen2"}
    qkv_bias = True
    # Qwen2.5-0.5B's shape; the paper's run: 6B tokens, PPL 20.62 -> 19.57
    presets = {"qwen2.5-0.5b": lambda name: released_preset(
        name, "qwen2", 6e9, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864, vocab_size=151_936,
        tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6, max_seq_len=4096)}

    def hf_fallback(self, hf_state, fields):
        """transformers 5 loads every qwen2 directory's tokenizer as a Qwen2Tokenizer, with Qwen2's own normalizer
        and split regex whatever tokenizer_config.json names; where that encodes text otherwise than the run's
        tokenizer, the export is the Llama with attention biases it equals (Llama's attention_bias puts biases on
        q, k, v and o: o's are zeros)."""
        state = dict(hf_state)
        for key in [k for k in state if k.endswith(".self_attn.o_proj.weight")]:
            state[key.removesuffix(".weight") + ".bias"] = torch.zeros(state[key].shape[0], dtype=state[key].dtype)
        return state, {**fields, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                       "attention_bias": True}, (
            "this qwen2 run is exported as a LlamaForCausalLM with attention biases (o_proj's zero), the same "
            "function: transformers loads every qwen2 directory's tokenizer with Qwen2's own normalizer and split "
            "regex, which would encode text differently from this run's tokenizer")

    def claims(self, hf_cfg, hf_state) -> bool:
        """That Llama read back: attention biases, o_proj's all zero."""
        biases = [v for k, v in hf_state.items() if k.endswith(O_BIAS)]
        return (hf_cfg.model_type == "llama" and getattr(hf_cfg, "attention_bias", False) and bool(biases)
                and not any(b.any() for b in biases))

    def from_hf_weights(self, hf_state, cfg):  # without that Llama's zero o_proj biases (a nonzero one stays, and
        # loading refuses it)
        return super().from_hf_weights({k: v for k, v in hf_state.items() if not (k.endswith(O_BIAS) and not v.any())},
                                       cfg)
