"""One table of what the tests know about each language model family, in one place, as tests/scheme_oracles.py is
for the schemes: transformers' config and model class, the tiny random HF model and the tiny depthlab model the tests
build of it, the scheme that is its stock block, which schemes run on it, and what depthlab.hf.apply_scheme finds in
its blocks.

The tests that cover every family (tests/test_arch.py, test_hf_*.py) iterate over FAMILIES and read each family's
facts here; tests/test_arch.py fails while a registered language family has no row. So a new family is its module
in src/depthlab/model/families/, its row here, and its rows in the docs. (The vit family: tests/test_vit*.py.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.scheme_oracles import ORACLES, names as oracle_names


@dataclass(frozen=True)
class Facts:
    hf_config: str  # transformers' config class
    hf_class: str  # the stock class its own block exports to and imports from
    hf: dict = field(default_factory=dict)  # its tiny HF config's fields beyond the shape all families share
    ours: dict = field(default_factory=dict)  # ModelConfig fields of a tiny depthlab model of the family
    own_scheme: str = "pre"  # the scheme that is its stock block: import's default, the HF model's logits
    fixed_wiring: bool = False  # its block fixes where the norms sit: only its own scheme and those that keep the
    # wiring as it is (ORACLES' olmo2 column, pre aside) run on it; else every scheme does
    hf_block_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")  # the residual-branch norms
    # apply_scheme finds in a block (OLMo-2's q_norm / k_norm sit inside attention)
    apply_lns: bool = True  # apply_scheme patches LNS onto its HF model (OLMo-1's norms have no weight, Gemma's
    # output 1 + w: refused)
    exports_to: tuple[str, ...] = ("family",)  # the schemes' stock forms (ORACLES' hf_export) its models export to:
    # its own class, and Gemma-2 for the families whose sandwich is Gemma-2's block

    def runs(self) -> list[str]:
        """The schemes that run on the family, in registry order."""
        from depthlab.model import SCHEMES

        if not self.fixed_wiring:
            return list(SCHEMES)
        keep = {self.own_scheme} | {n for n in oracle_names(olmo2=True) if n != "pre"}
        return [n for n in SCHEMES if n in keep]

    def exported(self) -> list[str]:
        """The schemes whose models of this family export to a stock class, in registry order."""
        return [n for n in self.runs() if ORACLES[n].hf_export in self.exports_to]


FAMILIES = {
    "llama": Facts("LlamaConfig", "LlamaForCausalLM", exports_to=("family", "gemma2")),
    "mistral": Facts("MistralConfig", "MistralForCausalLM", hf={"sliding_window": 6}, ours={"sliding_window": 6}),
    "qwen2": Facts("Qwen2Config", "Qwen2ForCausalLM"),
    "olmo": Facts("OlmoConfig", "OlmoForCausalLM", hf={"clip_qkv": 0.5}, ours={"norm_eps": 1e-5}, apply_lns=False),
    "olmo2": Facts("Olmo2Config", "Olmo2ForCausalLM", fixed_wiring=True,
                   hf_block_norms=("post_attention_layernorm", "post_feedforward_layernorm")),
    # heads of 16 at width 32 (not 32 / 4), a window of 5 in layers 1 and 3 (1-based), soft caps that act on a
    # tiny model's small scores; no padding token, whose embedding transformers zeroes: the start token's zero
    # vector through Gemma's norm after the branch (1 / sqrt(eps)) in every block blows the gradient up to inf
    "gemma2": Facts("Gemma2Config", "Gemma2ForCausalLM",
                    hf={"head_dim": 16, "sliding_window": 5, "query_pre_attn_scalar": 12, "pad_token_id": None,
                        "attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0},
                    ours={"head_size": 16, "sliding_window": 5, "query_pre_attn_scalar": 12, "attn_softcap": 0.5,
                          "logit_softcap": 2.0},
                    own_scheme="sandwich", fixed_wiring=True, apply_lns=False, exports_to=("family", "gemma2"),
                    hf_block_norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                    "post_feedforward_layernorm")),
}
