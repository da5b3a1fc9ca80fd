import copy

import pytest
import torch

from depthlab import UserError
from depthlab.hf import apply_scheme, import_hf, load_pretrained
from depthlab.model.apply import current_scheme
from depthlab.model.blocks import block_norms, find_blocks
from tests.families import FAMILIES
from tests.scheme_oracles import names as oracle_names
from tests.test_hf_fixtures import tiny_hf


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def folded_by_hand(model, power=0.5):
    """A plain copy with block l's norm weights times l^(-p): what LNS must compute (docs/method.md section 1)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for l, layer in enumerate(twin.model.layers, 1):
            for name in FAMILIES[twin.config.model_type].hf_block_norms:
                getattr(layer, name).weight.mul_(l ** -power)
    return twin


@pytest.mark.parametrize("family", FAMILIES)
def test_blocks_and_norms_are_discovered_generically(family):
    model = tiny_hf(family)
    prefix, blocks = find_blocks(model)
    assert prefix == "model.layers" and len(blocks) == 4
    assert tuple(name for name, _ in block_norms(blocks[0])) == FAMILIES[family].hf_block_norms


@pytest.mark.parametrize("family", [f for f, facts in FAMILIES.items() if facts.apply_lns])
def test_lns_scales_each_block_norm_by_one_over_sqrt_l(family):
    model = tiny_hf(family)
    ids = torch.randint(0, 97, (2, 11))
    want = logits(folded_by_hand(model), ids)
    before = logits(model, ids)
    apply_scheme(model, "lns")
    assert model.config.depthlab_scheme == "lns"
    got = logits(model, ids)
    assert (got - want).abs().max() < 1e-5 and (got - before).abs().max() > 1e-3
    apply_scheme(model, "pre")  # back to the original function, and the record is gone
    assert (logits(model, ids) - before).abs().max() < 1e-6 and not hasattr(model.config, "depthlab_scheme")


@pytest.mark.parametrize("family,match", [("olmo", "no weight to fold.*depthlab import"),
                                          ("gemma2", "does not scale linearly with its weight")])
def test_norms_lns_cannot_fold_into_are_refused(family, match):  # OLMo-1's: no weight; Gemma's: 1 + w
    assert not FAMILIES[family].apply_lns
    with pytest.raises(UserError, match=match):
        apply_scheme(tiny_hf(family), "lns")


def test_lns_power_is_a_parameter():
    model = tiny_hf("llama")
    ids = torch.randint(0, 97, (2, 11))
    want = logits(folded_by_hand(model, power=1.0), ids)
    assert (logits(apply_scheme(model, "lns", lns_power=1.0), ids) - want).abs().max() < 1e-5


def test_hf_lns_matches_depthlab_lns():
    """The HF patch and depthlab's own LNS block are the same function of the same weights."""
    model = tiny_hf("llama")
    ours, _ = import_hf(model, scheme="lns")
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        assert (ours(ids) - logits(apply_scheme(model, "lns"), ids)).abs().max() < 1e-5


@pytest.mark.parametrize("family", ["llama", "qwen2", "olmo2"])
def test_apply_train_save_reload(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = apply_scheme(tiny_hf(family), "lns").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 97, (4, 16))
    losses = []
    for _ in range(5):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    raw = {k: v.detach().clone() for k, v in model.named_parameters()}
    want = logits(model, ids)
    model.save_pretrained(tmp_path / "m")

    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()  # plain HF: the scale is in the weights
    assert stock.config.depthlab_scheme == "lns"
    assert (logits(stock, ids) - want).abs().max() < 1e-5

    back = load_pretrained(tmp_path / "m").eval()  # depthlab: unfolded, hooks back, ready to train on
    assert (logits(back, ids) - want).abs().max() < 1e-5
    for k, v in back.named_parameters():
        assert torch.allclose(v, raw[k], rtol=1e-6, atol=1e-7), k
    with pytest.raises(UserError, match="load_pretrained"):
        apply_scheme(stock, "lns")  # would scale the already-folded weights twice


def test_state_dict_round_trip_keeps_training_form():
    model = apply_scheme(tiny_hf("llama"), "lns")
    twin = apply_scheme(tiny_hf("llama", n_layers=4), "lns")
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(0, 97, (2, 11))
    assert (logits(twin, ids) - logits(model, ids)).abs().max() < 1e-6
    w = model.model.layers[3].input_layernorm.weight
    assert torch.allclose(twin.model.layers[3].input_layernorm.weight, w, rtol=1e-6)
    assert torch.allclose(model.state_dict()["model.layers.3.input_layernorm.weight"], w / 2, rtol=1e-6)


@pytest.mark.parametrize("scheme", oracle_names(hf_patchable=True))
def test_the_patchable_schemes_patch(scheme):
    assert current_scheme(apply_scheme(tiny_hf("llama"), scheme)) == scheme


@pytest.mark.parametrize("scheme", oracle_names(hf_patchable=False) + ["nonsense"])
def test_other_schemes_are_refused_with_the_reason(scheme):
    with pytest.raises(UserError, match=rf"{scheme}.*(rewires|not a scheme)"):
        apply_scheme(tiny_hf("llama"), scheme)


def test_generic_decoder_with_layernorm():
    """A decoder that is not one of the named families: GPT-2 style LayerNorms with biases (ln_1, ln_2)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=3, n_head=4, n_positions=64)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    prefix, blocks = find_blocks(model)
    assert prefix == "transformer.h" and [n for n, _ in block_norms(blocks[0])] == ["ln_1", "ln_2"]
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for l, block in enumerate(twin.transformer.h, 1):
            for norm in (block.ln_1, block.ln_2):
                norm.weight.mul_(l ** -0.5)
                norm.bias.mul_(l ** -0.5)
    ids = torch.randint(0, 97, (2, 9))
    assert (logits(apply_scheme(model, "lns"), ids) - logits(twin, ids)).abs().max() < 1e-5


def test_load_pretrained_of_a_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        load_pretrained(tmp_path / "missing")
