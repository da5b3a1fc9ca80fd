"""The stream scalars (model.resid_lambda, model.x0_lambda): before block l, h = r_l h + a_l x0, x0 the embedding
output, r_l and a_l learnable, in AdamW groups of their own (train.scalar_lr_mult; depthlab.train.optim)."""

import pytest
import torch

from depthlab import UserError
from depthlab.config import Config, TrainConfig, apply_overrides
from depthlab.model import SCHEMES, build_model
from depthlab.model.validate import validate
from depthlab.train.optim import RESID_LAMBDA_SHARE, make_optimizer
from tests.conftest import tiny_model_config
from tests.test_trainer import (
    test_a_run_resumed_in_one_process_is_the_run_it_continues as resumed_is_continued,
    test_ddp_two_ranks_match_one_process as ddp_matches_one_process,
    test_fsdp_trains_checkpoints_and_resumes_on_another_rank_count as fsdp_matches_and_resumes,
)

BOTH = {"resid_lambda": True, "x0_lambda": True}
REFUSED = {name for name, cls in SCHEMES.items() if cls.stream_scalars_refusal}


def _scalars(model) -> tuple[list, list]:
    mixes = [layer.stream_mix for layer in model.layers]
    return [m.resid_lambda for m in mixes], [m.x0_lambda for m in mixes]


def test_the_block_formula_by_hand():
    """Pre-LN with the scalars set away from their start, against the formula written out: before block l,
    h = r_l h + a_l x0; then h + Attn(Norm(h)), h + MLP(Norm(h)); x0 = the embedding output."""
    torch.manual_seed(0)
    model = build_model(tiny_model_config(norm_scheme="pre", **BOTH))
    resid, x0_mix = _scalars(model)
    with torch.no_grad():
        for r, a in zip(resid, x0_mix, strict=True):
            r.copy_(torch.empty(()).uniform_(0.5, 1.5))
            a.copy_(torch.empty(()).uniform_(-0.5, 0.5))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12))
    rope = (model.rope_cos[:12], model.rope_sin[:12])
    x0 = h = model.embed_tokens(idx)
    for layer, r, a in zip(model.layers, resid, x0_mix, strict=True):
        h = r * h + a * x0
        h = h + layer.attn(layer.attn_norm(h), rope)
        h = h + layer.mlp(layer.mlp_norm(h))
    want = model.lm_head(model.norm(h))
    torch.testing.assert_close(model(idx), want, rtol=0, atol=1e-6)
    model(idx).sum().backward()
    assert all(p.grad is not None and p.grad != 0 for p in resid + x0_mix)  # both learn from the first step


@pytest.mark.parametrize("scheme", sorted(set(SCHEMES) - REFUSED))
def test_at_their_start_every_pre_norm_scheme_is_its_plain_model_bitwise(scheme):
    """r = 1, a = 0 (the defaults): the logits are the model's without them, bit for bit (the same weights drawn:
    the scalars take nothing from the generator)."""
    idx = torch.randint(0, 97, (2, 10))
    torch.manual_seed(1)
    plain = build_model(tiny_model_config(norm_scheme=scheme))
    torch.manual_seed(1)
    mixed = build_model(tiny_model_config(norm_scheme=scheme, **BOTH))
    assert torch.equal(plain(idx), mixed(idx))
    assert sum(p.numel() for p in mixed.parameters()) == sum(p.numel() for p in plain.parameters()) + 2 * 4


@pytest.mark.parametrize("scheme", sorted(REFUSED))
def test_a_scheme_whose_norm_follows_the_add_refuses_them_in_one_line(scheme):
    cfg = apply_overrides(Config(), [f"model.norm_scheme={scheme}", "model.x0_lambda=true"])
    with pytest.raises(UserError, match=f"model.x0_lambda with scheme '{scheme}': .*norm"):
        validate(cfg)
    assert REFUSED == {"post", "deepnorm", "mixln"}


def test_their_settings_need_the_option_they_act_with():
    with pytest.raises(UserError, match="train.scalar_lr_mult=10.0 has no effect .* model.resid_lambda=true or "
                                        "model.x0_lambda=true"):
        validate(apply_overrides(Config(), ["train.scalar_lr_mult=10"]))
    with pytest.raises(UserError, match="model.x0_lambda_init=0.1 has no effect"):
        validate(apply_overrides(Config(), ["model.resid_lambda=true", "model.x0_lambda_init=0.1"]))
    with pytest.raises(UserError, match="train.scalar_lr_mult must be a positive number, got 0.0"):
        validate(apply_overrides(Config(), ["model.x0_lambda=true", "train.scalar_lr_mult=0"]))
    model = build_model(tiny_model_config(resid_lambda=True, resid_lambda_init=0.8))
    assert all(layer.stream_mix.resid_lambda == 0.8 and layer.stream_mix.x0_lambda is None for layer in model.layers)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_each_kind_has_its_own_adamw_group_at_its_multiple_of_the_rate(optimizer):
    model = build_model(mc := tiny_model_config(norm_scheme="lns", **BOTH))
    opt = make_optimizer(model, Config(model=mc, train=TrainConfig(optimizer=optimizer, lr=2e-3, scalar_lr_mult=30)))
    adamw = opt[0] if optimizer == "muon" else opt
    resid, x0_mix = ({id(p) for p in ps} for ps in _scalars(model))
    groups = {frozenset(id(p) for p in g["params"]): g for g in adamw.param_groups}
    assert groups[frozenset(x0_mix)]["lr"] == pytest.approx(2e-3 * 30)
    assert groups[frozenset(resid)]["lr"] == pytest.approx(2e-3 * 30 * RESID_LAMBDA_SHARE)
    assert groups[frozenset(resid)]["weight_decay"] == groups[frozenset(x0_mix)]["weight_decay"] == 0
    if optimizer == "muon":  # scalars are not matrices: never Muon's
        assert not (resid | x0_mix) & {id(p) for g in opt[1].param_groups for p in g["params"]}


def test_the_memory_plan_counts_them_and_the_stream_they_keep():
    """Parameters exactly (the plan builds 2 blocks and counts the rest), activations as the tracker measures."""
    from depthlab.memtrack import measure_plan
    from depthlab.train.plan import memory_plan, parameter_counts
    from tests.test_memory_plan import _within, tiny

    cfg = tiny("model.n_layers=5", "model.resid_lambda=true", "model.x0_lambda=true")
    n, _, _ = parameter_counts(cfg.model)
    assert n == sum(p.numel() for p in build_model(cfg.model).parameters())
    plain = memory_plan(tiny("model.n_layers=5"), 1)["bytes"]
    plan = measure_plan(cfg, memory_plan(cfg, 1))
    assert plan["bytes"]["parameters"] == plain["parameters"] + 4 * 2 * 5
    assert plan["bytes"]["activations"] > plain["activations"]
    _within(plan["bytes"], plan["measured"]["bytes"])


def test_export_to_a_stock_class_is_refused_naming_the_option():
    from depthlab.hf.exporter import hf_weights_and_config

    for option in ("resid_lambda", "x0_lambda"):
        model = build_model(tiny_model_config(norm_scheme="pre", **{option: True}))
        with pytest.raises(UserError, match=f"cannot export model.{option} as a stock checkpoint: "):
            hf_weights_and_config(model)


def test_the_meta_build_keeps_their_values():
    """FSDP builds on the meta device and materialises: the scalars' starting values survive it."""
    from tests.test_distributed import test_meta_build_equals_the_eager_build_bitwise as meta_is_eager

    meta_is_eager({"norm_scheme": "lns", **BOTH, "resid_lambda_init": 0.9, "x0_lambda_init": 0.1})


EXTRA = {"model.norm_scheme": "lns", "model.resid_lambda": "true", "model.x0_lambda": "true"}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_run_with_them_resumes_bitwise(tmp_path, corpus, optimizer):
    resumed_is_continued(tmp_path, corpus, {**EXTRA, "train.optimizer": optimizer})


@pytest.mark.slow
def test_ddp_with_them_matches_one_process(tmp_path, corpus):
    ddp_matches_one_process(tmp_path, corpus, {k.replace(".", "__"): v for k, v in EXTRA.items()})


@pytest.mark.slow
def test_fsdp2_with_them_matches_one_process_and_resumes_on_another_rank_count(tmp_path, corpus):
    fsdp_matches_and_resumes(tmp_path, corpus, {k.replace(".", "__"): v for k, v in EXTRA.items()})


def test_a_study_probe_records_what_they_learned():
    """The study's final probe (a runs.jsonl record's probes) keeps r_l and a_l per block; a model without them
    records nothing more than before."""
    import numpy as np

    from depthlab.study.probe import ProbeSpec, probe_model

    model = build_model(tiny_model_config(norm_scheme="lns", resid_lambda=True))
    with torch.no_grad():
        model.layers[2].stream_mix.resid_lambda.fill_(0.5)
    val = np.random.default_rng(0).integers(0, 97, 2000)
    got = probe_model(model, val, ProbeSpec(windows=4, seq_len=16, batch_size=4, jacobian=False))
    assert got["stream_scalars"] == {"resid_lambda": [1.0, 1.0, 0.5, 1.0], "x0_lambda": [None] * 4}
    assert "stream_scalars" not in probe_model(build_model(tiny_model_config()), val,
                                               ProbeSpec(windows=4, seq_len=16, batch_size=4, jacobian=False))
