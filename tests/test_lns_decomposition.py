"""LNS taken apart: Pre-LN whose block-l norm gains start at l^(-p) (model.norm_gain_init=depth) and learn at
lr * l^(-p) (train.norm_gain_lr=depth) trains exactly as LNS under Adam (no weight decay on gains)."""

import json

import pytest
import torch

from depthlab import UserError
from depthlab.config import Config, apply_overrides
from depthlab.model import build_model
from depthlab.model.init import block_norm_gains
from depthlab.model.validate import validate
from depthlab.train.trainer import Trainer

TINY = {"model.dim": 32, "model.n_layers": 6, "model.n_heads": 2, "model.ffn_dim": 64, "model.vocab_size": 300,
        "model.init_std": "auto", "data.seq_len": 32, "train.eval_every": 1000, "train.log_every": 1,
        "train.warmup_steps": 10, "train.monitor_every": 0, "train.batch_size": 4, "train.max_steps": 100,
        "train.lr": 1e-2, "train.device": "cpu", "train.threads": 1}


def losses(corpus, tmp_path, name, **extra):
    cfg = apply_overrides(Config(), [f"{k}={v}" for k, v in {**TINY, "data.paths": f"[{corpus}]",
                                                                **extra}.items()])
    Trainer(cfg, run_dir=tmp_path / name, progress=False).train()
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if x]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("clip", [0.0, 1.0, 0.05])
@pytest.mark.slow
def test_pre_with_depth_gains_trains_as_lns(corpus, tmp_path, clip):
    lns = losses(corpus, tmp_path, "lns", **{"model.norm_scheme": "lns", "train.grad_clip": clip})
    pre = losses(corpus, tmp_path, "pre", **{"model.norm_scheme": "pre", "model.norm_gain_init": "depth",
                                             "train.norm_gain_lr": "depth", "train.grad_clip": clip})
    plain = losses(corpus, tmp_path, "plain", **{"model.norm_scheme": "pre", "train.grad_clip": clip})
    assert len(lns) == len(pre) == 100
    assert max(abs(a - b) for a, b in zip(lns, pre)) < 1e-5
    assert max(abs(a - b) for a, b in zip(lns, plain)) > 1e-2  # and plain Pre-LN does not


def test_gain_init_and_lr_rule(tmp_path):
    cfg = apply_overrides(Config(), [f"{k}={v}" for k, v in TINY.items()] +
                          ["model.norm_scheme=pre", "model.norm_gain_init=depth", "model.lns_power=1"])
    model = build_model(cfg.model)
    gains = block_norm_gains(model, 1.0)
    assert len(gains) == 12 and {round(s, 6) for _, s in gains} == {round(1 / l, 6) for l in range(1, 7)}
    assert all(torch.equal(g, torch.full_like(g, s)) for g, s in gains)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))  # the final norm is left alone
    from depthlab.train.optim import make_optimizer

    cfg.train.norm_gain_lr = "depth"
    opt = make_optimizer(model, cfg)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert all(lr_of[id(g)] == pytest.approx(cfg.train.lr * s) for g, s in gains)
    assert lr_of[id(model.norm.weight)] == cfg.train.lr


def test_block_lr_is_a_depth_wise_rate_decay_of_every_block_parameter():
    from depthlab.train.optim import make_optimizer

    cfg = apply_overrides(Config(), [f"{k}={v}" for k, v in TINY.items()] + ["model.norm_scheme=pre"])
    model = build_model(cfg.model)
    assert len(make_optimizer(model, cfg).param_groups) == 2  # the default: decay and no decay
    cfg.train.block_lr, cfg.train.norm_gain_lr = "depth", "depth"
    opt = make_optimizer(model, cfg)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for l, block in enumerate(model.layers, 1):
        gains = {id(block.attn_norm.weight), id(block.mlp_norm.weight)}
        for p in block.parameters():  # gains get both rules: lr * l^(-p) * l^(-p)
            want = cfg.train.lr * l ** -0.5 * (l ** -0.5 if id(p) in gains else 1.0)
            assert lr_of[id(p)] == pytest.approx(want)
    assert lr_of[id(model.embed_tokens.weight)] == lr_of[id(model.norm.weight)] == cfg.train.lr


@pytest.mark.parametrize("key", ["model.norm_gain_init", "train.norm_gain_lr", "train.block_lr"])
def test_bad_gain_rule_is_one_line(key):
    with pytest.raises(UserError, match=key):
        validate(apply_overrides(Config(), [f"{key}=sqrt"]))
