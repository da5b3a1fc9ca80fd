"""Exact and near-duplicate removal on planted copies (depthlab.data.dedup)."""

import random

import pytest

from depthlab.data.dedup import _minhash, _words, dedup
from depthlab.data.sources import Document


def _text(seed: int, words: int = 400) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(words))


def test_planted_exact_and_near_copies_are_removed_and_reported():
    originals = [Document(f"doc{i}.py", _text(i)) for i in range(20)]
    exact = Document("copy_of_doc3.py", "  " + originals[3].text.replace(" ", "\n"))  # whitespace differs only
    words = originals[7].text.split()
    words[100], words[250] = "edited", "changed"  # two words of 400 changed: a near copy
    near = Document("near_doc7.py", " ".join(words))
    docs = originals[:10] + [exact] + originals[10:] + [near]
    kept, report = dedup(docs)
    assert [d.name for d in kept] == [d.name for d in originals]  # the first of each group stays, in order
    assert report.exact == [("copy_of_doc3.py", "doc3.py")]
    assert [(a, b) for a, b, _ in report.near] == [("near_doc7.py", "doc7.py")] and report.near[0][2] > 0.9
    assert report.summary()["removed"] == 2 and report.kept == 20


def test_distinct_documents_are_all_kept():
    docs = [Document(f"d{i}", _text(100 + i)) for i in range(30)]
    kept, report = dedup(docs)
    assert len(kept) == 30 and report.removed == 0


def _edited(seed: int, edits: int, words: int = 400) -> str:
    """_text(seed) with `edits` words replaced at seeded places: each edit changes up to 5 of its 5-grams."""
    rng, out = random.Random(1000 * seed + edits), _text(seed, words).split()
    for k in rng.sample(range(words), edits):
        out[k] = f"edit{k}"
    return " ".join(out)


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.95])
@pytest.mark.slow
def test_a_document_is_removed_exactly_when_its_estimated_similarity_reaches_the_threshold(threshold):
    """Documents at every similarity to a few originals: no removed one is below the threshold against the kept
    document it is reported to copy, and no two kept ones are at or above it. LSH's candidates used to be taken
    unchecked (documents at 0.656 removed at 0.8) and its misses kept (pairs above the threshold kept)."""
    docs = [Document(f"s{s}e{e}", _edited(s, e)) for s in range(6) for e in [0, *range(1, 40, 2)]]
    random.Random(0).shuffle(docs)
    kept, report = dedup(docs, threshold)
    sig = {d.name: _minhash(_words(d.text)) for d in docs}
    for removed, original, *reported in report.near:
        similarity = sig[removed].jaccard(sig[original])
        assert similarity >= threshold, (removed, original, similarity)
        assert reported == [similarity] and original in {d.name for d in kept}
    for i, a in enumerate(kept):
        assert all(sig[a.name].jaccard(sig[b.name]) < threshold for b in kept[:i]), a.name
    assert report.kept + report.removed == len(docs) and report.near  # some of them are near copies


def test_threshold_one_removes_only_equal_signatures_and_zero_is_refused():
    period = " ".join(_text(5, 6).split())  # a text that repeats: its copies longer by a period have its 5-grams
    docs = [Document("a", " ".join([period] * 30)), Document("b", _edited(5, 3, 180)),
            Document("c", " ".join([period] * 31))]
    kept, report = dedup(docs, 1.0)
    assert [d.name for d in kept] == ["a", "b"] and report.near == [("c", "a", 1.0)]
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="threshold must be above 0 and at most 1"):
            dedup(docs, bad)


def test_depthlab_data_dedup_writes_the_kept_documents_for_prepare(tmp_path, capsys):
    import json

    from depthlab.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"d{i}.txt").write_text(_text(i))
    (docs / "d9.txt").write_text(_text(2))
    for _ in range(2):  # a second run replaces its own earlier file
        assert main(["data", "dedup", str(docs), "--out", str(tmp_path / "kept.jsonl")]) == 0
        kept = [json.loads(x) for x in (tmp_path / "kept.jsonl").read_text().splitlines()]
        assert len(kept) == 6 and "removed 1 exact and 0 near copies" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "kept.jsonl"]  # no temporary file or lock left


@pytest.mark.parametrize("inp, out, extra, msg", [
    ("docs", "docs/kept.jsonl", [], "is inside data dedup's own input"),
    ("docs/d0.txt", "docs/d0.txt", ["--overwrite"], "is data dedup's own input"),
    ("docs", "notes.jsonl", [], "exists and is not data dedup output; choose another path, or pass --overwrite"),
    ("docs", "docs", [], "is data dedup's own input"),
])
def test_depthlab_data_dedup_never_writes_over_its_input_or_a_file_it_did_not_write(tmp_path, capsys, inp, out,
                                                                                     extra, msg):
    """`data dedup X.jsonl --out X.jsonl` used to truncate its input to the kept documents; a kept file inside the
    input folder would be read as more documents by the next `prepare` of that folder."""
    from depthlab.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"d{i}.txt").write_text(_text(i))
    (tmp_path / "notes.jsonl").write_text('{"mine": 1}\n')
    before = {p: p.read_bytes() for p in [*docs.iterdir(), tmp_path / "notes.jsonl"]}
    assert main(["data", "dedup", str(tmp_path / inp), "--out", str(tmp_path / out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err
    assert {p: p.read_bytes() for p in [*docs.iterdir(), tmp_path / "notes.jsonl"]} == before
    assert main(["data", "dedup", str(docs), "--out", str(tmp_path / "notes.jsonl"), "--overwrite"]) == 0
    assert len((tmp_path / "notes.jsonl").read_text().splitlines()) == 3
