"""Sources (text, C4-style JSON lines, JSON arrays, parquet, hf:) and tokenizers (tokenizer.json, transformers dirs)."""

import gzip
import json
import sys
from pathlib import Path

import pytest

from depthlab import UserError
from depthlab.data.sources import BadFile, expand, file_documents, read_documents
from depthlab.data.tokenizer import eot_id, load_tokenizer, tokenizer_hash, train_bpe

C4_TEXTS = [
    "Beginners BBQ Class Taking Place in Missoula!\nDo you want to get better at making delicious BBQ?",
    "Discussion in 'Mac OS X Lion (10.7)' started by axboi87, Jan 20, 2012.\nI've got a 500gb internal drive.",
    "Foil plaid lycra and spandex shortall with metallic slinky insets. Attached metallic elastic belt.",
    "Unicode survives: naïve café, 東京, emoji 🚀, and a tab\there.",
]


def write_c4(path, texts=C4_TEXTS):
    """A file in C4's shipping format: gzipped JSON lines with text, timestamp and url."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t, "timestamp": f"2019-04-25T12:57:{i:02d}Z",
                                "url": f"https://example.com/{i}"}) + "\n")
    return path


def small_bpe(texts=C4_TEXTS * 3, vocab=300):
    return train_bpe(texts, vocab)


def test_c4_json_gz_lines(tmp_path):
    docs = list(file_documents(str(write_c4(tmp_path / "c4-train.00000-of-01024.json.gz"))))
    assert [d.text for d in docs] == C4_TEXTS
    assert docs[1].name.endswith(":2")  # named by line number


def test_json_array_and_custom_field(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"content": "one"}, {"content": ""}, {"content": "two"}]))
    assert [d.text for d in file_documents(str(tmp_path / "a.json"), text_field="content")] == ["one", "two"]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": C4_TEXTS, "url": ["u"] * 4}), tmp_path / "d.parquet", row_group_size=2)
    assert [d.text for d in file_documents(str(tmp_path / "d.parquet"))] == C4_TEXTS
    with pytest.raises(UserError, match="no 'body' column"):
        list(file_documents(str(tmp_path / "d.parquet"), text_field="body"))


def test_folder_walk_skips_hidden_and_unknown(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("b")
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "x.bin").write_bytes(b"\x00")
    (tmp_path / ".hidden.txt").write_text("h")
    write_c4(tmp_path / "c.json.gz")
    assert [p.rsplit("/", 1)[1] for p in expand([str(tmp_path)])] == ["a.txt", "c.json.gz", "b.md"]
    with pytest.raises(UserError, match="no files match"):
        expand([str(tmp_path / "*.nothing")])


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "fine"}\n\n{"text": "also fine"}\n{"text": oops}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:4: not JSON"):
        list(file_documents(str(p)))


def test_missing_text_field_names_line_and_keys(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n{"body": "x", "url": "u"}\n')
    with pytest.raises(UserError, match=r"d.jsonl:2: no 'text' field \(found: body, url\)"):
        list(file_documents(str(p)))


@pytest.mark.parametrize("name,content,reason", [
    ("empty.txt", b"", "empty file"),
    ("blank.txt", b"  \n\n", "empty file"),
    ("bin.txt", b"abc\x00\x01\x02", "binary"),
    ("latin1.txt", "café".encode("latin-1"), "not valid UTF-8"),
    ("latin1.jsonl", b'{"text": "ok"}\n' + '{"text": "café"}'.encode("latin-1"), "line 2"),
    ("empty.jsonl", b"\n\n", "empty file"),
    ("broken.json.gz", gzip.compress(b'{"text": "x"}\n' * 100)[:-30], "corrupt gzip"),
])
def test_bad_files_skipped_or_fatal(tmp_path, name, content, reason):
    (tmp_path / name).write_bytes(content)
    (tmp_path / "good.txt").write_text("good text")
    with pytest.raises(BadFile, match=reason):
        list(file_documents(str(tmp_path / name)))
    docs, report = read_documents([str(tmp_path / name), str(tmp_path / "good.txt")])
    assert [d.text for d in docs] == ["good text"]  # a bad file is dropped whole, even after good lines
    assert report.files == 1 and len(report.skipped) == 1 and reason in report.skipped[0][1]
    with pytest.raises(UserError, match=reason):
        read_documents([str(tmp_path / name), str(tmp_path / "good.txt")], fatal_bad_files=True)


def test_only_bad_files_is_an_error(tmp_path):
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(UserError, match="no usable text.*skipped 1"):
        read_documents([str(tmp_path / "e.txt")])


def test_too_much_raw_text_points_to_prepare(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 1000)
    with pytest.raises(UserError, match="depthlab data prepare"):
        read_documents([str(tmp_path / "a.txt")], max_bytes=500)


def test_hf_dataset_from_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": C4_TEXTS, "url": ["u"] * 4}).save_to_disk(str(tmp_path / "ds"))
    spec = f"hf:{tmp_path / 'ds'}"
    assert [d.text for d in file_documents(spec)] == C4_TEXTS
    halves = [[d.text for d in file_documents(spec, shard=(i, 2))] for i in range(2)]
    assert halves == [C4_TEXTS[:2], C4_TEXTS[2:]]
    with pytest.raises(UserError, match="no 'body' column"):
        list(file_documents(spec, text_field="body"))


def test_hf_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(UserError, match="need the `datasets` package"):
        list(file_documents("hf:allenai/c4:en"))


def test_tokenizer_hash_is_by_content(tmp_path):
    tok = small_bpe()
    tok.save(str(tmp_path / "t.json"))
    again = load_tokenizer(tmp_path / "t.json")
    (tmp_path / "pretty.json").write_text(json.dumps(json.loads(tok.to_str()), indent=4))
    assert tokenizer_hash(tok) == tokenizer_hash(again) == tokenizer_hash(load_tokenizer(tmp_path / "pretty.json"))
    assert tokenizer_hash(tok) != tokenizer_hash(small_bpe(vocab=280))


def test_transformers_tokenizer_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = small_bpe()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(str(tmp_path / "hf_tok"))
    loaded = load_tokenizer(tmp_path / "hf_tok")  # through the directory's tokenizer.json
    text = C4_TEXTS[3]
    assert loaded.encode(text).ids == tok.encode(text).ids == fast(text)["input_ids"]
    assert eot_id(loaded) == tok.token_to_id("<|endoftext|>")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(UserError, match="cannot load tokenizer directory"):
        load_tokenizer(tmp_path / "empty_dir")
    with pytest.raises(UserError, match="no such file"):
        load_tokenizer(tmp_path / "nope")


def test_corrupt_parquet_is_a_bad_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": C4_TEXTS * 50}), tmp_path / "d.parquet", row_group_size=50)
    raw = bytearray((tmp_path / "d.parquet").read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 64] = b"\xff" * 64  # damage a row group, keep the footer
    (tmp_path / "d.parquet").write_bytes(bytes(raw))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    for name in ("d.parquet", "junk.parquet"):
        with pytest.raises(BadFile, match="parquet"):
            list(file_documents(str(tmp_path / name)))


def test_builtin_corpus_grows_past_the_standard_library_as_a_prefix():
    """The built-in corpus is the standard library, then the installed packages' sources; a smaller corpus is a
    prefix of a larger one, so a study's small and large corpora share their first documents."""
    import sysconfig

    from depthlab.data.sources import builtin_files, builtin_roots

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    small, large = builtin_files(1.0), builtin_files(16.0)
    assert large[:len(small)] == small and all(f.is_relative_to(stdlib) for f in small)
    assert sum(f.stat().st_size for f in large) >= 16e6
    assert not any(f.is_relative_to(stdlib) for f in large[-3:])  # past the standard library's ~12 MB
    roots = builtin_roots()
    assert not any({"test", "tests"} & set(f.relative_to(next(r for r in roots if f.is_relative_to(r))).parts)
                   for f in large)
