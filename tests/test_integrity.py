"""What a reader must never take silently (issue 34): an HF directory whose config ties the LM head to the embedding
while it stores a head of its own, an edited checkpoint meta.json, changed or out-of-range prepared tokens,
MMLU and JSON text inputs that would drop questions or records unseen, and a full disk that must say so."""

from __future__ import annotations

import csv
import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from depthlab import UserError, checkpoint
from depthlab.cli import main
from tests.test_trainer import TINY

TRAIN = [f"--set={k}={v}" for k, v in TINY.items()] + ["--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_main(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert "Traceback" not in err and lines[-1].startswith("depthlab: error:"), err
    return lines[-1]


# ---------------------------------------------------------------- item 5: a tied config with a stored head
def _tiny_llama(path, head: torch.Tensor | None):
    """A tiny random LlamaForCausalLM saved with tie_word_embeddings=True, then edited to store `head` as
    lm_head.weight (a distinct matrix, or the embedding's own values)."""
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(path)
    state = load_file(str(path / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone() if head is None else head
    save_file(state, str(path / "model.safetensors"), {"format": "pt"})


@pytest.mark.parametrize("stored", ["its-own-head", "the-embedding"])
def test_a_tied_config_with_a_stored_head_imports_as_transformers_loads_it(tmp_path, stored, capsys):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from depthlab.hf.importer import import_hf

    _tiny_llama(tmp_path, torch.randn(64, 32) if stored == "its-own-head" else None)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    ours, cfg = import_hf(str(tmp_path))
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gap = (ours.eval()(ids) - theirs(input_ids=ids).logits).abs().max().item()
    assert gap < 1e-5, gap
    err = capsys.readouterr().err
    assert cfg.model.tie_embeddings is (stored == "the-embedding")
    assert ("imported untied" in err) is (stored == "its-own-head"), err


# ---------------------------------------------------------------- item 6: meta.json's own checksum
@pytest.fixture(scope="module")
def run4(tmp_path_factory, corpus):
    run = tmp_path_factory.mktemp("meta") / "run"
    assert main(["train", "--run-dir", str(run), "--data", str(corpus), "--max-steps", "4", *TRAIN,
                 "--set", "train.ckpt_every=2"]) == 0
    return run


def _edit_meta(ckpt, **fields):
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, **fields}, indent=2) + "\n")


def test_an_edited_meta_json_is_refused_and_never_resumed_from(tmp_path, run4, corpus, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run4, run)
    newest = checkpoint.list_checkpoints(run)[-1]
    assert json.loads((newest / "meta.json").read_text())["step"] == 4
    _edit_meta(newest, step=7)
    code, err = run_main(capsys, "eval", "ppl", newest)
    assert code == 2 and "meta.json does not match its checksum" in one_error_line(err)
    assert "the previous valid checkpoint is" in err and len(err.splitlines()) == 1
    code, err = run_main(capsys, "train", "--run-dir", run, "--data", corpus, "--resume", "auto", "--max-steps", 4,
                         *TRAIN, "--set", "train.ckpt_every=2")
    assert code == 0 and "skipping corrupted checkpoint" in err and "step 7" not in err, err
    assert "step 2" in err  # resumed from the last checkpoint whose metadata is what it was written as


def test_a_checkpoint_from_before_the_meta_checksum_still_loads_and_says_so_once(tmp_path, run4, capsys,
                                                                                  monkeypatch):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run4, run)
    for ckpt in checkpoint.list_checkpoints(run):  # as an older depthlab wrote them
        meta = json.loads((ckpt / "meta.json").read_text())
        del meta[checkpoint.META_DIGEST]
        (ckpt / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    monkeypatch.setattr(checkpoint, "_UNSEALED_NOTED", [])
    steps = [checkpoint.verify_checkpoint(c).step for c in checkpoint.list_checkpoints(run)]
    assert steps == [2, 4]
    err = capsys.readouterr().err
    assert err.count("before checkpoints checksummed their meta.json") == 1, err


def test_the_meta_checksum_depends_on_content_not_layout(tmp_path, run4):
    ckpt = checkpoint.list_checkpoints(run4)[-1]
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta[checkpoint.META_DIGEST] == checkpoint.meta_digest(dict(reversed(list(meta.items()))))
    assert meta[checkpoint.META_DIGEST] != checkpoint.meta_digest({**meta, "step": 5})


# ---------------------------------------------------------------- item 7: prepared token files
@pytest.fixture(scope="module")
def docs(tmp_path_factory, corpus):
    """The corpus as 60 documents (one file each), enough for `data prepare` to hold some out."""
    d = tmp_path_factory.mktemp("docs")
    lines = corpus.read_text().splitlines(keepends=True)
    for i in range(60):
        (d / f"{i:02d}.txt").write_text("".join(lines[i * 50:(i + 1) * 50]))
    return d


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, docs):
    from depthlab.data.prepare import prepare

    out = tmp_path_factory.mktemp("prep") / "prep"
    prepare([str(docs)], out, vocab_size=300, workers=1, progress=False, log=lambda m: None)
    return out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _poke(path, position: int, value: int, dtype) -> None:
    tokens = np.memmap(path, dtype=dtype, mode="r+")
    tokens[position] = value
    tokens.flush()
    del tokens


def test_the_index_records_each_splits_checksum(prepared):
    import hashlib

    index = json.loads((prepared / "index.json").read_text())
    for info in index["splits"].values():
        assert info["sha256"] == hashlib.sha256((prepared / info["file"]).read_bytes()).hexdigest()


def test_overwritten_tokens_are_refused_in_one_line(tmp_path, prepared, capsys):
    prep = _copy(prepared, tmp_path / "prep")
    index = json.loads((prep / "index.json").read_text())
    tokens = np.fromfile(prep / "train.bin", dtype=index["dtype"])
    _poke(prep / "train.bin", 100, (int(tokens[100]) + 1) % index["vocab_size"], index["dtype"])  # a valid id
    code, err = run_main(capsys, "train", "--run-dir", tmp_path / "run", "--data", prep, "--max-steps", 1, *TRAIN)
    assert code == 2 and "train.bin does not match the sha256 in index.json" in one_error_line(err), err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_out_of_range_id_is_one_line_not_an_index_error(tmp_path, prepared, capsys, split):
    prep = _copy(prepared, tmp_path / "prep")
    index = json.loads((prep / "index.json").read_text())
    for info in index["splits"].values():  # data from before the checksums: the ids are still checked
        del info["sha256"]
    (prep / "index.json").write_text(json.dumps(index))
    _poke(prep / f"{split}.bin", 7, 40000, index["dtype"])
    code, err = run_main(capsys, "train", "--run-dir", tmp_path / "run", "--data", prep, "--max-steps", 1, *TRAIN)
    line = one_error_line(err)
    assert code == 2 and f"{split}.bin holds token id 40000 (at token 7)" in line and "outside" in line, err
    run = tmp_path / "run"  # and in eval, of a model with this data's tokenizer
    _poke(prep / f"{split}.bin", 7, 0, index["dtype"])
    assert run_main(capsys, "train", "--run-dir", run, "--data", prep, "--max-steps", 1, *TRAIN)[0] == 0
    _poke(prep / f"{split}.bin", 7, 40000, index["dtype"])
    code, err = run_main(capsys, "eval", "ppl", run, "--data", prep)
    if split == "val":
        assert code == 2 and "val.bin holds token id 40000" in one_error_line(err), err
    else:  # eval reads (and so checks) the validation split only
        assert code == 0, err


def test_data_prepared_before_checksums_still_loads_and_says_so_once(tmp_path, prepared, monkeypatch, capsys):
    from depthlab.data import prepared as module

    prep = _copy(prepared, tmp_path / "prep")
    index = json.loads((prep / "index.json").read_text())
    for info in index["splits"].values():
        del info["sha256"]
    (prep / "index.json").write_text(json.dumps(index))
    monkeypatch.setattr(module, "_NOTED", [])
    for _ in range(2):
        _, _, arrays = module.load_prepared(prep)
    assert len(arrays["train"]) == index["splits"]["train"]["tokens"]
    assert capsys.readouterr().err.count("prepared before token files carried checksums") == 1


# ---------------------------------------------------------------- item 9: MMLU and JSON text inputs
def _mmlu_csv(root, subject, rows, bom=False):
    (root / "test").mkdir(parents=True, exist_ok=True)
    with open(root / "test" / f"{subject}_test.csv", "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        csv.writer(f).writerows(rows)


ROW = ["What is 2 + 2?", "3", "4", "5", "6", "B"]


def test_mmlu_csv_with_a_byte_order_mark_reads_like_without(tmp_path):
    from depthlab.eval.mmlu import read_mmlu

    _mmlu_csv(tmp_path / "plain", "math", [ROW] * 3)
    _mmlu_csv(tmp_path / "excel", "math", [ROW] * 3, bom=True)
    assert read_mmlu(tmp_path / "excel") == read_mmlu(tmp_path / "plain")


def test_an_empty_mmlu_subject_is_refused_not_dropped(tmp_path):
    from depthlab.eval.mmlu import read_mmlu

    _mmlu_csv(tmp_path, "math", [ROW] * 3)
    _mmlu_csv(tmp_path, "law", [])
    with pytest.raises(UserError, match=r"MMLU subject law: .*law_test.csv holds no test questions"):
        read_mmlu(tmp_path)


def test_an_empty_parquet_mmlu_subject_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from depthlab.eval.mmlu import read_mmlu

    row = {"question": "q?", "choices": ["a", "b", "c", "d"], "answer": 1}
    for subject, rows in (("math", [row]), ("law", [])):
        (tmp_path / subject).mkdir()
        table = pa.Table.from_pylist(rows, schema=pa.Table.from_pylist([row]).schema)
        pq.write_table(table, tmp_path / subject / "test-00000-of-00001.parquet")
    with pytest.raises(UserError, match="MMLU subject law: .* holds no test questions"):
        read_mmlu(tmp_path)


def test_both_mmlu_layouts_in_one_folder_are_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from depthlab.eval.mmlu import read_mmlu

    _mmlu_csv(tmp_path, "math", [ROW])
    (tmp_path / "law").mkdir()
    pq.write_table(pa.Table.from_pylist([{"question": "q?", "choices": ["a", "b", "c", "d"], "answer": 1}]),
                   tmp_path / "law" / "test-00000-of-00001.parquet")
    with pytest.raises(UserError, match="holds both layouts, 1 test/SUBJECT_test.csv and 1 SUBJECT/test"):
        read_mmlu(tmp_path)


@pytest.mark.parametrize("value, kind", [(None, "null"), (12345, "of type int"), (["a"], "of type list")])
def test_a_record_whose_text_is_not_a_string_is_refused_by_one_rule(tmp_path, value, kind):
    from depthlab.data.sources import file_documents

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": value}) + "\n")
    with pytest.raises(UserError, match=rf"d.jsonl:2: field 'text' is {kind}, not text"):
        list(file_documents(str(f)))
    g = tmp_path / "d.json"
    g.write_text(json.dumps([{"text": "fine"}, {"text": value}]))
    with pytest.raises(UserError, match=rf"d.json: record 1: field 'text' is {kind}, not text"):
        list(file_documents(str(g)))


def test_an_empty_string_is_an_empty_document_and_a_parquet_null_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from depthlab.data.sources import file_documents

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": ""}) + "\n")
    assert [d.text for d in file_documents(str(f))] == ["fine"]
    pq.write_table(pa.table({"text": ["fine", None]}), tmp_path / "d.parquet")
    with pytest.raises(UserError, match="d.parquet row 1: field 'text' is null, not text"):
        list(file_documents(str(tmp_path / "d.parquet")))


# ---------------------------------------------------------------- item 11: a full disk says so
def test_a_full_disk_during_a_checkpoint_says_the_disk_is_full(tmp_path, corpus, capsys, monkeypatch):
    real = torch.save

    def full(obj, f, *a, **k):  # what torch's serializer raises when the disk fills under it
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 5373952 vs 5373848")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(checkpoint, "_free_bytes", lambda where: 0)  # the disk, as it is at that moment
    run = tmp_path / "run"
    code, err = run_main(capsys, "train", "--run-dir", run, "--data", corpus, "--max-steps", 2, *TRAIN)
    monkeypatch.setattr(torch, "save", real)
    line = one_error_line(err)
    assert code == 2 and "the disk is full" in line and str(run / "checkpoints") in line, line
    assert "nothing was lost" in line and "unexpected pos" not in line


def test_enospc_in_data_prepare_says_the_disk_is_full_and_resumes(tmp_path, docs, monkeypatch, capsys):
    from depthlab.data import prepare as module

    real, writes = module.write_json_atomic, []

    def full(path, obj):
        writes.append(path)
        if path.name.startswith("unit-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, obj)

    monkeypatch.setattr(module, "write_json_atomic", full)
    job = ["data", "prepare", docs, "--out", tmp_path / "out", "--vocab-size", 300, "--workers", 1,
           "--no-progress"]
    code, err = run_main(capsys, *job)
    line = one_error_line(err)
    assert code == 2 and "the disk is full" in line and "rerunning the same command resumes it" in line
    monkeypatch.setattr(module, "write_json_atomic", real)
    assert run_main(capsys, *job)[0] == 0


def test_enospc_in_import_does_not_claim_earlier_checkpoints(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from safetensors import SafetensorError, torch as st

    _tiny_llama(tmp_path / "hf", None)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0")).save(
        str(tmp_path / "hf" / "tokenizer.json"))

    def full(*a, **k):  # safetensors' own words for ENOSPC
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(st, "save_file", full)
    code, err = run_main(capsys, "import", tmp_path / "hf", tmp_path / "out")
    line = one_error_line(err)
    assert code == 2 and "the disk is full" in line and "nothing was lost: nothing was written" in line, line
    assert "earlier checkpoints" not in line and not (tmp_path / "out").exists()


RLIMITED = """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv.pop(1)),) * 2)
    from depthlab.cli import main
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["train", "prepare"])
@pytest.mark.slow
def test_a_file_size_limit_is_named_in_one_line_in_a_real_process(tmp_path, corpus, docs, command):
    """The real writers under RLIMIT_FSIZE: safetensors and torch report a short write in their own words (no
    errno), numpy as "N requested and M written"; each is one line naming the limit."""
    argv = (["train", "--run-dir", tmp_path / "run", "--data", corpus, "--max-steps", 1, *TRAIN]
            if command == "train" else
            ["data", "prepare", docs, "--out", tmp_path / "out", "--vocab-size", 300, "--workers", 1,
             "--no-progress"])
    limit = 60_000 if command == "train" else 30_000
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(RLIMITED), str(limit),
                          *map(str, argv)], env=ENV, capture_output=True, text=True, timeout=300)
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and "file-size limit (ulimit -f" in line and "nothing was lost" in line, res.stderr
    assert "requested and" not in line and "unexpected pos" not in line


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path):
    from depthlab.data.sources import file_documents

    (tmp_path / "d.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "hello"}\n{"text": "world"}\n')
    (tmp_path / "d.txt").write_bytes(b"\xef\xbb\xbfhello world\n")
    assert [d.text for d in file_documents(str(tmp_path / "d.jsonl"))] == ["hello", "world"]
    assert [d.text for d in file_documents(str(tmp_path / "d.txt"))] == ["hello world\n"]
