"""Every export tokenizes like its run under the installed transformers, and `depthlab import` of an export gives
the run back: weights bitwise (scheme pre), tokenizer ids identical. Import refuses what does not fit."""

import json

import pytest
import torch

from depthlab import UserError
from depthlab.cli import main
from depthlab.config import Config
from depthlab.data.tokenizer import train_bpe
from depthlab.hf.exporter import TOKENIZER_PROBE, export
from depthlab.hf.importer import import_to_checkpoint, save_as_checkpoint
from depthlab.loading import load_checkpoint
from depthlab.model import Transformer
from tests.conftest import tiny_model_config
from tests.families import FAMILIES
from tests.test_hf_fixtures import tiny_hf, word_tokenizer

transformers = pytest.importorskip("transformers")

CORPUS = ["Hello  world\n\n  tabs\there  caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f389 it's I'M 12345\n"
          "def f(x):\n    return {'a': x**2}  # ok\r\n"] * 40
TEXTS = [TOKENIZER_PROBE, "   leading and trailing   ", "\n\n\n", "Cafe\u0301 vs caf\u00e9",
         "for i in range(10):\n\tprint(i)  \n", "\u00c5ngstr\u00f6m \u212b \ufb01 \u01c4 12 345 6789"]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(CORPUS, 400)


def _run(path, bpe, family, **kw):
    facts = FAMILIES[family]
    mc = tiny_model_config(norm_scheme=facts.own_scheme, family=family, vocab_size=512, **{**facts.ours, **kw})
    model = Transformer(mc).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # qwen2's q/k/v biases: nonzero, so a lost bias cannot hide
                p.uniform_(-0.1, 0.1)
    save_as_checkpoint(path, model, Config(model=mc), {"step": 3}, tokenizer=bpe)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_export_tokenizes_like_its_run_with_auto_tokenizer(tmp_path, bpe, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _run(tmp_path / "ckpt", bpe, family)
    out = export(tmp_path / "ckpt", tmp_path / "hf")
    stock = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert stock(text, add_special_tokens=False).input_ids == bpe.encode(text, add_special_tokens=False).ids, text
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 512, (2, 17))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-5


def test_a_qwen2_run_with_qwen2s_own_tokenizer_exports_as_qwen2(tmp_path):
    from transformers import AutoTokenizer, Qwen2Tokenizer

    qwen = Qwen2Tokenizer(vocab={"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate("abcdefgh ")}}, merges=[])
    _run(tmp_path / "ckpt", qwen.backend_tokenizer, "qwen2")
    out = export(tmp_path / "ckpt", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert type(AutoTokenizer.from_pretrained(out)).__name__ == "Qwen2Tokenizer"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_of_an_export_is_the_run(tmp_path, bpe, family):
    from depthlab.data.tokenizer import load_tokenizer, tokenizer_hash

    model = _run(tmp_path / "ckpt", bpe, family, tie_embeddings=family == "llama")
    export(tmp_path / "ckpt", tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0  # no --scheme: the family's own
    back, cfg, _ = load_checkpoint(tmp_path / "back")
    assert cfg.model.family == family and cfg.model.norm_scheme == FAMILIES[family].own_scheme
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k
    tok = load_tokenizer(tmp_path / "back" / "tokenizer.json")
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == bpe.encode(text, add_special_tokens=False).ids
        assert tok.encode(text).ids == bpe.encode(text).ids  # the export's start-token post-processor is undone
    assert tokenizer_hash(tok) == tokenizer_hash(bpe)


# ---------------------------------------------------------------- import verifies what it reads
@pytest.fixture
def hf_dir(tmp_path):
    d = tmp_path / "hf"
    tiny_hf("llama", n_layers=2).save_pretrained(d)
    word_tokenizer().save(str(d / "tokenizer.json"))
    return d


def _edit_config(d, **fields):
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **fields}))


@pytest.mark.parametrize("fields,match", [
    ({"num_hidden_layers": 3}, r"missing model\.layers\.2\..*num_hidden_layers=3"),
    ({"num_hidden_layers": 1}, r"left over model\.layers\.1\..*num_hidden_layers=1"),
    ({"hidden_size": 64}, r"wrongly shaped: .* is \(97, 32\) in the files, \(97, 64\) by the config"),
    ({"intermediate_size": 48}, r"wrongly shaped: model\.layers\.0\.mlp"),
])
def test_weights_that_do_not_fit_the_config_are_one_line(hf_dir, tmp_path, fields, match):
    _edit_config(hf_dir, **fields)
    with pytest.raises(UserError, match=match):
        import_to_checkpoint(hf_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_nonfinite_weights_are_refused(tmp_path):
    hf = tiny_hf("llama", n_layers=2)
    with torch.no_grad():
        hf.model.layers[1].mlp.up_proj.weight[0, 0] = float("inf")
    hf.save_pretrained(tmp_path / "hf")
    word_tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    with pytest.raises(UserError, match=r"NaN or inf: model\.layers\.1\.mlp\.up_proj\.weight"):
        import_to_checkpoint(tmp_path / "hf", tmp_path / "out")


def test_weights_left_on_meta_are_one_line():
    """A weight never read (left on the meta device, as a lazy load can leave it) is named, not a torch traceback."""
    from depthlab.model.apply import verify_loaded

    hf = tiny_hf("llama", n_layers=2)
    hf.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(torch.empty(hf.model.layers[1].mlp.up_proj.weight
                                                                            .shape, device="meta"))
    with pytest.raises(UserError, match=r"never read .* model\.layers\.1\.mlp\.up_proj\.weight"):
        verify_loaded(hf, {}, "hf")


def test_a_truncated_weights_file_is_one_line(hf_dir, tmp_path):
    f = hf_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
    with pytest.raises(UserError, match="cannot load Hugging Face model"):
        import_to_checkpoint(hf_dir, tmp_path / "out")


def test_without_a_tokenizer_import_says_how_to_give_one(hf_dir, tmp_path, capsys):
    (hf_dir / "tokenizer.json").rename(tmp_path / "tok.json")
    assert main(["import", str(hf_dir), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "holds no tokenizer" in err and "--tokenizer FILE" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert main(["import", str(hf_dir), str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok.json")]) == 0
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_a_tokenizer_larger_than_the_embedding_is_refused(hf_dir, tmp_path, bpe):
    bpe.save(str(tmp_path / "big.json"))  # 400 tokens for 97 embedding rows
    with pytest.raises(UserError, match="not this model's tokenizer"):
        import_to_checkpoint(hf_dir, tmp_path / "out", tokenizer=tmp_path / "big.json")
