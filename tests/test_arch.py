"""Model families (model.family): each family's model against transformers' own class in both directions,
LNS on each family against its formula (docs/method.md section 2.4), the scheme x family refusals and exports, the
presets' sizes, and import -> continued pretraining with LNS -> export for every family. What the tests know of
each family is its row in tests/families.py."""

import pytest
import torch
import torch.nn.functional as F

from depthlab import UserError
from depthlab.config import Config, DataConfig
from depthlab.hf import import_hf
from depthlab.hf.exporter import hf_weights_and_config
from depthlab.model import SCHEMES, Transformer, lm_loss
from depthlab.model.families import FAMILIES as REGISTERED, preset
from depthlab.model.validate import validate
from tests.conftest import tiny_model_config
from tests.families import FAMILIES as FACTS
from tests.scheme_oracles import ORACLES
from tests.test_hf_fixtures import randomize_norms, tiny_hf, word_tokenizer

transformers = pytest.importorskip("transformers")
FAMILIES = [f for f in REGISTERED if f != "vit"]  # the language families (the ViT: tests/test_vit*.py)


def test_every_language_family_has_its_row_in_the_fixture_table():
    assert set(FAMILIES) == set(FACTS)


def family_config(family, **kw):
    base = {"family": family, "n_kv_heads": 2, "norm_eps": 1e-6, **FACTS[family].ours}
    return tiny_model_config(**{**base, **kw})


def randomized(model):
    """Norm weights in [0.5, 1.5] and biases in [-0.5, 0.5]: a wrong mapping, fold or bias cannot hide."""
    randomize_norms(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
    return model.eval()


def hf_twin(model):
    """The stock model the export of `model` is, built in this process (eager attention: soft-capping has no
    other)."""
    state, fields = hf_weights_and_config(model)
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "torch_dtype")}
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**fields),
                                                       attn_implementation="eager").eval()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if model.cfg.tie_embeddings else set())
    return hf


def max_diff(model, hf, T=17):
    ids = torch.randint(0, model.cfg.vocab_size, (3, T))
    with torch.no_grad():
        return (model(ids) - hf(ids).logits).abs().max().item()


def stock_class(family, scheme):
    return FACTS["gemma2" if ORACLES[scheme].hf_export == "gemma2" else family].hf_class


@pytest.mark.parametrize("family,scheme,tie", [(a, s, False) for a in FACTS for s in FACTS[a].exported()] +
                         [(a, FACTS[a].own_scheme, True) for a in FACTS])
def test_logits_match_the_stock_class_for_every_scheme_that_exports(family, scheme, tie):
    model = randomized(Transformer(family_config(family, norm_scheme=scheme, tie_embeddings=tie)))
    hf = hf_twin(model)
    assert type(hf).__name__ == stock_class(family, scheme)
    assert max_diff(model, hf) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_wider_than_dim_over_heads_match_both_ways(family, tmp_path):
    model = randomized(Transformer(family_config(family, head_size=16)))  # 4 heads of 16 at dim 32
    hf = hf_twin(model)
    assert hf.config.head_dim == 16 and hf.model.layers[0].self_attn.q_proj.out_features == 64
    assert max_diff(model, hf) < 1e-5
    hf.save_pretrained(tmp_path / "m")
    back, cfg = import_hf(tmp_path / "m")
    assert cfg.model.head_size == 16 and max_diff(back, hf) < 1e-5
    assert import_hf(tiny_hf(family, head_dim=8))[1].model.head_size is None  # dim / heads: no explicit size


def test_olmo_clip_qkv_matches_transformers():
    model = randomized(Transformer(family_config("olmo", clip_qkv=0.3, norm_scheme="lns")))
    hf = hf_twin(model)
    assert hf.config.clip_qkv == 0.3 and max_diff(model, hf) < 1e-5
    assert max_diff(model, hf_twin(randomized(Transformer(family_config("olmo"))))) > 1e-2  # the clamp acts


@pytest.mark.parametrize("family", FAMILIES)
def test_import_matches_hf_logits_biases_included(family, tmp_path):
    hf = tiny_hf(family, tie_word_embeddings=family == "qwen2")
    with torch.no_grad():  # every released Qwen2 / Qwen2.5 has nonzero q/k/v biases
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
    hf.save_pretrained(tmp_path / "m")
    model, cfg = import_hf(tmp_path / "m")
    assert cfg.model.family == family and cfg.model.norm_scheme == FACTS[family].own_scheme
    assert max_diff(model, hf, T=23) < 1e-5


def rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def lns_reference(family, blk, h, rope, s):
    """Block l of `lns` written from docs/method.md section 2.4: every block norm's output times s = l^(-p)."""
    attn, mlp, eps = (lambda x: blk.attn(x, rope)), blk.mlp, blk.attn_norm.eps
    if family == "gemma2":  # a norm before and after each branch: h + s * Norm(F(Norm(h))), s on the one after
        h = h + s * rms(attn(rms(h, blk.attn_norm.weight, eps)), blk.attn_out_norm.weight, eps)
        return h + s * rms(mlp(rms(h, blk.mlp_norm.weight, eps)), blk.mlp_out_norm.weight, eps)
    if family == "olmo2":  # norms on the branch outputs: h + s * Norm(F(h))
        h = h + s * rms(attn(h), blk.attn_norm.weight, eps)
        return h + s * rms(mlp(h), blk.mlp_norm.weight, eps)
    if family == "olmo":  # LayerNorm without weight or bias
        h = h + attn(s * F.layer_norm(h, (h.shape[-1],), eps=eps))
        return h + mlp(s * F.layer_norm(h, (h.shape[-1],), eps=eps))
    h = h + attn(s * rms(h, blk.attn_norm.weight, eps))
    return h + mlp(s * rms(h, blk.mlp_norm.weight, eps))


@pytest.mark.parametrize("family", FAMILIES)
def test_lns_on_each_family_follows_its_formula(family):
    model = randomized(Transformer(family_config(family, norm_scheme="lns", n_layers=5, lns_power=0.7)))
    h = torch.randn(2, 9, model.cfg.dim)
    rope = (model.rope_cos[:9], model.rope_sin[:9])
    with torch.no_grad():
        for l in (1, 4, 5):
            blk = model.layers[l - 1]
            assert torch.allclose(blk(h, rope), lns_reference(family, blk, h, rope, l ** -0.7), atol=1e-5)
        assert model.norm.scale == 1.0  # the final norm is never scaled
    if family == "olmo2":  # QK-norms are not block norms: unscaled
        assert model.layers[4].attn.q_norm.scale == 1.0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_every_scheme_runs_and_exports_on_every_family_or_is_refused_in_one_line(family, scheme):
    cfg = Config(model=family_config(family, norm_scheme=scheme), data=DataConfig(seq_len=16))
    runs = FACTS[family].runs()
    if scheme not in runs:
        with pytest.raises(UserError, match=rf"model.family={family} .*{scheme!r}.*use {', '.join(runs)}$") as e:
            validate(cfg)
        assert "\n" not in str(e.value)
        return
    validate(cfg)
    model = Transformer(cfg.model)
    ids = torch.randint(0, 97, (2, 9))
    lm_loss(model(ids[:, :-1]), ids[:, 1:]).backward()
    assert all(p.grad is not None for p in model.parameters())
    if scheme in FACTS[family].exported():  # its logits: test_logits_match_the_stock_class_for_every_scheme...
        assert hf_weights_and_config(model)[1]["architectures"] == [stock_class(family, scheme)]
        return
    with pytest.raises(UserError, match=scheme) as e:
        hf_weights_and_config(model)
    assert "\n" not in str(e.value)


def test_clip_qkv_is_olmos_only():
    with pytest.raises(UserError, match="clip_qkv.*olmo"):
        validate(Config(model=family_config("qwen2", clip_qkv=8.0), data=DataConfig(seq_len=16)))


@pytest.mark.parametrize("name,family,published", [
    ("qwen2.5-0.5b", "qwen2", 0.494e9), ("olmo-1b", "olmo", 1.177e9), ("olmo-7b", "olmo", 6.888e9),
    ("olmo2-1b", "olmo2", 1.485e9)])
def test_presets_have_the_published_sizes(name, family, published):
    cfg = validate(preset(name))
    with torch.device("meta"):
        n = Transformer(cfg.model, init=False).num_params()
    assert cfg.model.family == family and abs(n / published - 1) < 0.01, n


@pytest.mark.parametrize("family", FAMILIES)
def test_import_continue_with_lns_and_export_for_every_family(family, tmp_path):
    from depthlab.cli import main
    from depthlab.hf.exporter import hf_tokenizer
    from depthlab.loading import load_model

    hf = tiny_hf(family, tie_word_embeddings=family == "qwen2", vocab_size=17)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
    hf.save_pretrained(tmp_path / "hf")
    hf_tokenizer(word_tokenizer()).save_pretrained(tmp_path / "hf")
    text = tmp_path / "text.txt"
    words = word_tokenizer().get_vocab()
    text.write_text("\n".join(" ".join(sorted(words)[i % 10:] + ["the sky is blue"]) for i in range(300)))
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "ckpt"), "--scheme", "lns"]) == 0
    sets = ["--set", "data.seq_len=16", "--set", "train.batch_size=4", "--set", "train.eval_every=1000",
            "--set", "train.monitor_every=0", "--set", "train.warmup_steps=1"]
    assert main(["train", "--init-from", str(tmp_path / "ckpt"), "--data", str(text), "--max-steps", "5",
                 "--run-dir", str(tmp_path / "run"), "--no-progress", *sets]) == 0
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    trained = load_model(tmp_path / "run", hf=False).model.eval()
    assert trained.cfg.family == family and trained.cfg.norm_scheme == "lns"
    stock = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    # a word-level tokenizer is not Qwen2's, which transformers would put in its place: the qwen2 run exports
    # as the Llama with attention biases it equals (depthlab.model.families.qwen2)
    assert type(stock).__name__ == ("LlamaForCausalLM" if family == "qwen2" else FACTS[family].hf_class)
    assert max_diff(trained, stock) < 1e-5


def test_export_refusals_name_the_family():
    from depthlab.hf.exporter import hf_weights_and_config

    with pytest.raises(UserError, match="sandwich of model.family=llama"):
        hf_weights_and_config(Transformer(family_config("qwen2", norm_scheme="sandwich")))
    with pytest.raises(UserError, match="OlmoForCausalLM fixes its norm's epsilon at 1e-05"):
        hf_weights_and_config(Transformer(family_config("olmo", norm_eps=1e-6)))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_prints(family):
    """print(model) names the attention's options (a window, a soft cap, a score scale) and never raises."""
    text = repr(Transformer(family_config(family)))
    assert "Transformer(" in text and "None" not in text.split("Attention(")[-1].split(")")[0]
