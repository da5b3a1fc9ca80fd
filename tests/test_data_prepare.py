"""`depthlab data prepare`: round trip, dtype, determinism across workers, idempotence, resume, bad input,
and prepared data fed to build_token_data / `depthlab train`."""

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from depthlab import UserError
from depthlab.cli import main
from depthlab.config import Config
from depthlab.data import prepare as prep
from depthlab.data.dataset import build_token_data
from depthlab.data.prepare import prepare
from depthlab.data.prepared import load_prepared
from depthlab.data.tokenizer import tokenizer_hash
from depthlab.data.tokens import is_val, val_period
from tests.conftest import tiny_model_config
from tests.test_data_sources import small_bpe, write_c4

WORDS = "the of and to in is was for on that with as by at from his her an were are which this be".split()


def corpus(tmp_path, n_files=4, docs_per_file=12):
    """Several C4-style .json.gz files plus a text file; returns (folder, every document text in order)."""
    rng = np.random.default_rng(0)
    root, texts = tmp_path / "raw", []
    root.mkdir()
    for f in range(n_files):
        mine = [" ".join(rng.choice(WORDS, rng.integers(5, 40))) + f" ({f}.{i}) ünïcode ✓"
                for i in range(docs_per_file)]
        write_c4(root / f"c4-train.{f:05d}-of-01024.json.gz", mine)
        texts += mine
    (root / "zz-notes.txt").write_text("A plain text file\nwith two lines.\n")
    return root, texts + ["A plain text file\nwith two lines.\n"]


def decode_docs(tok: Tokenizer, ids: np.ndarray, eot: int) -> list[str]:
    cuts = np.flatnonzero(ids == eot)
    assert len(cuts) and cuts[-1] == len(ids) - 1  # every document ends with EOT
    return [tok.decode(ids[a + 1 if i else 0:b].tolist()) for i, (a, b) in enumerate(zip(np.r_[-1, cuts[:-1]], cuts))]


def quiet(**kw):
    return dict(progress=False, log=lambda msg: None, **kw)


def test_round_trip_and_held_out_by_document(tmp_path):
    root, texts = corpus(tmp_path)
    index = prepare([str(root)], tmp_path / "out", vocab_size=400, workers=1, unit_mb=1e-9, **quiet())  # 5 units
    idx, tok, arrays = load_prepared(tmp_path / "out")
    assert idx == json.loads((tmp_path / "out" / "index.json").read_text()) and index["splits"] == idx["splits"]
    assert idx["dtype"] == "uint16" and arrays["train"].dtype == np.uint16 and isinstance(arrays["train"], np.memmap)
    assert not (tmp_path / "out" / ".work").exists()
    # every val_period-th document of the whole input is held out, whatever the units
    period = val_period(0.05)
    train = [t for i, t in enumerate(texts) if not is_val(i, period)]
    val = [t for i, t in enumerate(texts) if is_val(i, period)]
    assert decode_docs(tok, arrays["train"], idx["eot_id"]) == train
    assert decode_docs(tok, arrays["val"], idx["eot_id"]) == val
    assert idx["splits"]["val"]["documents"] == len(val) >= 2
    assert idx["splits"]["train"]["tokens"] == len(arrays["train"])
    assert idx["tokenizer_hash"] == tokenizer_hash(tok)


def test_uint32_when_the_vocabulary_does_not_fit_16_bits(tmp_path):
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["</s>"] = 70_000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"w{i} w69999 w65536"}) + "\n" for i in range(4)))
    idx = prepare([str(tmp_path / "d.jsonl")], tmp_path / "out", tokenizer=str(tmp_path / "big.json"),
                  val_fraction=0.5, workers=1, **quiet())
    _, _, arrays = load_prepared(tmp_path / "out")
    assert idx["dtype"] == "uint32" and idx["eot_id"] == 70_000
    assert arrays["train"].tolist() == [0, 69999, 65536, 70000, 2, 69999, 65536, 70000]


@pytest.mark.slow
def test_output_does_not_depend_on_workers_or_units(tmp_path):
    root, _ = corpus(tmp_path)
    tok = small_bpe()
    tok.save(str(tmp_path / "tok.json"))
    prepare([str(root)], tmp_path / "w1", tokenizer=str(tmp_path / "tok.json"), workers=1, **quiet())  # 1 unit
    prepare([str(root)], tmp_path / "w2", tokenizer=str(tmp_path / "tok.json"), workers=2, unit_mb=1e-9,
            **quiet())  # one file per unit, two worker processes
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()


def test_rerun_of_a_finished_job_does_nothing(tmp_path):
    root, _ = corpus(tmp_path, n_files=1)
    args = ([str(root)], tmp_path / "out")
    prepare(*args, vocab_size=300, workers=1, **quiet())
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    logs = []
    prepare(*args, vocab_size=300, workers=1, progress=False, log=logs.append)
    assert "nothing to do" in logs[0]
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    with pytest.raises(UserError, match="already holds data prepared from other inputs"):
        prepare(*args, vocab_size=301, workers=1, **quiet())


def test_interrupted_job_finishes_only_missing_units(tmp_path, monkeypatch):
    root, _ = corpus(tmp_path)
    real, ran = prep.run_unit, []

    def interrupted(unit, settings):
        if unit["index"] == 2:
            raise KeyboardInterrupt
        return real(unit, settings)

    monkeypatch.setattr(prep, "run_unit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(root)], tmp_path / "out", vocab_size=300, workers=1, unit_mb=1e-9, **quiet())
    assert not (tmp_path / "out" / "index.json").exists()
    assert sorted(p.name for p in (tmp_path / "out" / ".work").glob("unit-*.json")) == ["unit-00000.json",
                                                                                      "unit-00001.json"]
    with pytest.raises(UserError, match="unfinished"):
        load_prepared(tmp_path / "out")

    monkeypatch.setattr(prep, "run_unit", lambda unit, settings: ran.append(unit["index"]) or real(unit, settings))
    logs = []
    prepare([str(root)], tmp_path / "out", vocab_size=300, workers=1, unit_mb=1e-9, progress=False, log=logs.append)
    assert ran == [2, 3, 4] and "resuming, 2 of 5 units" in logs[0]
    prepare([str(root)], tmp_path / "clean", vocab_size=300, workers=1, **quiet())  # uninterrupted, one unit
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


def test_bad_files_skipped_and_counted(tmp_path):
    root, texts = corpus(tmp_path, n_files=2)
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    (root / "empty.jsonl").write_bytes(b"")
    (root / "b.jsonl").write_bytes(b'{"text": "good line"}\n' + b'{"text": "\xff"}\n')  # undone whole
    tok = small_bpe()
    tok.save(str(tmp_path / "tok.json"))
    logs = []
    idx = prepare([str(root)], tmp_path / "out", tokenizer=str(tmp_path / "tok.json"), workers=1, progress=False,
                  log=logs.append)
    assert len(idx["skipped"]) == 3 and "3 bad file(s) skipped" in idx["source"] and "skipped 3" in logs[-1]
    _, tok, arrays = load_prepared(tmp_path / "out")
    got = decode_docs(tok, arrays["train"], idx["eot_id"]) + decode_docs(tok, arrays["val"], idx["eot_id"])
    assert sorted(got) == sorted(texts)


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("name,content,message", [
    ("d.jsonl", '{"text": "a"}\n{"text": "b"\n', "d.jsonl:2: not JSON"),
    ("d.jsonl", '{"text": "a"}\n{"txt": "b"}\n', "d.jsonl:2: no 'text' field"),
    ("d.txt", b"caf\xe9", "d.txt: not valid UTF-8"),
])
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(tmp_path, capsys, name, content, message):
    root, _ = corpus(tmp_path, n_files=1)
    (root / name).write_bytes(content.encode() if isinstance(content, str) else content)
    code, err = run_cli(capsys, "data", "prepare", str(root), "--out", str(tmp_path / "out"), "--vocab-size", "300",
                        "--workers", "1", "--fatal-bad-files", "--no-progress")
    assert code == 2 and message in err and len(err.splitlines()) == 1 and err.startswith("depthlab: error:")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bad_input_in_a_worker_process(tmp_path, capsys):
    root, _ = corpus(tmp_path, n_files=2)
    (root / "d.jsonl").write_text('{"text": "a"}\n{"text": }\n')
    small_bpe().save(str(tmp_path / "tok.json"))  # given, so no BPE training reads the files first
    code, err = run_cli(capsys, "data", "prepare", str(root), "--out", str(tmp_path / "out"), "--tokenizer",
                        str(tmp_path / "tok.json"), "--workers", "2", "--unit-mb", "1e-9", "--no-progress")
    assert code == 2 and "d.jsonl:2: not JSON" in err and not (tmp_path / "out").exists()


def config_for(path, **data) -> Config:
    cfg = Config(model=tiny_model_config(vocab_size=512, max_seq_len=32))
    cfg.data.paths, cfg.data.seq_len = [str(path)], 16
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def test_build_token_data_from_prepared_dir(tmp_path):
    root, _ = corpus(tmp_path)
    prepare([str(root)], tmp_path / "out", vocab_size=400, workers=1, **quiet())
    idx, tok, arrays = load_prepared(tmp_path / "out")
    data = build_token_data(config_for(tmp_path / "out"))
    assert isinstance(data.train, np.memmap) and np.array_equal(data.val, arrays["val"])
    assert data.tokenizer_hash == idx["tokenizer_hash"] and "\n" not in data.source
    tok.save(str(tmp_path / "same.json"))
    build_token_data(config_for(tmp_path / "out", tokenizer=str(tmp_path / "same.json")))  # the same: accepted

    small_bpe().save(str(tmp_path / "other.json"))
    with pytest.raises(UserError, match="was prepared with tokenizer .* not the requested"):
        build_token_data(config_for(tmp_path / "out", tokenizer=str(tmp_path / "other.json")))
    with pytest.raises(UserError, match="raise model.vocab_size to at least"):
        cfg = config_for(tmp_path / "out")
        cfg.model.vocab_size = 100
        build_token_data(cfg)


def test_shards_modified_after_prepare_are_refused(tmp_path):
    root, _ = corpus(tmp_path, n_files=1)
    prepare([str(root)], tmp_path / "out", vocab_size=300, workers=1, **quiet())
    small_bpe().save(str(tmp_path / "out" / "tokenizer.json"))
    with pytest.raises(UserError, match="not the tokenizer the shards were made with"):
        load_prepared(tmp_path / "out")


def test_raw_c4_file_on_the_fly(tmp_path):
    root, texts = corpus(tmp_path, n_files=2)
    data = build_token_data(config_for(root))
    eot = data.tokenizer.token_to_id("<|endoftext|>")
    assert sorted(decode_docs(data.tokenizer, data.train, eot) + decode_docs(data.tokenizer, data.val, eot)) \
        == sorted(texts)


def test_train_cli_on_prepared_data(tmp_path, capsys):
    root, _ = corpus(tmp_path)
    assert main(["data", "prepare", str(root), "--out", str(tmp_path / "out"), "--vocab-size", "300", "--workers",
                 "1", "--no-progress"]) == 0
    assert "validation" in capsys.readouterr().out
    code = main(["train", "--data", str(tmp_path / "out"), "--out", str(tmp_path / "runs"), "--max-steps", "2",
                 "--no-progress", "--set", "model.vocab_size=300", "--set", "model.dim=32", "--set",
                 "model.n_layers=2", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64", "--set",
                 "data.seq_len=16", "--set", "train.batch_size=2", "--set", "train.eval_every=2"])
    assert code == 0, capsys.readouterr().err
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / "tokenizer.json").read_bytes() == (tmp_path / "out" / "tokenizer.json").read_bytes()
    assert main(["data", "info", str(tmp_path / "out")]) == 0


def test_eval_tokens_from_prepared_or_raw(tmp_path):
    from depthlab.data.dataset import eval_tokens

    root, texts = corpus(tmp_path, n_files=1)
    prepare([str(root)], tmp_path / "out", vocab_size=300, workers=1, **quiet())
    _, tok, arrays = load_prepared(tmp_path / "out")
    tokens, source = eval_tokens([str(tmp_path / "out")], tok)
    assert np.array_equal(tokens, arrays["val"]) and "validation split" in source
    with pytest.raises(UserError, match="was prepared with tokenizer"):
        eval_tokens([str(tmp_path / "out")], small_bpe())
    raw, _ = eval_tokens([str(root)], tok)
    assert sorted(decode_docs(tok, raw, tok.token_to_id("<|endoftext|>"))) == sorted(texts)
    with pytest.raises(UserError, match="holds prepared token data"):
        eval_tokens([str(tmp_path)], tok)  # a folder holding raw text and a prepared dir


def test_t5_style_transformers_tokenizer_dir(tmp_path):
    """The paper's setup: a SentencePiece-style (Unigram, Metaspace) transformers tokenizer whose separator is </s>."""
    transformers = pytest.importorskip("transformers")
    from tokenizers.implementations import SentencePieceUnigramTokenizer

    root, texts = corpus(tmp_path, n_files=2)
    sp = SentencePieceUnigramTokenizer()
    sp.train_from_iterator(texts, vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                           show_progress=False)
    transformers.PreTrainedTokenizerFast(tokenizer_object=sp._tokenizer, eos_token="</s>", unk_token="<unk>",
                                         pad_token="<pad>").save_pretrained(str(tmp_path / "t5ish"))
    idx = prepare([str(root)], tmp_path / "out", tokenizer=str(tmp_path / "t5ish"), val_fraction=0.5, workers=1,
                  **quiet())
    _, tok, arrays = load_prepared(tmp_path / "out")
    assert idx["eot_id"] == 1
    period = val_period(0.5)
    expected = [tok.encode(t, add_special_tokens=False).ids + [1] for i, t in enumerate(texts) if is_val(i, period)]
    assert arrays["val"].tolist() == [i for ids in expected for i in ids]
    # decoding gives the text back modulo the tokenizer's normalisation (here: exact for plain words)
    assert tok.decode(expected[0][:-1]) == texts[1]


def test_hf_dataset_prepared(tmp_path):
    datasets = pytest.importorskip("datasets")
    _, texts = corpus(tmp_path, n_files=2)
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    idx = prepare([f"hf:{tmp_path / 'ds'}"], tmp_path / "out", vocab_size=300, workers=1, **quiet())
    _, tok, arrays = load_prepared(tmp_path / "out")
    period = val_period(0.05)
    assert decode_docs(tok, arrays["val"], idx["eot_id"]) == [t for i, t in enumerate(texts) if is_val(i, period)]


@pytest.mark.slow
def test_a_killed_worker_fails_the_job_but_keeps_the_work(tmp_path):
    import multiprocessing
    import os
    import signal
    import threading
    import time

    root = tmp_path / "raw"
    root.mkdir()
    rng = np.random.default_rng(0)
    for f in range(40):
        (root / f"{f:02d}.txt").write_text(" ".join(rng.choice(WORDS, 8000)))
    small_bpe().save(str(tmp_path / "tok.json"))
    errors = []

    def job():
        try:
            prepare([str(root)], tmp_path / "out", tokenizer=str(tmp_path / "tok.json"), workers=2, unit_mb=1e-9,
                    **quiet())
        except UserError as e:
            errors.append(e)

    thread = threading.Thread(target=job)
    thread.start()
    while thread.is_alive() and not list((tmp_path / "out" / ".work").glob("unit-*.json")):
        time.sleep(0.01)  # until the workers are busy
    os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)  # as the out-of-memory killer would
    thread.join(60)
    assert not thread.is_alive() and errors and isinstance(errors[0], prep.WorkerDied) and "rerun" in str(errors[0])
    assert (tmp_path / "out" / ".work" / "plan.json").is_file()  # kept for the resume
    idx = prepare([str(root)], tmp_path / "out", tokenizer=str(tmp_path / "tok.json"), workers=1, unit_mb=1e-9,
                  **quiet())
    assert idx["files_read"] == 40


def test_eot_text_inside_a_document_does_not_shift_the_split(tmp_path):
    texts = [f"doc {i}" + (" says <|endoftext|> inside" if i == 3 else "") for i in range(6)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = small_bpe()
    tok.save(str(tmp_path / "tok.json"))
    idx = prepare([str(tmp_path / "d.jsonl")], tmp_path / "out", tokenizer=str(tmp_path / "tok.json"),
                  val_fraction=0.5, workers=1, **quiet())
    _, _, arrays = load_prepared(tmp_path / "out")
    eot = idx["eot_id"]
    val = [tok.encode(t, add_special_tokens=False).ids + [eot] for t in texts[1::2]]  # documents 1, 3, 5
    assert arrays["val"].tolist() == [i for ids in val for i in ids]
    assert idx["splits"]["val"]["documents"] == 3 and idx["splits"]["train"]["documents"] == 3


SHAKESPEARE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "shakespeare"


@pytest.mark.skipif(not SHAKESPEARE.is_dir(), reason="../shared/data/shakespeare not present")
def test_round_trip_on_real_english(tmp_path):
    files = sorted(SHAKESPEARE.glob("*.txt"))[:3]
    idx = prepare([str(f) for f in files], tmp_path / "out", vocab_size=800, val_fraction=0.5, workers=1,
                  held_out="alternate", **quiet())  # whole documents held out: the text comes back exactly
    _, tok, arrays = load_prepared(tmp_path / "out")
    texts = [f.read_text(encoding="utf-8") for f in files]
    assert decode_docs(tok, arrays["train"], idx["eot_id"]) == [texts[0], texts[2]]
    assert decode_docs(tok, arrays["val"], idx["eot_id"]) == [texts[1]]
    assert 2 < sum(map(len, texts)) / sum(s["tokens"] for s in idx["splits"].values()) < 6  # chars per token


def test_an_oversized_document_is_cut_at_line_breaks_the_same_way_on_both_paths(tmp_path, monkeypatch):
    """A document over the limit would be one unsplittable item of the held-out rule (all of validation, or
    none of it): it is cut at line breaks, by `data prepare` and on the fly alike."""
    monkeypatch.setattr(prep, "MAX_DOCUMENT_BYTES", 1500)
    lines = [f"line {i}: " + " ".join(WORDS[i % len(WORDS):] + WORDS[:i % len(WORDS)]) + "\n" for i in range(400)]
    (tmp_path / "big.txt").write_text("".join(lines))
    pieces = prep.bounded(prep.Document("big.txt", "".join(lines)))
    assert len(pieces) > 20 and all(len(p.text) <= 1500 for p in pieces) and "".join(p.text for p in pieces) == \
        "".join(lines)
    idx = prepare([str(tmp_path / "big.txt")], tmp_path / "out", vocab_size=300, workers=1, **quiet())
    assert idx["splits"]["train"]["documents"] + idx["splits"]["val"]["documents"] == len(pieces)
    _, tok, arrays = load_prepared(tmp_path / "out")
    cfg = config_for(tmp_path / "big.txt", tokenizer=str(tmp_path / "out" / "tokenizer.json"))
    data = build_token_data(cfg)
    assert np.array_equal(data.train, arrays["train"]) and np.array_equal(data.val, arrays["val"])


# ---------------------------------------------------------------- the held-out rule (issue 50)
CODEC_TABLE = "decoding_map = {\n" + "".join(f"    0x{i:04x}: 0x{i + 0x400:04x},  # LETTER {i}\n"
                                              for i in range(400)) + "}\n"


def rule_corpus(tmp_path, n=900):
    """A JSONL corpus of n short documents, a generated codec table at document 10 and a giant document at 31:
    both held out whole by the alternate rule's positions or the balanced rule's (table at 10, giant at eligible 30)."""
    rng = np.random.default_rng(1)
    texts = ["\n".join(" ".join(rng.choice(WORDS, 12)) for _ in range(rng.integers(20, 40))) for _ in range(n)]
    texts[10] = CODEC_TABLE
    texts[31] = "\n".join(f"giant line {i} " + " ".join(rng.choice(WORDS, 12)) for i in range(3000))
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, texts


def test_balanced_keeps_the_table_out_and_no_document_fills_validation(tmp_path):
    path, texts = rule_corpus(tmp_path)
    index = prepare([str(path)], tmp_path / "out", vocab_size=400, workers=1, check=True, **quiet())
    idx, tok, arrays = load_prepared(tmp_path / "out")
    comp = idx["splits"]["val"]["composition"]
    assert idx["held_out"] == "balanced" and idx["generated"] == 1 and index == idx
    assert comp["effective"] >= 30 and comp["max_share"] <= 0.10 and comp["documents"] == 45
    val_text = "".join(decode_docs(tok, arrays["val"], idx["eot_id"]))
    assert "decoding_map" not in val_text and "giant line 0 " in val_text and "giant line 2999 " in val_text
    assert val_text.count("giant line") <= 4 * 2000 // 60  # at most 4 chunks of 2,000 characters of it
    train_text = "".join(decode_docs(tok, arrays["train"], idx["eot_id"]))
    assert "decoding_map" in train_text and "giant line" not in train_text  # the table trained on, the giant not
    # the alternate rule: every 20th document whole, the old split (the table and the giant fill validation)
    prepare([str(path)], tmp_path / "alt", vocab_size=400, workers=1, held_out="alternate", **quiet())
    idx, tok, arrays = load_prepared(tmp_path / "alt")
    period = val_period(0.05)
    assert decode_docs(tok, arrays["val"], idx["eot_id"]) == [t for i, t in enumerate(texts) if is_val(i, period)]
    assert idx["held_out"] == "alternate" and "generated" not in idx
    assert idx["splits"]["val"]["composition"]["max_share"] > 0.10


@pytest.mark.slow
def test_the_same_split_whatever_the_units_and_workers(tmp_path):
    path, texts = rule_corpus(tmp_path, 300)
    parts = [tmp_path / f"p{k}.jsonl" for k in range(3)]
    for k, part in enumerate(parts):
        part.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[k * 100:(k + 1) * 100]))
    one = prepare([str(p) for p in parts], tmp_path / "one", vocab_size=400, workers=1, **quiet())
    many = prepare([str(p) for p in parts], tmp_path / "many", vocab_size=400, workers=2, unit_mb=1e-9, **quiet())
    assert one["splits"] == many["splits"] and one["splits"]["val"]["composition"]["documents"] == 15


def test_refused_when_asked_for_by_name_warned_otherwise(tmp_path, capsys):
    path, _ = rule_corpus(tmp_path, 100)
    with pytest.raises(UserError, match=r"effective documents \(Kish\), fewer than 30: give more documents"):
        prepare([str(path)], tmp_path / "strict", vocab_size=400, workers=1, check=True, **quiet())
    assert not (tmp_path / "strict").exists()  # nothing half-written
    assert main(["data", "prepare", str(path), "--out", str(tmp_path / "out"), "--vocab-size", "400",
                 "--workers", "1", "--no-progress"]) in (0, None)
    err = capsys.readouterr().err
    assert "warning: a validation split of fewer than 30 effective documents" in err
    assert main(["data", "prepare", str(path), "--out", str(tmp_path / "out"), "--vocab-size", "400",
                 "--workers", "1", "--no-progress", "--held-out", "alternate"]) == 2  # other settings


def test_data_prepared_before_the_rule_still_loads_and_reruns(tmp_path):
    """An index written before issue 50 has no held_out key and its request none: it loads, trains, and a rerun
    with --held-out alternate (the rule it was made by) finds it done."""
    root, _ = corpus(tmp_path)
    prepare([str(root)], tmp_path / "out", vocab_size=400, workers=1, held_out="alternate", **quiet())
    index_path = tmp_path / "out" / "index.json"
    index = json.loads(index_path.read_text())
    assert "held_out" not in index["request"]
    del index["held_out"]
    index_path.write_text(json.dumps(index))
    idx, _, arrays = load_prepared(tmp_path / "out")
    assert "held_out" not in idx and len(arrays["val"])
    notes = []
    again = prepare([str(root)], tmp_path / "out", vocab_size=400, workers=1, held_out="alternate",
                    progress=False, log=notes.append)
    assert again == idx and "nothing to do" in notes[0]
