import pytest
import torch

from depthlab import UserError
from depthlab.hf import import_hf
from depthlab.model import lm_loss
from tests.test_hf_fixtures import tiny_hf


@pytest.mark.parametrize("family,kw", [("llama", {}), ("llama", {"tie_word_embeddings": True}),
                                       ("mistral", {"sliding_window": 64}), ("qwen2", {"tie_word_embeddings": True})])
def test_import_matches_hf_logits(family, kw, tmp_path):
    hf = tiny_hf(family, rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, **kw)
    hf.save_pretrained(tmp_path / "m")
    model, cfg = import_hf(tmp_path / "m")  # from a directory, as a user would
    assert cfg.model.norm_scheme == "pre" and cfg.model.rope_theta == 5000.0
    assert cfg.model.tie_embeddings == kw.get("tie_word_embeddings", False)
    ids = torch.randint(0, 97, (2, 23))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-5


def test_imported_model_continues_pretraining_with_lns():
    hf = tiny_hf("qwen2")
    model, cfg = import_hf(hf, scheme="lns")
    assert cfg.model.norm_scheme == "lns" and model.layers[3].attn_norm.scale == pytest.approx(0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 97, (4, 16))
    losses = []
    for _ in range(5):
        loss = lm_loss(model(ids[:, :-1]), ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_qwen2_with_nonzero_biases_imports_them():
    hf = tiny_hf("qwen2")
    with torch.no_grad():
        hf.model.layers[1].self_attn.k_proj.bias.fill_(0.1)
    model, cfg = import_hf(hf)
    theirs = hf.model.layers[1].self_attn.k_proj.bias
    assert cfg.model.family == "qwen2" and torch.equal(model.layers[1].attn.k_proj.bias, theirs)


@pytest.mark.parametrize("family,kw,match", [
    ("olmo2", {"attention_bias": True}, "attention biases"),
    ("llama", {"hidden_act": "gelu"}, "activation"),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "RoPE scaling"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}, "sliding-window"),
])
def test_what_our_model_computes_differently_is_refused(family, kw, match):
    with pytest.raises(UserError, match=match):
        import_hf(tiny_hf(family, **kw))


def test_import_cli_writes_a_loadable_checkpoint_with_the_tokenizer(tmp_path, capsys):
    from depthlab.cli import main
    from depthlab.hf.exporter import hf_tokenizer
    from depthlab.loading import load_checkpoint
    from tests.test_hf_fixtures import word_tokenizer

    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path / "hf")
    hf_tokenizer(word_tokenizer()).save_pretrained(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "ckpt"), "--scheme", "lns"]) == 0
    model, cfg, meta = load_checkpoint(tmp_path / "ckpt")
    assert cfg.model.norm_scheme == "lns" and meta.imported_from == str(tmp_path / "hf")
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
    assert main(["import", str(tmp_path / "nope"), str(tmp_path / "x")]) == 2
    assert "cannot load Hugging Face model" in capsys.readouterr().err
