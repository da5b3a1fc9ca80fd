"""Depth parameterizations (depthlab.model.depth): CompleteP / depth-muP's branch multiplier and Adam groups, ProRes's
ramp, the static branch scales, the uniform gain init; off is today's model bitwise; export folds the multiplier."""

import json
from dataclasses import replace

import pytest
import torch

from depthlab import UserError
from depthlab.cli import main
from depthlab.config import Config, TrainConfig
from depthlab.model import Transformer
from depthlab.model.depth import prores_ramp, set_prores_step, uniform_gain
from depthlab.model.init import block_norm_gains
from depthlab.model.validate import validate
from depthlab.train.optim import ADAM_EPS, clip_gradients, make_optimizer
from tests.conftest import tiny_model_config
from tests.test_hf_fixtures import randomize_norms

TC = TrainConfig(lr=1e-2, warmup_steps=0, max_steps=10, grad_clip=1.0)


def steps(model: Transformer, n: int = 3, tc: TrainConfig = TC) -> list[torch.Tensor]:
    """Losses of n Adam steps on fixed random tokens (the trainer's optimizer and clipping)."""
    torch.manual_seed(1)
    ids = torch.randint(0, model.cfg.vocab_size, (4, 17))
    opt, out = make_optimizer(model, run_config(model, tc)), []
    for _ in range(n):
        loss = model(ids[:, :-1], targets=ids[:, 1:])
        loss.backward()
        clip_gradients(model, run_config(model, tc))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.detach())
    return out


def run_config(model: Transformer, tc: TrainConfig = TC) -> Config:
    """The config a run of `model` with `tc` passes down to make_optimizer and clip_gradients."""
    return Config(model=model.cfg, train=tc)


def config(**kw) -> Config:
    cfg = Config(model=tiny_model_config(**kw))
    cfg.data.seq_len = cfg.model.max_seq_len
    return cfg


def build(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(**kw))


@pytest.mark.parametrize("alpha,base,n", [(1.0, 2, 8), (0.5, 2, 8), (1.0, 6, 3), (0.5, 4, 4)])
def test_branch_multiplier_of_every_block(alpha, base, n):
    model = build(n_layers=n, depth_alpha=alpha, depth_base=base)
    want = (n / base) ** -alpha
    for blk in model.layers:
        assert blk.attn_add.branch_multiplier == blk.mlp_add.branch_multiplier == pytest.approx(want, rel=1e-15)
        assert blk.branch_multiplier_now == blk.attn_add.branch_multiplier


def test_the_branch_multiplier_goes_by_one_name():
    """The scheme's constant (branch_multiplier(cfg, l)), the residual add's (branch_multiplier) and what export folds
    (branch_multiplier_now) are one quantity under one name, no longer also branch_scale, scale, factor, out_scale."""
    model = build(n_layers=4, norm_scheme="lns", lns_placement="branch", depth_alpha=0.5, depth_base=1)
    for blk in model.layers:
        want = type(blk).branch_multiplier(model.cfg, blk.layer_id)
        assert blk.attn_add.branch_multiplier == blk.mlp_add.branch_multiplier == blk.branch_multiplier_now == want
        assert not any(hasattr(blk, n) for n in ("branch_scale", "out_scale"))
        assert not any(hasattr(blk.attn_add, n) for n in ("scale", "factor"))


@pytest.mark.parametrize("rule,want", [("1/L", lambda l: 1 / 6), ("1/sqrtL", lambda l: 6 ** -0.5),
                                       ("1/sqrtl", lambda l: l ** -0.5)])
def test_static_branch_scales(rule, want):
    model = build(n_layers=6, branch_scale=rule)
    assert [b.branch_multiplier_now for b in model.layers] == pytest.approx([want(l) for l in range(1, 7)], rel=1e-15)


def test_lns_branch_placement_and_depth_multiplier_compose():
    model = build(n_layers=4, norm_scheme="lns", lns_placement="branch", depth_alpha=1.0, depth_base=2)
    assert [blk.branch_multiplier_now for blk in model.layers] == pytest.approx([0.5 * l ** -0.5 for l in range(1, 5)])


def test_the_multiplier_scales_the_branch_output():
    """h + s F(Norm(h)) is Pre-LN with s folded into o_proj and down_proj."""
    ours = build(n_layers=4, depth_alpha=1.0, depth_base=2)
    plain = build(n_layers=4)
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():
        for blk in plain.layers:
            blk.attn.o_proj.weight.mul_(0.5)
            blk.mlp.down_proj.weight.mul_(0.5)
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        assert (ours(ids) - plain(ids)).abs().max() < 1e-6
        assert (ours(ids) - build(n_layers=4)(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_adam_groups_rate_and_eps(alpha):
    model = build(n_layers=8, depth_alpha=alpha, depth_base=2, norm_scheme="lns")  # m = 4
    opt = make_optimizer(model, run_config(model))
    group = {id(p): g for g in opt.param_groups for p in g["params"]}
    block_params = [p for blk in model.layers for p in blk.parameters()]
    assert len(block_params) == 8 * 9  # q k v o gate up down and two norm gains
    for p in block_params:
        assert group[id(p)]["lr"] == TC.lr * 4.0 ** (alpha - 1)
        assert group[id(p)]["eps"] == ADAM_EPS * 4.0 ** -alpha
    for p in (model.embed_tokens.weight, model.norm.weight, model.lm_head.weight):
        assert group[id(p)]["lr"] == TC.lr and group[id(p)]["eps"] == ADAM_EPS
    assert {g["weight_decay"] for g in opt.param_groups if g["params"][0].dim() == 1} == {0.0}


def test_the_depth_rules_come_from_the_config_passed_down_not_from_the_model():
    """make_optimizer reads model.depth_alpha from the run's config, so a wrapper that hides the model's own config
    (here a ModuleDict; it used to be fished out through DDP's and compile's wrappers only) changes nothing."""
    model = build(n_layers=8, depth_alpha=1.0, depth_base=2)  # m = 4: eps 1/4, lr 1
    wrapped = torch.nn.ModuleDict({"inner": model})
    for opt in (make_optimizer(model, run_config(model)), make_optimizer(wrapped, run_config(model))):
        group = {id(p): g for g in opt.param_groups for p in g["params"]}
        assert group[id(model.layers[0].attn.q_proj.weight)]["eps"] == ADAM_EPS / 4
    plain = make_optimizer(model, Config(train=TC))  # a config without the rule: no rule, whatever the model says
    assert {g["eps"] for g in plain.param_groups} == {ADAM_EPS}


def test_depth_rate_multiplies_the_other_rate_rules():
    model = build(n_layers=8, depth_alpha=0.5, depth_base=2, norm_scheme="pre")
    opt = make_optimizer(model, run_config(model, replace(TC, norm_gain_lr="depth")))
    group = {id(p): g for g in opt.param_groups for p in g["params"]}
    for gain, s in block_norm_gains(model, 0.5):
        assert group[id(gain)]["lr"] == pytest.approx(TC.lr * 0.5 * s, rel=1e-12)


@pytest.mark.parametrize("options", [{"depth_alpha": 0.0, "depth_base": 5}, {"depth_alpha": 1.0, "depth_base": 4},
                                     {"depth_alpha": 0.5, "depth_base": 4}, {"prores_steps": 0},
                                     {"branch_scale": "none"}, {"norm_gain_init": "1", "norm_gain_const": 0.3}])
@pytest.mark.parametrize("scheme", ["pre", "lns", "layerscale"])
def test_off_or_at_the_base_depth_is_todays_model_bitwise(options, scheme):
    """alpha = 0, T = 0, no branch scale -- and any alpha at L = L_base (m = 1) -- build and train exactly as
    a model built without the options: the same logits, the same three steps, the same optimizer groups."""
    today, ours = build(norm_scheme=scheme), build(norm_scheme=scheme, **options)
    assert today.state_dict().keys() == ours.state_dict().keys()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        assert torch.equal(today(ids), ours(ids))
    assert [len(g["params"]) for g in make_optimizer(today, run_config(today)).param_groups] == \
        [len(g["params"]) for g in make_optimizer(ours, run_config(ours)).param_groups]
    assert all("eps" not in g or g["eps"] == ADAM_EPS for g in make_optimizer(ours, run_config(ours)).param_groups)
    assert torch.equal(torch.stack(steps(today)), torch.stack(steps(ours)))
    assert all(torch.equal(a, b) for a, b in zip(today.state_dict().values(), ours.state_dict().values()))


def test_prores_schedule_values():
    assert prores_ramp(1, 0, 10) == 0.0
    assert prores_ramp(1, 5, 10) == 0.5
    assert prores_ramp(1, 10, 10) == prores_ramp(1, 99, 10) == 1.0
    assert prores_ramp(3, 15, 10) == 0.5
    assert prores_ramp(3, 29, 10) == pytest.approx(29 / 30)
    assert prores_ramp(3, 30, 10) == 1.0


def test_prores_ramps_follow_the_optimizer_steps_and_resume():
    model = build(n_layers=3, prores_steps=2)
    ramps = lambda m: [[b.attn_add.ramp.item(), b.mlp_add.ramp.item()] for b in m.layers]  # noqa: E731
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731  the ramp is an fp32 buffer
    assert ramps(model) == [[0.0, 0.0]] * 3  # a(l, 0) = 0: the model starts as embedding -> head
    tc = replace(TC, lr=1e-3)
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (4, 17))
    opt = make_optimizer(model, run_config(model, tc))
    for t in range(1, 8):
        model(ids[:, :-1], targets=ids[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
        assert ramps(model) == [[f32(min(1.0, t / (2 * l)))] * 2 for l in (1, 2, 3)], t
    # a checkpoint keeps the ramps; a resumed optimizer continues from its own step count
    again = build(n_layers=3, prores_steps=2)
    again.load_state_dict(model.state_dict())
    assert ramps(again) == ramps(model)
    opt2 = make_optimizer(again, run_config(again, tc))
    opt2.load_state_dict(opt.state_dict())
    again(ids[:, :-1], targets=ids[:, 1:]).backward()
    opt2.step()
    assert ramps(again) == [[1.0, 1.0]] * 3  # step 8 >= l T for every block


def test_prores_ramp_scales_each_branch():
    model = build(n_layers=2, prores_steps=4)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        set_prores_step(model, 0)
        first = model(ids)
        plain = build(n_layers=2)
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.endswith("ramp")})
        for blk in plain.layers:
            blk.attn.o_proj.weight.zero_()
            blk.mlp.down_proj.weight.zero_()
        assert torch.equal(first, plain(ids))  # every branch off at step 0
        set_prores_step(model, 8)  # block 1 at 1, block 2 at 1
        assert torch.equal(model(ids), build(n_layers=2)(ids))


def test_uniform_gain_init():
    model = build(n_layers=6, norm_gain_init="uniform")
    c = sum(l ** -0.5 for l in range(1, 7)) / 6
    assert uniform_gain(model.cfg) == pytest.approx(c, rel=1e-15)
    gains = block_norm_gains(model, 0.5)
    assert len(gains) == 12 and all(torch.equal(g, torch.full_like(g, c)) for g, _ in gains)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    fixed = build(n_layers=6, norm_gain_init="uniform", norm_gain_const=0.25)
    assert all(torch.equal(g, torch.full_like(g, 0.25)) for g, _ in block_norm_gains(fixed, 0.5))


@pytest.mark.parametrize("scheme", ["post", "deepnorm", "mixln"])
def test_depth_alpha_is_refused_where_the_norm_follows_the_add(scheme):
    cfg = config(norm_scheme=scheme, depth_alpha=1.0, depth_base=2)
    with pytest.raises(UserError, match=f"model.depth_alpha with scheme '{scheme}'") as e:
        validate(cfg)
    assert "\n" not in str(e.value)
    validate(config(norm_scheme=scheme, prores_steps=3))  # ProRes composes with every scheme


@pytest.mark.parametrize("bad,match", [({"depth_alpha": 1.0}, "needs model.depth_base"),
                                       ({"depth_alpha": 2.0, "depth_base": 2}, "in \\[0, 1\\]"),
                                       ({"prores_steps": -1}, "prores_steps"), ({"branch_scale": "1/l"}, "1/sqrtl"),
                                       ({"norm_gain_init": "flat"}, "uniform"), ({"norm_gain_const": -1.0}, ">= 0")])
def test_bad_depth_options_are_one_line_errors(bad, match):
    with pytest.raises(UserError, match=match):
        validate(config(**bad))


def _stock_logits(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoConfig, AutoModelForCausalLM

    from depthlab.hf.exporter import hf_weights_and_config

    state, fields = hf_weights_and_config(model)
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "torch_dtype")}
    stock = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)).eval()
    missing, unexpected = stock.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    with torch.no_grad():
        return stock(ids).logits


@pytest.mark.parametrize("kw", [
    {"norm_scheme": "pre", "depth_alpha": 1.0, "depth_base": 2},
    {"norm_scheme": "lns", "depth_alpha": 0.5, "depth_base": 1, "branch_scale": "1/sqrtl"},
    {"norm_scheme": "lns", "lns_placement": "branch", "depth_alpha": 1.0, "depth_base": 3},
    {"norm_scheme": "layerscale", "depth_alpha": 1.0, "depth_base": 2},
    {"norm_scheme": "sandwich", "depth_alpha": 1.0, "depth_base": 2},
    {"norm_scheme": "pre", "family": "olmo2", "depth_alpha": 1.0, "depth_base": 2, "norm_eps": 1e-6},
    {"norm_scheme": "pre", "prores_steps": 3},  # mid-schedule: the ramps where they stand fold too
])
def test_export_folds_the_multiplier_into_a_stock_model(kw):
    model = randomize_norms(build(**kw)).eval()
    if model.cfg.prores_steps:
        set_prores_step(model, 4)  # block 1 at 1, block 2 at 2/3, block 3 at 4/9, block 4 at 1/3
        assert [b.branch_multiplier_now for b in model.layers] == pytest.approx([1, 2 / 3, 4 / 9, 1 / 3])
    ids = torch.randint(0, 97, (2, 13))
    with torch.no_grad():
        ours = model(ids)
    assert (ours - _stock_logits(model, ids)).abs().max() < 1e-5


def test_train_with_completep_then_export(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--data", str(corpus), "--run-dir", str(run), "--max-steps", "3", "--no-progress",
            "--set", "model.depth_alpha=1", "--set", "model.depth_base=2", "--set", "model.n_layers=4",
            "--set", "model.dim=32", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64",
            "--set", "model.vocab_size=300", "--set", "data.seq_len=32", "--set", "train.batch_size=2",
            "--set", "train.eval_every=3", "--set", "train.device=cpu", "--set", "train.monitor_every=0"]
    assert main(args) == 0
    assert json.loads((run / "config.json").read_text())["model"]["depth_alpha"] == 1.0
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_init_from_crosses_prores_both_ways(corpus, tmp_path, capsys):
    """--init-from takes weights only: a ProRes ramp (schedule state) neither blocks it nor carries over."""
    tiny = ["--data", str(corpus), "--max-steps", "2", "--no-progress", "--set", "model.n_layers=2",
            "--set", "model.dim=32", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64",
            "--set", "model.vocab_size=300", "--set", "data.seq_len=32", "--set", "train.batch_size=2",
            "--set", "train.eval_every=2", "--set", "train.device=cpu", "--set", "train.monitor_every=0"]
    prores = ["--set", "model.prores_steps=2"]
    assert main(["train", "--run-dir", str(tmp_path / "plain"), *tiny]) == 0
    assert main(["train", "--run-dir", str(tmp_path / "ramped"), "--init-from", str(tmp_path / "plain"),
                 *tiny, *prores]) == 0
    assert main(["train", "--run-dir", str(tmp_path / "back"), "--init-from", str(tmp_path / "ramped"), *tiny]) == 0
