"""Generic discovery on tiny random HF models of five families, padding-aware batches, and clear refusals."""

import pytest
import torch

from depthlab import UserError
from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.calibration import Batch
from depthlab.analysis.layers import LayeredLM, from_hf
from tests.test_analysis_support import HF_FAMILIES, random_batches, tiny_hf_model

transformers = pytest.importorskip("transformers")

# Where the stream between attention and MLP is read, per the HF source of each family.
MID_PROBE = {"llama": "post_attention_layernorm", "mistral": "post_attention_layernorm",
             "qwen2": "post_attention_layernorm", "gpt2": "ln_2", "olmo2": "mlp"}
FINAL_NORM = {"gpt2": "transformer.ln_f"}


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_discovery_and_raw_vs_final_normed(family):
    model = tiny_hf_model(family)
    lm = from_hf(model, family)
    b = random_batches(300, n=1)[0]
    lm.discover(b.ids, b.mask)
    assert lm.n_layers == 4
    assert lm.norm_path == FINAL_NORM.get(family, "model.norm")
    probe_mod = lm.mid_probes[0][0]
    assert next(n for n, m in lm.blocks[0].named_children() if m is probe_mod) == MID_PROBE[family]
    tr = lm.trace(b.ids, b.mask)
    with torch.no_grad():
        hf_hidden = model(input_ids=b.ids, output_hidden_states=True).hidden_states
    for l in range(4):  # our stream states are HF's, except the last
        assert torch.allclose(tr.hidden[l], hf_hidden[l], atol=1e-6)
    # HF's last entry is already final-normed; ours is the raw block output, and norm(raw) is HF's
    assert not torch.allclose(tr.hidden[4], hf_hidden[4], atol=1e-3)
    assert torch.allclose(lm.final_norm(tr.hidden[4]), hf_hidden[4], atol=1e-5)
    # the attention/MLP split adds up, and the attention half is a real, non-zero share
    a, m, o = tr.hidden[1], tr.mid[1], tr.hidden[2]
    assert (m - a).norm() > 1e-3 and (o - m).norm() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_padding_never_changes_the_metrics(family):
    """Two sequences padded into one batch give the same last-token distances, lens and losses as each sequence
    alone: pads are never the 'last token' and never counted."""
    lm = from_hf(tiny_hf_model(family), family)
    g = torch.Generator().manual_seed(3)
    s1, s2 = torch.randint(0, 300, (20,), generator=g), torch.randint(0, 300, (13,), generator=g)
    ids = torch.full((2, 20), 7)
    ids[0], ids[1, :13] = s1, s2
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[0], mask[1, :13] = True, True
    opts = Options(jacobian=False)
    padded = analyze(lm, [Batch(ids, mask)], opts)
    alone = analyze(lm, [Batch(s1[None], torch.ones(1, 20, dtype=torch.bool)),
                         Batch(s2[None], torch.ones(1, 13, dtype=torch.bool))], opts)
    for key in ("last_token", "all_tokens"):
        assert torch.allclose(torch.tensor(padded["angular"][key]), torch.tensor(alone["angular"][key]), atol=1e-4)
    assert padded["tokens"] == alone["tokens"] == 33
    for k in ("kl", "ce"):
        assert torch.allclose(torch.tensor(padded["lens"][k]), torch.tensor(alone["lens"][k]), rtol=1e-4)
    assert padded["removal"]["base_loss"] == pytest.approx(alone["removal"]["base_loss"], rel=1e-5)
    assert padded["states"][-1]["variance"] == pytest.approx(alone["states"][-1]["variance"], rel=1e-5)


def test_base_loss_matches_transformers_loss():
    model = tiny_hf_model("qwen2")
    b = random_batches(300, n=1)[0]
    res = analyze(from_hf(model, "qwen2"), [b], Options(jacobian=False))
    with torch.no_grad():
        want = model(input_ids=b.ids, labels=b.ids).loss.item()
    assert res["removal"]["base_loss"] == pytest.approx(want, rel=1e-5)


def test_unsupported_architecture_names_what_was_found():
    class NoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.heads = torch.nn.ModuleList([torch.nn.Linear(4, 10), torch.nn.ReLU()])

    with pytest.raises(UserError, match=r"cannot find the decoder blocks of NoBlocks: no list of repeated blocks; "
                                        r"module lists found: heads"):
        LayeredLM(NoBlocks(), None, "x", "hf", None)


def test_logit_scaling_is_refused_clearly():
    model = tiny_hf_model("llama")
    lm = from_hf(model, "scaled")
    inner = lm.forward_fn
    lm.forward_fn = lambda ids, mask: 0.5 * inner(ids, mask)  # as Cohere's logit_scale would
    b = random_batches(300, n=1)[0]
    with pytest.raises(UserError, match="does not reproduce the model's logits"):
        lm.discover(b.ids, b.mask)


def test_discovery_checks_the_head_on_one_sequence():
    """Discovery reads the head on the first sequence only, in one traced pass (which also finds the mid-block
    probe) and its check: the whole batch's logits and allclose's temporaries of their size tripled SmolLM2's
    layer-by-layer peak, and each pass over the batch cost an analysis a forward pass."""
    lm = from_hf(tiny_hf_model("llama"), "llama")
    b = random_batches(300, n=1)[0]
    seen = []
    lm.head.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    lm.discover(b.ids, b.mask)
    assert b.ids.shape[0] == 2 and seen == [1, 1]  # the traced pass, the check
