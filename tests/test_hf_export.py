import json

import pytest
import torch

from depthlab import UserError
from depthlab.cli import main
from depthlab.config import Config
from depthlab.hf.exporter import REFUSED, export
from depthlab.hf.importer import save_as_checkpoint
from depthlab.model import SCHEMES
from tests.scheme_oracles import ORACLES
from tests.test_hf_fixtures import load_stock, make_checkpoint, word_tokenizer


def test_every_scheme_is_exported_or_refused_with_a_reason():
    exported = {name for name in SCHEMES if ORACLES[name].hf_export}
    assert set(SCHEMES) == exported | set(REFUSED)
    assert {name: cls.hf_export for name, cls in SCHEMES.items()} == {n: ORACLES[n].hf_export for n in SCHEMES}
    assert not exported & set(REFUSED)


@pytest.mark.parametrize("scheme,kw", [("lns", {"n_kv_heads": 2}), ("pre", {"tie_embeddings": True})])
@pytest.mark.slow
def test_export_loads_as_stock_llama_without_depthlab_and_matches_logits(tmp_path, scheme, kw):
    model = make_checkpoint(tmp_path / "ckpt", scheme, **kw)
    out = export(tmp_path / "ckpt", tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    ids = torch.randint(0, model.cfg.vocab_size, (2, 19))
    theirs, info = load_stock(out, ids, tmp_path)
    with torch.no_grad():
        ours = model(ids)
    assert info["class"] == "LlamaForCausalLM" and not info["depthlab_loaded"]
    assert (ours - theirs).abs().max() < 1e-5
    # the stock tokenizer puts the document separator in front, as the model saw it before every training document
    tok = word_tokenizer()
    assert info["encoded"] == [tok.token_to_id("<|endoftext|>")] + tok.encode("the sky is blue").ids


@pytest.mark.parametrize("scheme", ["layerscale", "skipinit"])
def test_branch_gains_fold_into_output_projections(tmp_path, scheme):
    from transformers import AutoModelForCausalLM

    model = make_checkpoint(tmp_path / "ckpt", scheme)
    with torch.no_grad():  # per-channel / scalar gains with values that matter (skipinit starts at 0)
        for layer in model.layers:
            layer.attn_gain.copy_(torch.randn_like(layer.attn_gain))
            layer.mlp_gain.copy_(torch.randn_like(layer.mlp_gain))
    save_as_checkpoint(tmp_path / "ckpt", model, Config(model=model.cfg), {"step": 7}, word_tokenizer())
    hf = AutoModelForCausalLM.from_pretrained(export(tmp_path / "ckpt", tmp_path / "hf")).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 19))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-5


def test_sandwich_exports_as_stock_gemma2(tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_checkpoint(tmp_path / "ckpt", "sandwich", n_kv_heads=2)
    hf = AutoModelForCausalLM.from_pretrained(export(tmp_path / "ckpt", tmp_path / "hf")).eval()
    assert type(hf).__name__ == "Gemma2ForCausalLM"
    ids = torch.randint(0, model.cfg.vocab_size, (2, 19))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-5


def test_sandwich_with_tied_embeddings_is_refused(tmp_path):
    make_checkpoint(tmp_path / "ckpt", "sandwich", tie_embeddings=True)
    with pytest.raises(UserError, match="sandwich.*tied embeddings"):
        export(tmp_path / "ckpt", tmp_path / "hf")


def test_lns_export_folds_exactly_one_over_sqrt_l(tmp_path):
    from safetensors.torch import load_file

    model = make_checkpoint(tmp_path / "ckpt", "lns")
    state = load_file(str(export(tmp_path / "ckpt", tmp_path / "hf") / "model.safetensors"))
    for i, layer in enumerate(model.layers):
        for ours, theirs in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            want = layer.get_submodule(ours).weight.detach() / (i + 1) ** 0.5
            assert torch.allclose(state[f"model.layers.{i}.{theirs}.weight"], want, rtol=1e-6, atol=0)
    assert torch.equal(state["model.norm.weight"], model.norm.weight.detach())  # the final norm is never scaled


@pytest.mark.parametrize("scheme,gpas", [(s, False) for s in sorted(REFUSED)] + [("lns", True)])
def test_unexpressible_schemes_are_refused_with_the_reason(tmp_path, scheme, gpas, capsys):
    make_checkpoint(tmp_path / "ckpt", scheme, gpas=gpas)
    with pytest.raises(UserError, match=rf"{scheme}.*(stock|gpas)"):
        export(tmp_path / "ckpt", tmp_path / "hf")
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("depthlab: error: cannot export") and "\n" not in err and "Traceback" not in err


def test_export_cli_from_a_run_directory(tmp_path, capsys):
    make_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000007", "lns")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    prov = json.loads((tmp_path / "hf" / "depthlab_export.json").read_text())
    assert prov["scheme"] == "lns" and prov["architecture"] == "LlamaForCausalLM" and prov["step"] == 7
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in cfg


def test_an_hf_directory_is_not_exported_again(tmp_path):
    from tests.test_hf_fixtures import tiny_hf

    tiny_hf("llama").save_pretrained(tmp_path / "hf")
    with pytest.raises(UserError, match="Hugging Face model directory"):
        export(tmp_path / "hf", tmp_path / "out")
