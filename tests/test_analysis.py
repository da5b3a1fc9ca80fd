"""The metrics on cases with known answers, on depthlab models."""

import math

import pytest
import torch

from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.calibration import Batch, last_real_index, pack_windows
from depthlab.analysis.jacobian import block_jacobian, token_jacobian
from depthlab.analysis.layers import from_depthlab
from depthlab.analysis.removal import naive_single_layer_sweep
from depthlab.metrics import Accumulator, angular_distance, cosine, pairwise_angular, unit
from depthlab.model import Transformer
from tests.conftest import tiny_model_config
from tests.test_analysis_support import random_batches, zero_block


def tiny_lm(n_layers=4, scheme="pre", zero=None):
    model = Transformer(tiny_model_config(n_layers=n_layers, norm_scheme=scheme)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    if zero is not None:
        zero_block(model, zero)
    return from_depthlab(model, "tiny")


def test_angular_distance_known_values_and_precision():
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert angular_distance(e1, e1).item() == 0.0
    assert angular_distance(e1, e2).item() == pytest.approx(0.5)
    assert angular_distance(e1, -e1).item() == pytest.approx(1.0)
    assert angular_distance(e1, (e1 + e2) / math.sqrt(2)).item() == pytest.approx(0.25)
    # rounding makes cos of a vector with a multiple of itself exceed 1 in fp32; the distance stays exactly 0
    x = torch.full((4096,), 0.1) + torch.linspace(0, 1e-3, 4096)
    assert cosine(x, x * 3.0).item() <= 1.0
    assert angular_distance(x, x).item() == 0.0
    assert angular_distance(x, x * 4.0).item() < 1e-6
    small = torch.tensor([1.0, 1e-3])  # an angle of 1e-3 rad, where acos(cos) in fp32 is off by tens of percent
    assert angular_distance(e1, small).item() == pytest.approx(math.atan(1e-3) / math.pi, rel=1e-4)
    assert torch.isfinite(angular_distance(torch.zeros(3), e1.new_tensor([1.0, 2, 3])))


def test_pairwise_angular_matches_loop():
    units = unit(torch.randn(5, 7, 16))
    got = pairwise_angular(units)
    for i in range(5):
        for j in range(5):
            want = angular_distance(units[i], units[j]).sum()
            assert got[i, j].item() == pytest.approx(want.item(), abs=1e-4)


def test_stream_statistics_known_tensor():
    acc = Accumulator(1)
    h = torch.tensor([[[1.0, -1.0], [3.0, -3.0], [100.0, 100.0]]])  # the third token is padding
    mask = torch.tensor([[True, True, False]])
    ids = torch.tensor([[5, 6, 7]])
    acc.stream(0, h, mask, ids)
    st = acc.results()["states"][0]
    assert st["mean"] == pytest.approx(0.0)
    assert st["variance"] == pytest.approx(5.0)  # E[x^2] = (1 + 1 + 9 + 9) / 4
    assert st["rms"] == pytest.approx(math.sqrt(5.0))
    assert st["max_abs"] == 3.0 and st["channel"] == 0 and st["position"] == 1 and st["token_id"] == 6


def test_last_real_index_right_and_left_padding():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.bool)
    assert last_real_index(mask).tolist() == [2, 4, 3]


def test_pack_windows_has_no_padding():
    import numpy as np

    w = pack_windows(np.arange(100), n_tokens=50, seq_len=16)
    assert len(w) == 4 and all(len(x) == 16 for x in w)


def test_identity_block_known_answers():
    """A block whose output projections are zero is the identity: update ratio 0, distance 0 to its input,
    block influence 0, removing it costs exactly nothing, and its Jacobian is exactly I."""
    lm = tiny_lm(zero=1)
    res = analyze(lm, random_batches(97), Options(probes=2))
    b = res["blocks"][1]
    assert b["update_ratio"] == 0 and b["attn_ratio"] == 0 and b["mlp_ratio"] == 0
    assert b["block_influence"] == pytest.approx(0, abs=1e-6)
    for key in ("last_token", "all_tokens"):
        assert res["angular"][key][1][2] == 0.0
    assert res["angular"]["best_block"][0]["blocks"] == [2, 2]
    assert res["removal"]["single"][1]["delta_ppl"] == 0.0
    assert res["jacobian"]["block_gain"][1] == pytest.approx(1.0, abs=1e-6)
    assert res["jacobian"]["block_vs_identity"][1] == pytest.approx(0.0, abs=1e-6)
    others = [b for i, b in enumerate(res["blocks"]) if i != 1]
    assert all(o["update_ratio"] > 0.01 for o in others)  # the other blocks do work: the test can fail
    hm = token_jacobian(lm, 1, *_block_input(lm, 1), channels=8)
    assert torch.allclose(torch.tensor(hm["matrix"]), torch.eye(8), atol=1e-6)


def _block_input(lm, l):
    b = random_batches(97, n=1)[0]
    tr = lm.trace(b.ids, b.mask)
    return tr.hidden[l], tr.calls[l], b.mask


def test_attention_and_mlp_split_is_exact():
    """attn update + mlp update = block update, and zeroing only the attention output zeroes only its share."""
    lm = tiny_lm()
    torch.nn.init.zeros_(lm.model.layers[2].attn.o_proj.weight)
    b = random_batches(97, n=1)[0]
    tr = lm.trace(b.ids, b.mask)
    for l in range(4):
        a, m, o = tr.hidden[l], tr.mid[l], tr.hidden[l + 1]
        assert torch.allclose((m - a) + (o - m), o - a)
    res = analyze(lm, [b], Options(removal=False, jacobian=False))
    assert res["blocks"][2]["attn_ratio"] == 0 and res["blocks"][2]["mlp_ratio"] > 0.01
    assert res["blocks"][2]["attn_importance"] == pytest.approx(0, abs=1e-6)


def test_removal_sweep_matches_naive_and_leaves_model_unchanged():
    lm = tiny_lm(n_layers=5)
    batches = random_batches(97, n=2)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    logits_before = lm.model(batches[0].ids)
    res = analyze(lm, batches, Options(jacobian=False))
    naive = naive_single_layer_sweep(lm, batches)
    for s, want in zip(res["removal"]["single"], naive):
        assert s["loss"] == pytest.approx(want, rel=1e-5)
    assert all(torch.equal(v, lm.model.state_dict()[k]) for k, v in before.items())
    assert torch.equal(lm.model(batches[0].ids), logits_before)
    assert [type(b).__name__ for b in lm.blocks] == ["PreLNBlock"] * 5
    # contiguous runs: removing blocks [s, s+n-1] equals the naive pass with all of them skipped
    run = next(r for r in res["removal"]["runs"] if r["n"] == 2)
    from depthlab.analysis.removal import next_token_nll, skipping

    tot = cnt = 0
    with skipping(lm, run["start_block"] - 1), skipping(lm, run["start_block"]):
        for b in batches:
            s, c = next_token_nll(lm.forward_fn(b.ids, b.mask), b)
            tot, cnt = tot + s, cnt + c
    assert run["loss"] == pytest.approx(tot / cnt, rel=1e-5)


def test_lens_last_layer_is_the_model_and_kl_zero():
    lm = tiny_lm()
    batches = random_batches(97)
    res = analyze(lm, batches, Options(jacobian=False))
    assert res["lens"]["kl"][-1] == pytest.approx(0.0, abs=1e-7)
    assert res["lens"]["ce"][-1] == pytest.approx(res["removal"]["base_loss"], rel=1e-6)
    logits = torch.cat([lm.model(b.ids) for b in batches])
    ids = torch.cat([b.ids for b in batches])
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert res["lens"]["ce"][-1] == pytest.approx(ce.item(), rel=1e-5)
    assert all(k > 0 for k in res["lens"]["kl"][:-1])


def test_raw_last_state_is_kept_apart_from_final_normed():
    lm = tiny_lm()
    res = analyze(lm, random_batches(97), Options(removal=False, jacobian=False))
    raw, normed = res["states"][-1], res["final_normed"]
    assert "raw last" in raw["name"]
    assert normed["rms"] == pytest.approx(1.0, abs=0.01)  # RMSNorm with unit weight
    assert abs(raw["rms"] - 1.0) > 0.1


def test_jacobian_estimate_matches_exact_frobenius_norm():
    lm = tiny_lm(n_layers=2)
    b = Batch(torch.randint(0, 97, (1, 6)), torch.ones(1, 6, dtype=torch.bool))
    tr = lm.trace(b.ids, b.mask)
    h = tr.hidden[1]
    J = torch.autograd.functional.jacobian(lambda x: lm.run_block(1, x, tr.calls[1]), h).reshape(h.numel(), -1)
    n = h.numel()
    gain, dist = block_jacobian(lm, 1, h, tr.calls[1], b.mask, probes=400)
    assert gain == pytest.approx((J.norm() / math.sqrt(n)).item(), rel=0.05)
    assert dist == pytest.approx(((J - torch.eye(n)).norm() / math.sqrt(n)).item(), rel=0.05)


def test_lns_deep_blocks_move_the_stream_more_than_pre():
    """Same weights, the scheme differs: LNS scales deep updates by 1/sqrt(l), so its variance grows less."""
    torch.manual_seed(1)
    pre = tiny_lm(n_layers=6, scheme="pre")
    lns = Transformer(tiny_model_config(n_layers=6, norm_scheme="lns")).eval()
    lns.load_state_dict(pre.model.state_dict())
    b = random_batches(97, n=1)
    v_pre = analyze(pre, b, Options(removal=False, jacobian=False))["states"][-1]["variance"]
    v_lns = analyze(from_depthlab(lns, "lns"), b, Options(removal=False, jacobian=False))["states"][-1]["variance"]
    assert v_lns < v_pre


def test_hf_windows_start_with_bos_when_the_tokenizer_adds_one():
    import numpy as np

    from depthlab.analysis.calibration import padded_windows, to_batches

    w = padded_windows([list(range(10, 20)), [30, 31]], n_tokens=100, seq_len=4, bos=1)
    assert [x.tolist() for x in w] == [[1, 10, 11, 12], [1, 13, 14, 15], [1, 16, 17, 18], [1, 19], [1, 30, 31]]
    b = to_batches(w, batch_size=8, pad_id=0)[0]
    assert b.mask.sum(1).tolist() == [4, 4, 4, 2, 3] and b.ids[3].tolist() == [1, 19, 0, 0]
    assert np.array_equal(padded_windows([[5, 6, 7]], 100, 2)[0], [5, 6])
