"""The mistral family: sliding-window attention against transformers' MistralForCausalLM (eager and sdpa) with a
window shorter than the context, import and export both ways, training from the CLI, and the FLOP count."""

import json

import pytest
import torch

from depthlab import UserError
from depthlab.config import Config, DataConfig
from depthlab.hf import import_hf
from depthlab.model import Transformer
from depthlab.model.validate import validate
from depthlab.train.flops import train_flops_per_token
from tests.conftest import tiny_model_config
from tests.test_arch import hf_twin, randomized
from tests.test_hf_fixtures import tiny_hf

transformers = pytest.importorskip("transformers")
WINDOW, T = 5, 23  # the window matters: T > WINDOW


def mistral(window=WINDOW, **kw):
    return tiny_model_config(family="mistral", n_kv_heads=2, sliding_window=window, **kw)


def stock(model, attn_implementation):
    hf = hf_twin(model)
    hf.set_attn_implementation(attn_implementation)
    return hf


def logits_diff(ours, hf, ids):
    with torch.no_grad():
        return (ours(ids) - hf(ids).logits).abs().max().item()


def test_a_token_sees_itself_and_the_window_minus_one_before_it():
    model = randomized(Transformer(mistral(n_layers=1)))  # one layer: deeper, the windows chain
    ids = torch.randint(0, 97, (1, T))
    with torch.no_grad():
        base = model(ids)
        for back, seen in ((WINDOW - 1, True), (WINDOW, False)):  # key i - back for query i
            changed = ids.clone()
            changed[0, 10 - back] = (ids[0, 10 - back] + 1) % 97
            moved = (model(changed)[0, 10] - base[0, 10]).abs().max().item()
            assert (moved > 1e-4) == seen, (back, moved)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("scheme,tie", [("pre", False), ("pre", True), ("lns", False)])
def test_logits_match_stock_mistral_with_a_window_shorter_than_the_context(impl, scheme, tie):
    model = randomized(Transformer(mistral(norm_scheme=scheme, tie_embeddings=tie)))
    hf = stock(model, impl)
    assert type(hf).__name__ == "MistralForCausalLM" and hf.config.sliding_window == WINDOW
    ids = torch.randint(0, 97, (3, T))
    assert logits_diff(model, hf, ids) < 1e-5
    full = Transformer(mistral(window=None, norm_scheme=scheme, tie_embeddings=tie), init=False)
    full.load_state_dict(model.state_dict())
    assert logits_diff(full.eval(), hf, ids) > 1e-3  # the window acts: without it the logits differ


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_import_of_stock_mistral_keeps_the_window(impl, tmp_path):
    hf = tiny_hf("mistral", sliding_window=6)
    hf.set_attn_implementation(impl)
    hf.save_pretrained(tmp_path / "m")
    model, cfg = import_hf(tmp_path / "m")
    assert cfg.model.family == "mistral" and cfg.model.sliding_window == 6 and cfg.model.max_seq_len == 64
    ids = torch.randint(0, 97, (2, T))
    assert logits_diff(model, hf, ids) < 1e-5


def test_train_export_import_from_the_cli(tmp_path, corpus):
    from depthlab.cli import main
    from depthlab.loading import load_model

    sets = [f"model.{k}={v}" for k, v in dict(family="mistral", sliding_window=6, dim=32, n_layers=2, n_heads=4,
                                                n_kv_heads=2, ffn_dim=64, vocab_size=300, max_seq_len=64).items()]
    sets += ["data.seq_len=16", "train.batch_size=4", "train.eval_every=1000", "train.monitor_every=0",
             "train.warmup_steps=1"]
    assert main(["train", "--data", str(corpus), "--max-steps", "5", "--run-dir", str(tmp_path / "run"),
                 "--no-progress", *[a for s in sets for a in ("--set", s)]]) == 0
    trained = load_model(tmp_path / "run", hf=False).model.eval()
    assert trained.cfg.family == "mistral" and trained.cfg.sliding_window == 6
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["sliding_window"] == 6
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, trained.cfg.vocab_size, (2, 16))
    assert logits_diff(trained, hf, ids) < 1e-5
    back, cfg = import_hf(tmp_path / "out")
    assert cfg.model.family == "mistral" and cfg.model.sliding_window == 6
    with torch.no_grad():  # the lns run's scales are in the export's weights: imported as pre, the same function
        assert (back(ids) - trained(ids)).abs().max() < 1e-5


def test_the_window_is_mistrals_and_gemma2s_only_and_positive():
    window = r"model.sliding_window is .*Mistral's attention window \(model.family=mistral\)"
    with pytest.raises(UserError, match=window):
        validate(Config(model=tiny_model_config(sliding_window=8), data=DataConfig(seq_len=16)))
    with pytest.raises(UserError, match="model.sliding_window must be a positive"):
        validate(Config(model=mistral(window=0), data=DataConfig(seq_len=16)))
    validate(Config(model=mistral(window=None), data=DataConfig(seq_len=16)))


def test_flops_count_the_keys_inside_the_window():
    windowed, full = mistral(window=8), tiny_model_config(n_kv_heads=2)
    attention_term = 12 * full.n_layers * full.dim  # per attended key
    assert train_flops_per_token(windowed, 32) == train_flops_per_token(full, 32) - attention_term * (32 - 8)
    assert train_flops_per_token(windowed, 8) == train_flops_per_token(full, 8)
