"""Exact and near-duplicate removal on planted copies (depthlab.data.dedup)."""

import random

from depthlab.data.dedup import dedup
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
    assert report.exact == [("copy_of_doc3.py", "doc3.py")] and report.near == [("near_doc7.py", "doc7.py")]
    assert report.summary()["removed"] == 2 and report.kept == 20


def test_distinct_documents_are_all_kept():
    docs = [Document(f"d{i}", _text(100 + i)) for i in range(30)]
    kept, report = dedup(docs)
    assert len(kept) == 30 and report.removed == 0


def test_depthlab_data_dedup_writes_the_kept_documents_for_prepare(tmp_path, capsys):
    import json

    from depthlab.cli import main

    for i in range(6):
        (tmp_path / f"d{i}.txt").write_text(_text(i))
    (tmp_path / "d9.txt").write_text(_text(2))
    main(["data", "dedup", str(tmp_path), "--out", str(tmp_path / "kept.jsonl")])
    kept = [json.loads(x) for x in (tmp_path / "kept.jsonl").read_text().splitlines()]
    assert len(kept) == 6 and "removed 1 exact and 0 near copies" in capsys.readouterr().out
