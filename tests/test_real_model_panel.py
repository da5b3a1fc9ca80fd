"""The real-model panel's removals (benchmarks/real_model_panel.py) on tiny random models: a block taken out in place
(its input handed on) and replayed from the traced prefix gives the logits of the model transformers builds without
it (for Gemma-3: the block list and `layer_types` edited, so each kept block keeps its kind's mask and RoPE table)."""

import copy

import pytest
import torch

from benchmarks.real_model_panel import LossObjective, Panel, sweep

transformers = pytest.importorskip("transformers")
KINDS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]


def tiny(family: str, kinds: list[str] = KINDS):
    torch.manual_seed(0)
    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=len(kinds),
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                 bos_token_id=0, eos_token_id=0)
    if family == "gemma3":
        config = transformers.Gemma3TextConfig(**shape, head_dim=8, sliding_window=4, layer_types=kinds,
                                               query_pre_attn_scalar=8)
    else:
        config = transformers.Qwen2Config(**shape)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)  # blocks that do visible work
    return model


def without(model, l: int):
    """transformers' own model without block l (1-based), as `prune` writes it."""
    m = copy.deepcopy(model)
    del m.model.layers[l - 1]
    m.config.num_hidden_layers -= 1
    if getattr(m.config, "layer_types", None):
        m.config.layer_types = [t for i, t in enumerate(m.config.layer_types) if i != l - 1]
    for i, layer in enumerate(m.model.layers):
        layer.self_attn.layer_idx = i
    return m


@pytest.mark.parametrize("family", ["gemma3", "qwen2"])
def test_a_block_taken_out_in_place_or_from_the_trace_is_the_pruned_model(family):
    model = tiny(family)
    panel = Panel(family, model, None)
    x = torch.randint(1, 97, (2, 13))  # longer than Gemma's sliding window: the masks differ by kind
    h, calls = panel.trace(x)
    assert torch.allclose(panel.head(h), model(x).logits, atol=1e-5)
    for l in range(1, len(KINDS) + 1):
        want = without(model, l)(x).logits
        with panel.removed([l]):
            in_place = panel.head(panel.hidden(x))
        assert torch.allclose(in_place, want, atol=1e-5), l
        assert torch.allclose(panel.head(panel.resume(calls, l)), want, atol=1e-5), l
        for part in ("attn", "mlp"):
            with panel.removed([l], part):
                full = panel.head(panel.hidden(x))
            assert torch.allclose(panel.head(panel.resume(calls, l, part)), full, atol=1e-5), (l, part)
            assert not torch.allclose(full, panel.head(h), atol=1e-3)  # the part did work


def test_the_sweep_reads_each_removal_as_a_full_pass_does():
    model = tiny("gemma3")
    panel = Panel("gemma3", model, None)
    obj = LossObjective(panel, torch.randint(1, 97, (6, 13)), batch=4)
    got = sweep(panel, obj, "test")
    assert got["base"] == pytest.approx(obj.outcomes(panel), abs=1e-4)
    for l in range(1, len(KINDS) + 1):
        with panel.removed([l]):
            assert got["removed"][l - 1] == pytest.approx(obj.outcomes(panel), abs=1e-4)
