"""GGUF files as a model source (depthlab.gguf): a tiny GGUF written here goes through analyze, import, eval and
prune with the numbers of its dequantized HF directory; an unreadable tensor type and a missing `gguf` package are
one line each."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

from depthlab.cli import main
from depthlab.gguf import plain
from tests.gguf_fixtures import PARTS, TEXT, bpe_tokenizer, tiny_llama, write_gguf

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the GGUF file, its dequantized HF directory made here by transformers, a text file)."""
    root = tmp_path_factory.mktemp("gguf")
    tok = bpe_tokenizer()
    (root / "file").mkdir()
    f = root / "file" / "tiny-F16.gguf"
    write_gguf(f, tiny_llama(tok.get_vocab_size()), tok)
    dense = root / "dense"
    plain(transformers.AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name,
                                                            dtype=torch.float32)).save_pretrained(dense)
    transformers.AutoTokenizer.from_pretrained(str(f.parent), gguf_file=f.name).save_pretrained(dense)
    text = root / "text.txt"
    text.write_text(TEXT)
    return f, dense, text


def _numbers(res: dict) -> dict:
    """The results without what names the model or times the run."""
    return {k: v for k, v in res.items() if k not in ("model", "notes", "wall_s")}


@pytest.mark.slow
def test_analyze_of_the_file_is_analyze_of_its_dequantized_directory(tiny, tmp_path):
    f, dense, text = tiny
    got = {}
    for name, model in (("file", f), ("folder", f.parent), ("dense", dense)):
        assert main(["analyze", str(model), "--data", str(text), "--tokens", "128", "--seq-len", "32", "--probes", "1",
                     "--sublayers", "--no-progress", "--out", str(tmp_path / name)]) == 0
        got[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    assert _numbers(got["file"]) == _numbers(got["dense"]) == _numbers(got["folder"])
    assert got["file"]["removal"]["base_ppl"] > 1 and len(got["file"]["removal"]["attn"]) == 4
    src = got["file"]["model"]["gguf"]
    assert src["quantization"] == "F16" and src["architecture"] == "llama"
    assert src["tensor_types"] == {"F16": 30, "F32": 9}
    assert "gguf" not in got["dense"]["model"]
    assert "quantization F16" in (tmp_path / "file" / "report.html").read_text()


@pytest.mark.slow
def test_compare_takes_the_file_with_the_numbers_of_its_directory(tiny, tmp_path, capsys):
    f, dense, text = tiny
    assert main(["compare", str(f), str(dense), "--data", str(text), "--tokens", "128", "--seq-len", "32", "--probes",
                 "1", "--no-progress", "--out", str(tmp_path / "cmp")]) == 0
    runs = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert list(runs) == [f.name, dense.name]
    assert _numbers(runs[f.name]) == _numbers(runs[dense.name])
    assert runs[f.name]["model"]["gguf"]["quantization"] == "F16"
    rows = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert rows[1].split(",", 1)[1] == rows[2].split(",", 1)[1]  # every column but the model's label


def test_import_eval_and_prune_take_the_file(tiny, tmp_path, capsys):
    f, dense, text = tiny
    assert main(["import", str(f), str(tmp_path / "ck")]) == 0
    assert main(["import", str(dense), str(tmp_path / "ck_dense")]) == 0
    from depthlab.loading import load_checkpoint

    a, b = load_checkpoint(tmp_path / "ck")[0].state_dict(), load_checkpoint(tmp_path / "ck_dense")[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    losses = []
    for model in (f, dense, tmp_path / "ck"):
        assert main(["eval", "ppl", str(model), "--data", str(text), "--seq-len", "32", "--no-progress"]) == 0
        losses.append(capsys.readouterr().out.split("loss")[1].split()[0])
    assert losses[0] == losses[1], losses  # the file and its directory: the same printed loss
    assert main(["prune", str(f), "--remove", "1:3", str(tmp_path / "pruned")]) == 0
    small = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned")
    assert small.config.num_hidden_layers == 2


def test_a_tensor_type_no_reader_dequantizes_is_one_line(tmp_path, capsys):
    tok = bpe_tokenizer()
    write_gguf(tmp_path / "f64.gguf", tiny_llama(tok.get_vocab_size(), n_layers=1), tok, matrix_dtype=np.float64)
    assert main(["analyze", str(tmp_path / "f64.gguf"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensor type F64 cannot be dequantized" in err


def test_a_missing_gguf_package_names_the_extra(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gguf", None)  # how Python spells "not installed" to find_spec
    shutil.copy(tiny[0], tmp_path / "m.gguf")
    assert main(["eval", "ppl", str(tmp_path / "m.gguf"), "--data", str(tiny[2])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "depthlab[gguf]" in err and "`gguf`" in err


def test_a_folder_of_several_gguf_files_asks_for_one(tiny, tmp_path, capsys):
    (tmp_path / "m").mkdir()
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(tiny[0], tmp_path / "m" / name)
    assert main(["analyze", str(tmp_path / "m"), "--out", str(tmp_path / "o")]) == 2
    assert "holds 2 GGUF files" in capsys.readouterr().err


def test_an_architecture_transformers_does_not_read_is_one_line(tmp_path, capsys):
    from tests.gguf_fixtures import gguf

    w = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "notanarch")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["import", str(tmp_path / "odd.gguf"), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGUF architecture 'notanarch' is not one transformers reads" in err


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


@pytest.mark.parametrize("leave_out, named", [
    (("output_norm.weight",), "model.norm.weight"),  # transformers would make it all ones
    (tuple(f"blk.3.{p}.weight" for p in PARTS.values()), "model.layers.3."),  # a header of 4 blocks, 3 stored
], ids=["no-output-norm", "4-blocks-3-stored"])
def test_a_file_missing_a_tensor_its_header_implies_is_refused_in_one_line(tmp_path, cache, capsys, leave_out,
                                                                          named):
    tok = bpe_tokenizer()
    write_gguf(tmp_path / "cut.gguf", tiny_llama(tok.get_vocab_size()), tok, leave_out=leave_out)
    for argv in (["import", str(tmp_path / "cut.gguf"), str(tmp_path / "ck")],
                 ["analyze", str(tmp_path / "cut.gguf"), "--out", str(tmp_path / "an")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "lacks" in err and named in err and "header implies" in err, err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "an").exists()
    assert not cache.parent.exists()  # no cache folder, no lock file: nothing was cached


def test_a_damaged_cache_entry_is_said_and_made_again(tiny, cache, capsys):
    from depthlab.gguf import dequantized

    entry = dequantized(tiny[0])
    weights = entry / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # a disk that filled, a copy cut short
    assert dequantized(tiny[0]) == entry
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGUF cache entry" in err and "damaged" in err and "model.safetensors" in err
    assert weights.read_bytes() == whole
    assert dequantized(tiny[0]) == entry and capsys.readouterr().err == ""  # whole again: no second word


def test_what_a_killed_dequantization_left_is_cleared_by_the_next(tiny, cache):
    from depthlab.gguf import dequantized

    entry = dequantized(tiny[0])
    shutil.rmtree(entry)
    debris = cache / f".{entry.name}-k1ll3d"  # the temporary folder of a dequantization killed by SIGKILL
    debris.mkdir()
    (debris / "model.safetensors").write_bytes(b"half")
    assert dequantized(tiny[0]) == entry and not debris.exists()
    assert [p.name for p in cache.iterdir()] == [entry.name]


def test_a_cache_that_cannot_be_written_is_blamed_on_the_cache_not_on_the_output(tiny, tmp_path, monkeypatch, capsys):
    (tmp_path / "not_a_folder").write_text("a file where the cache should be\n")
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path / "not_a_folder"))
    assert main(["analyze", str(tiny[0]), "--out", str(tmp_path / "new_out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGUF cache" in err and "DEPTHLAB_CACHE" in err and "not_a_folder" in err, err
    assert "new_out" not in err and not (tmp_path / "new_out").exists()
