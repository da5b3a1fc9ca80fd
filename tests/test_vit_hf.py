"""A depthlab ViT exported as a stock transformers ViTForImageClassification (depthlab.hf.vit): logits parity after
`from_pretrained` of the written directory for every exported scheme and LNS placement, on tiny models with every
parameter moved off its init value (so each folded term shows); `depthlab export` on a trained digits run; the
refusals, one line each; and the import back."""

import json

import numpy as np
import pytest
import torch

from depthlab import UserError
from depthlab.cli import main
from depthlab.config import Config, ModelConfig, apply_overrides
from depthlab.hf.exporter import export
from depthlab.hf.importer import save_as_checkpoint
from depthlab.hf.vit import import_hf_vit, vit_export_refusal
from depthlab.model import SCHEMES, ViT
from depthlab.model.families import preset
from depthlab.model.validate import validate
from tests.scheme_oracles import names as oracle_names

transformers = pytest.importorskip("transformers")

BASE = dict(family="vit", dim=16, n_layers=3, n_heads=2, ffn_dim=32, image_size=8, patch_size=4, channels=3,
            num_classes=5, norm_eps=1e-6, norm_scheme="pre")
EXPORTED = set(oracle_names(vit_export=True))
CASES = {
    "pre": {},
    "pre-1ch-16px": {"channels": 1, "image_size": 16},
    "lns-norm": {"norm_scheme": "lns", "lns_placement": "norm"},
    "lns-branch": {"norm_scheme": "lns", "lns_placement": "branch"},
    "lns-norm-1ch": {"norm_scheme": "lns", "lns_placement": "norm", "channels": 1},
    "lns-branch-1ch-16px": {"norm_scheme": "lns", "lns_placement": "branch", "channels": 1, "image_size": 16},
    "layerscale": {"norm_scheme": "layerscale"},
    "skipinit": {"norm_scheme": "skipinit"},
    "lns-gqa": {"norm_scheme": "lns", "lns_placement": "branch", "n_heads": 4, "n_kv_heads": 2},
    "pre-sincos": {"pos_embed": "sincos"},
}


def config(**kw) -> ModelConfig:
    cfg = ModelConfig(**{**BASE, **kw})
    validate(Config(model=cfg))
    return cfg


def jittered(cfg: ModelConfig, seed: int = 0) -> ViT:
    """A ViT with every parameter moved off its init value: norm weights off 1, biases off 0, gains off their
    start (skipinit's is 0)."""
    model, g = ViT(cfg), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def export_and_reload(tmp_path, model: ViT, meta: dict | None = None):
    save_as_checkpoint(tmp_path / "ckpt", model, Config(model=model.cfg), {"step": 7, **(meta or {})})
    out = export(tmp_path / "ckpt", tmp_path / "hf")
    return transformers.ViTForImageClassification.from_pretrained(out).eval(), out


def max_diff(model: ViT, other, n: int = 4) -> float:
    """Largest logit difference between a depthlab ViT and a stock one (or another depthlab ViT)."""
    c = model.cfg
    images = torch.randn(n, c.channels, c.image_size, c.image_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = other(images) if isinstance(other, ViT) else other(pixel_values=images).logits
        return (model(images) - theirs).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_export_reloads_as_stock_vit_with_the_same_logits(tmp_path, case):
    model = jittered(config(**CASES[case]))
    hf, out = export_and_reload(tmp_path, model)
    assert type(hf).__name__ == "ViTForImageClassification"
    assert max_diff(model, hf) <= 1e-5
    c = json.loads((out / "config.json").read_text())
    assert c["hidden_act"] == "gelu" and c["layer_norm_eps"] == 1e-6 and c["qkv_bias"] and "auto_map" not in c
    assert c["hidden_dropout_prob"] == c["attention_probs_dropout_prob"] == 0.0


@pytest.mark.parametrize("placement", ["norm", "branch"])
def test_lns_folds_exactly_where_its_placement_puts_the_scale(tmp_path, placement):
    from safetensors.torch import load_file

    model = jittered(config(norm_scheme="lns", lns_placement=placement))
    _, out = export_and_reload(tmp_path, model)
    state = load_file(str(out / "model.safetensors"))
    for i, layer in enumerate(model.layers):
        s, pre = (i + 1) ** -0.5, f"vit.encoder.layer.{i}."
        folded = {"norm": [("attn_norm", "layernorm_before"), ("mlp_norm", "layernorm_after")],
                  "branch": [("attn.o_proj", "attention.output.dense"), ("mlp.down_proj", "output.dense")]}
        for ours, theirs in folded[placement]:  # weight AND bias times l^(-p)
            for param in ("weight", "bias"):
                want = layer.get_submodule(ours).get_parameter(param).detach() * s
                assert torch.allclose(state[f"{pre}{theirs}.{param}"], want, rtol=1e-6, atol=0)
        ours, theirs = {"norm": ("attn.o_proj", "attention.output.dense"),
                        "branch": ("attn_norm", "layernorm_before")}[placement]  # the other place: as it is
        assert torch.equal(state[f"{pre}{theirs}.weight"], layer.get_submodule(ours).weight.detach())
    assert torch.equal(state["vit.layernorm.bias"], model.norm.bias.detach())  # the final norm is never scaled


def test_every_scheme_is_exported_or_refused_on_a_vit():
    exported = {name for name in SCHEMES if not vit_export_refusal(config(norm_scheme=name))}
    assert exported == EXPORTED
    assert {kw.get("norm_scheme", "pre") for kw in CASES.values()} == EXPORTED  # a parity case for each


REFUSED = [(name, {}) for name in sorted(set(SCHEMES) - EXPORTED)] + [
    ("lns", {"gpas": True}), ("pre", {"pool": "mean"}), ("lns", {"pool": "mean", "lns_placement": "branch"})]


@pytest.mark.parametrize("scheme,kw", REFUSED, ids=[f"{s}-{'-'.join(map(str, kw.values()))}" for s, kw in REFUSED])
def test_unexportable_vits_are_refused_in_one_line_with_exit_2(tmp_path, scheme, kw, capsys):
    model = ViT(config(norm_scheme=scheme, **kw))
    save_as_checkpoint(tmp_path / "ckpt", model, Config(model=model.cfg), {"step": 1})
    what = "pool=mean" if "pool" in kw else ("gpas" if "gpas" in kw else scheme)
    with pytest.raises(UserError, match=rf"cannot export .*{what}.* as a stock ViTForImageClassification"):
        export(tmp_path / "ckpt", tmp_path / "hf")
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("depthlab: error: cannot export") and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


def test_depthlab_export_of_a_trained_digits_run_loads_in_stock_transformers(tmp_path, capsys):
    from depthlab.data.images import build_image_data
    from depthlab.loading import load_checkpoint
    from depthlab.train.trainer import train

    cfg = apply_overrides(preset("vit-digits"), [
        "model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.ffn_dim=64", "train.max_steps=3",
        "train.batch_size=32", "train.warmup_steps=1", "train.eval_every=3", "train.log_every=1"])
    train(cfg, run_dir=tmp_path / "run", progress=False)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    assert "ViTForImageClassification" in capsys.readouterr().out
    hf = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "hf").eval()
    model, _, meta = load_checkpoint(tmp_path / "run")
    x = torch.from_numpy(build_image_data([], 8, 1, cfg.data.val_fraction).val_x)  # the run's validation images
    with torch.no_grad():
        ours, theirs = model.eval()(x), hf(pixel_values=x).logits
    assert (ours - theirs).abs().max() <= 1e-5 and torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert hf.config.id2label == dict(enumerate(meta.data["classes"]))
    prov = json.loads((tmp_path / "hf" / "depthlab_export.json").read_text())
    assert prov["scheme"] == "lns" and prov["lns_placement"] == "branch" and prov["step"] == 3
    # the image processor does the run's normalisation to 8-bit grey images: / 255, minus mean, over std
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8)
    got = processor(Image.fromarray(pixels), return_tensors="pt")["pixel_values"]
    want = (torch.from_numpy(pixels).float() / 255 - meta.data["pixel_mean"][0]) / meta.data["pixel_std"][0]
    assert got.shape == (1, 1, 8, 8) and torch.allclose(got[0, 0], want, atol=1e-5)
    # and back: `depthlab import` of the export is a depthlab ViT checkpoint with the run's classes and pixel
    # statistics, which `depthlab eval` scores exactly as the run itself
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    back, back_cfg, back_meta = load_checkpoint(tmp_path / "back")
    assert back_cfg.model.is_vit and back_meta.data["classes"] == meta.data["classes"]
    assert all(np.allclose(back_meta.data[k], meta.data[k]) for k in ("pixel_mean", "pixel_std"))
    with torch.no_grad():
        assert (back.eval()(x) - ours).abs().max() <= 1e-5


def test_import_of_a_stock_vit_and_back(tmp_path):
    hf_cfg = transformers.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                    image_size=8, patch_size=4, num_channels=3, num_labels=4, qkv_bias=False)
    stock = transformers.ViTForImageClassification(hf_cfg).eval()
    with torch.no_grad():
        for p in stock.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model, cfg = import_hf_vit(stock)
    assert cfg.norm_scheme == "pre" and cfg.norm_eps == hf_cfg.layer_norm_eps
    assert max_diff(model, stock) <= 1e-5
    lns = jittered(config(norm_scheme="lns", lns_placement="branch"))  # depthlab -> stock -> depthlab (pre)
    back, _ = import_hf_vit(export_and_reload(tmp_path, lns)[1])
    assert max_diff(lns, back) <= 1e-5
    with pytest.raises(UserError, match="exact GELU"):
        import_hf_vit(transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=8,
            patch_size=4, hidden_act="gelu_new")))
