import json

import pytest

from depthlab import UserError
from depthlab.config import Config, apply_overrides
from depthlab.model.families import PRESETS, preset
from depthlab.model.validate import validate


def test_overrides_parse_types_and_dotted_paths():
    cfg = apply_overrides(preset("cpu-tiny"), ["model.n_layers=24", "train.lr=2e-3", "model.tie_embeddings=true",
                                               "model.n_kv_heads=2", "data.paths=[a.txt, b.txt]",
                                               "model.n_kv_heads=null"])
    assert cfg.model.n_layers == 24 and cfg.train.lr == 2e-3 and cfg.model.tie_embeddings is True
    assert cfg.data.paths == ["a.txt", "b.txt"] and cfg.model.n_kv_heads is None


@pytest.mark.parametrize("override,msg", [
    ("model.n_layerz=3", "unknown config key"), ("modle.dim=3", "unknown config key"),
    ("model.dim=abc", "must be of type int"), ("train.lr", "key=value"), ("model.dim=1.5", "must be of type int"),
])
def test_bad_overrides_are_user_errors(override, msg):
    with pytest.raises(UserError, match=msg):
        apply_overrides(preset("cpu-tiny"), [override])


@pytest.mark.parametrize("override,msg", [
    ("model.norm_scheme=LNS", "valid: pre, lns, post"), ("model.n_heads=5", "does not divide"),
    ("model.n_kv_heads=3", "must divide"), ("model.init=xavier", "unknown init"),
    ("model.gpas=true", None), ("data.seq_len=100000", "max_seq_len"), ("train.dtype=fp16", "fp32 or bf16"),
])
def test_validation(override, msg):
    cfg = apply_overrides(preset("cpu-tiny"), [override])
    if msg is None:
        validate(cfg)  # gpas with lns is allowed
    else:
        with pytest.raises(UserError, match=msg):
            validate(cfg)


def test_gpas_only_with_pre_or_lns():
    with pytest.raises(UserError, match="gpas combines with pre and lns"):
        validate(apply_overrides(preset("cpu-tiny"), ["model.gpas=true", "model.norm_scheme=post"]))


def test_paper_presets_match_design():
    expect = {"llama-71m": (512, 12, 8, 1368, 1e-3, 1000, 10_000),
              "llama-130m": (768, 12, 12, 2048, 1e-3, 2000, 20_000),
              "llama-250m": (768, 24, 16, 2560, 1e-3, 4000, 40_000),
              "llama-350m": (1024, 24, 16, 2736, 5e-4, 6000, 60_000),
              "llama-1b": (2048, 24, 32, 5461, 5e-4, 1000, 100_000)}
    for name, (dim, layers, heads, ffn, lr, warmup, steps) in expect.items():
        c = validate(preset(name))
        assert (c.model.dim, c.model.n_layers, c.model.n_heads, c.model.ffn_dim) == (dim, layers, heads, ffn)
        assert (c.train.lr, c.train.warmup_steps, c.train.max_steps) == (lr, warmup, steps)
        assert c.data.seq_len == 256 and c.train.batch_size * c.train.grad_accum == 512
        assert c.train.min_lr_ratio == 0.1 and c.train.weight_decay == 0
        assert c.model.embed_std == pytest.approx(0.632, abs=1e-3)
    families = {"qwen2.5-0.5b", "olmo-1b", "olmo-7b", "olmo2-1b"}  # tests/test_arch.py checks their sizes
    vits = {"vit-ti", "vit-s", "vit-b", "vit-digits"}  # tests/test_vit.py checks them
    assert set(PRESETS) == {"cpu-tiny", *expect, *families, *vits}


def test_json_and_yaml_round_trip(tmp_path):
    cfg = apply_overrides(preset("llama-71m"), ["model.norm_scheme=mixln", "model.mixln_ratio=0.5"])
    cfg.save(tmp_path / "c.json")
    assert Config.load(tmp_path / "c.json") == cfg
    (tmp_path / "c.yaml").write_text("model:\n  norm_scheme: post\n  n_layers: 3\ntrain:\n  lr: 1.0e-4\n")
    y = Config.load(tmp_path / "c.yaml")
    assert (y.model.norm_scheme, y.model.n_layers, y.train.lr) == ("post", 3, 1e-4)
    (tmp_path / "bad.yaml").write_text("model:\n  colour: red\n")
    with pytest.raises(UserError, match="model.colour"):
        Config.load(tmp_path / "bad.yaml")


@pytest.mark.parametrize("override,msg", [
    ("train.beta1=1.5", r"train.beta1 must be in \[0, 1\)"), ("train.beta1=-0.1", "train.beta1"),
    ("train.beta2=1.0", r"train.beta2 must be in \[0, 1\)"), ("train.beta2=nan", "train.beta2"),
    ("train.lr=nan", "train.lr must be a positive number, got nan"), ("train.lr=inf", "train.lr"),
    ("train.lr=-1e-3", "train.lr"), ("train.lr=0", "train.lr"),
    ("train.threads=-1", "train.threads must be >= 0"), ("train.grad_clip=-1", "train.grad_clip must be a number >= 0"),
    ("train.grad_clip=inf", "train.grad_clip"), ("train.weight_decay=-0.1", "train.weight_decay"),
    ("train.weight_decay=nan", "train.weight_decay"),
    ("train.min_lr_ratio=1.5", r"train.min_lr_ratio must be in \[0, 1\]"),
    ("train.min_lr_ratio=-0.1", "train.min_lr_ratio"), ("train.warmup_steps=-1", "train.warmup_steps"),
    ("train.peak_flops=-1", "train.peak_flops"), ("train.seed=-1", "train.seed"),
    ("model.norm_eps=0", "model.norm_eps must be a positive number"), ("model.norm_eps=-1e-6", "model.norm_eps"),
    ("model.norm_eps=nan", "model.norm_eps"), ("model.lns_power=-0.5", "model.lns_power must be a number >= 0"),
    ("model.lns_power=inf", "model.lns_power"), ("model.mixln_ratio=nan", "model.mixln_ratio"),
    ("model.rope_theta=0", "model.rope_theta"), ("model.embed_std=-1", "model.embed_std"),
    ("model.init_std=inf", "model.init_std"), ("model.init_std=nan", "model.init_std"),
    ("model.skip_alpha_init=nan", "model.skip_alpha_init"), ("model.gpas_gate=per_layer", "per_block or per_add"),
    ("data.builtin_mb=0", "data.builtin_mb"),
])
def test_out_of_range_values_are_one_line_user_errors(override, msg):
    with pytest.raises(UserError, match=msg) as e:
        validate(apply_overrides(preset("cpu-tiny"), [override]))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override", ["train.beta1=0", "train.beta2=0.95", "train.min_lr_ratio=0",
                                      "train.min_lr_ratio=1", "train.grad_clip=0", "train.threads=0",
                                      "model.lns_power=0", "model.gpas_gate=per_add model.gpas=true",
                                      "model.skip_alpha_init=-0.5 model.norm_scheme=skipinit"])
def test_boundary_values_are_accepted(override):
    validate(apply_overrides(preset("cpu-tiny"), override.split()))


@pytest.mark.parametrize("override", ["train.beta1=1.5", "train.lr=nan", "train.threads=-1", "model.norm_eps=0"])
def test_cli_reports_bad_values_in_one_line_with_exit_2(override, capsys, tmp_path):
    from depthlab.cli import main

    assert main(["train", "--out", str(tmp_path), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("depthlab: error: " + override.split("=")[0]) and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written


# a value other than its default for every switch of COMPANIONS, and one with which each companion acts
SWITCHED = {"model.depth_base": 6, "model.norm_gain_const": 0.3, "model.lns_power": 1.0,
            "model.lns_placement": "branch", "model.mixln_ratio": 0.5, "model.layerscale_init": 0.01,
            "model.skip_alpha_init": 0.5, "model.dyt_alpha_init": 1.0, "model.gpas_gate": "per_add",
            "model.image_size": 32, "model.patch_size": 8, "model.channels": 1, "model.num_classes": 10,
            "model.pool": "mean", "model.pos_embed": "sincos", "data.builtin_mb": 1.0, "train.max_skips": 3,
            "train.dp_replicate": 2, "train.dp_shard": 2, "train.lora.alpha": 16.0, "train.lora.dropout": 0.1,
            "train.lora.targets": "[q, v]", "train.muon_lr": 0.01, "train.muon_momentum": 0.9,
            "train.muon_weight_decay": 0.1, "train.muon_adjust_lr": "match_rms_adamw",
            "model.resid_lambda_init": 0.9, "model.x0_lambda_init": 0.1, "train.scalar_lr_mult": 10.0}
COMPANION_SET = {"model.depth_alpha": 1.0, "train.lora.rank": 4}


@pytest.mark.parametrize("switch", SWITCHED)
def test_a_switch_without_its_companion_is_refused_in_one_line(switch):
    """depth_base without depth_alpha, norm_gain_const without norm_gain_init=uniform, ...: each would train the
    plain model; with (any one of) its companions it is accepted."""
    from depthlab.config import COMPANIONS, SET

    base = ["data.paths=[a.txt]", "model.norm_scheme=pre", f"{switch}={SWITCHED[switch]}"]
    with pytest.raises(UserError, match=f"{switch}=.* has no effect with .*: it acts only with ") as e:
        validate(apply_overrides(preset("cpu-tiny"), base))
    assert "\n" not in str(e.value)
    for key, values in COMPANIONS[switch].items():
        companion = COMPANION_SET[key] if values == SET else values[0]
        validate(apply_overrides(preset("cpu-tiny"), [*base, f"{key}={json.dumps(companion)}"]))


def test_every_companion_switch_has_a_case():
    from depthlab.config import COMPANIONS

    assert set(SWITCHED) == set(COMPANIONS)


def test_a_presets_own_setting_is_not_the_users():
    """vit-digits puts LNS on the branches (model.lns_placement=branch): under --scheme pre that is the preset's
    choice, not a switch the user set, so it is accepted; the user setting it (another way) is refused."""
    validate(apply_overrides(preset("vit-digits"), ["model.norm_scheme=pre"]))
    with pytest.raises(UserError, match="model.lns_placement=attn_only has no effect with model.norm_scheme=pre"):
        validate(apply_overrides(preset("vit-digits"), ["model.norm_scheme=pre", "model.lns_placement=attn_only"]))
