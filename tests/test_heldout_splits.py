"""Held-out splits a reader can trust (issue 50): generated files never held out, a giant document cut to a few
chunks of its one split, every split with Kish's effective number of documents >= 30 and no document over 10%, the
make-up written beside the corpus, and per-document losses in every record of a study trained on it."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from depthlab import UserError
from depthlab.data.dataset import (
    HELD_CHUNK_BYTES,
    HELD_CHUNKS,
    MAX_SHARE,
    MIN_EFFECTIVE,
    composition,
    data_line_share,
    generated,
    held_out_split,
    whole,
)
from depthlab.data.sources import Document

CODEC = "decoding_map = {\n" + "".join(f"    0x{i:04x}: 0x{i + 0x400:04x},  # CYRILLIC LETTER {i}\n"
                                          for i in range(200)) + "}\n"
CODE = "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n"


def _docs(n: int, seed: int = 0) -> list[Document]:
    rng, words = random.Random(seed), [f"w{i}" for i in range(300)]
    return [Document(f"doc{i:03d}.txt", "\n".join(" ".join(rng.choice(words) for _ in range(10))
                                                  for _ in range(rng.randint(10, 30)))) for i in range(n)]


def test_the_generated_file_rule_reads_data_lines():
    assert data_line_share(CODEC) > 0.99 and generated(Document("cp855.py", CODEC))
    assert data_line_share(CODE) == 0 and not generated(Document("f.py", CODE))
    table = "\n".join(f"    '\\x{i:02x}'     #  0x{i:02X} -> LETTER" for i in range(50))
    assert data_line_share(table + "\n" + CODE * 3) > 0.5  # a codec table of the iso8859 kind
    assert data_line_share("# only comments\n\n") == 0


def test_a_giant_document_and_a_generated_table_dominate_no_held_out_split():
    docs = _docs(200)
    docs[1] = Document("giant.txt", docs[1].text * 400)  # position 1: held out first at val_fraction 0.5
    docs.insert(3, Document("encodings/cp855.py", CODEC))  # would be the next held-out document
    train, held, skipped = held_out_split(docs, 0.5)
    assert skipped == ["encodings/cp855.py"] and "encodings/cp855.py" in {d.name for d in train}
    names = {s: [n for n, _ in part] for s, part in held.items()}
    assert "giant.txt" in names["val"] and "giant.txt" not in {d.name for d in train}
    assert not set(names["val"]) & set(names["test"]) and not set(names["val"]) & {d.name for d in train}
    giant = dict(held["val"])["giant.txt"]
    assert 1 <= len(giant) <= HELD_CHUNKS and all(len(c) <= HELD_CHUNK_BYTES for c in giant)
    assert giant[0] == docs[1].text[:len(giant[0])]  # its first chunk at least
    for s, part in held.items():
        comp = composition([n for n, _ in part], [sum(map(len, cs)) for _, cs in part])
        assert comp["effective"] >= MIN_EFFECTIVE and comp["max_share"] <= MAX_SHARE, (s, comp)


def test_pieces_of_one_document_are_held_out_together():
    pieces = [Document("big.txt#0", "a\n"), Document("big.txt#1", "b\n"), Document("x.txt", "c\n")]
    assert [(d.name, d.text) for d in whole(pieces)] == [("big.txt", "a\nb\n"), ("x.txt", "c\n")]


def test_composition_counts_kish_effective_documents():
    c = composition(["a", "b", "c", "d"], [10, 10, 10, 10])
    assert c["effective"] == 4 and c["max_share"] == 0.25 and c["tokens"] == 40
    c = composition(["big", "s1", "s2"], [80, 10, 10])
    assert math.isclose(c["effective"], round(100 ** 2 / (80 ** 2 + 200), 1)) and c["top"][0] == ["big", 0.8]


def _cfg(src: Path, val_fraction: float):
    from depthlab.config import apply_overrides
    from depthlab.model.families import preset

    return apply_overrides(preset("cpu-tiny"), ["model.vocab_size=300", f"data.paths=[{src}]",
                                                f"data.val_fraction={val_fraction}"])


def _write(src: Path, docs: list[Document]) -> None:
    src.mkdir()
    for d in docs:
        (src / d.name.replace("/", "_")).write_text(d.text)


def test_the_study_corpus_writes_each_split_make_up_and_refuses_one_it_cannot_trust(tmp_path):
    from depthlab.study.corpus import build_corpus

    docs = _docs(160)
    docs[1] = Document("doc001_giant.txt", docs[1].text * 300)
    _write(tmp_path / "docs", [*docs, Document("encodings/cp855.py", CODEC)])
    info = build_corpus(_cfg(tmp_path / "docs", 0.5), tmp_path / "corpus")
    assert info["held_out"] == "balanced" and [Path(n).name for n in info["generated"]] == ["encodings_cp855.py"]
    for s in ("val", "test"):
        comp = info["splits"][s]
        assert comp["effective"] >= MIN_EFFECTIVE and comp["max_share"] <= MAX_SHARE
        assert len(comp["names"]) == len(comp["doc_tokens"]) == comp["documents"]
        assert sum(comp["doc_tokens"]) == info[f"{s}_tokens"] == len(np.load(tmp_path / "corpus" / f"{s}.npy"))
        assert "encodings_cp855.py" not in {Path(n).name for n in comp["names"]}
    assert "doc001_giant.txt" in {Path(n).name for n in info["splits"]["val"]["names"]}
    _write(tmp_path / "few", _docs(40))
    with pytest.raises(UserError, match=r"^the val split has [\d.]+ effective documents \(Kish\), fewer than 30"):
        build_corpus(_cfg(tmp_path / "few", 0.5), tmp_path / "few_corpus")
    assert not (tmp_path / "few_corpus").exists()


def test_document_losses_average_to_the_evaluated_loss():
    import torch

    from depthlab.config import apply_overrides
    from depthlab.eval.perplexity import evaluate
    from depthlab.model.families import preset
    from depthlab.model.transformer import build_model
    from depthlab.study.corpus import document_losses

    cfg = apply_overrides(preset("cpu-tiny"), ["model.dim=32", "model.n_heads=2", "model.ffn_dim=64",
                                               "model.vocab_size=97", "model.n_layers=2"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    tokens = np.random.default_rng(0).integers(0, 97, 1000).astype(np.uint16)
    sizes = [300, 5, 95, 400, 200]  # the last document's tail lies past the last whole window
    got = document_losses(model, tokens, sizes, 16, 4, torch.device("cpu"))
    ref = evaluate(model, tokens, 16, 4, torch.device("cpu"))
    assert sum(got["tokens"]) == ref["val_tokens"] == (999 // 16) * 16
    mean = sum(loss * n for loss, n in zip(got["loss"], got["tokens"], strict=True)) / sum(got["tokens"])
    assert math.isclose(mean, ref["val_loss"], rel_tol=1e-6)
    assert got["tokens"][:2] == [299, 5]  # a stream's first token is no target


@pytest.mark.slow
def test_a_study_on_a_balanced_corpus_records_per_document_losses(tmp_path):
    from depthlab.study.corpus import build_corpus
    from depthlab.study.records import load_records
    from depthlab.study.runner import Study, run_cells, seed_cells
    from tests.test_study import TINY

    _write(tmp_path / "docs", _docs(160))
    study = Study("c", str(tmp_path / "out"), {"pre": ["model.norm_scheme=pre"]},
                  base=[*TINY, f"data.paths=[{tmp_path / 'docs'}]", "data.val_fraction=0.5"],
                  corpus=str(tmp_path / "corpus"))
    info = build_corpus(study.config(seed_cells(study, {"pre": 1e-2}, [0], 2)[0]), tmp_path / "corpus")
    run_cells(study, seed_cells(study, {"pre": 1e-2}, [0], layers=2), log=lambda m: None)
    r = next(iter(load_records(study.runs_file).values()))
    for s, endpoint in (("val", r["val_loss"]), ("test", r["test_loss"])):
        losses, scored = r["doc_losses"][s], r["doc_scored"][s]
        assert len(losses) == len(scored) == info["splits"][s]["documents"]
        mean = sum(x * n for x, n in zip(losses, scored, strict=True) if n) / sum(scored)
        assert math.isclose(mean, endpoint, rel_tol=1e-4), s
    json.dumps(r)  # the record stays plain JSON


def test_the_own_rate_plan_walks_grids_then_seeds_then_the_deep_stage():
    from depthlab.study import own_rate as o, transfer as t
    from depthlab.study.records import cell_key

    d = o.Design()
    records: dict = {}

    def finish(cells, loss=lambda c: abs(t.lattice(c.lr) - o.CENTRES[(c.variant, c.layers)]) + c.seed * 1e-3):
        for c in cells:
            records[cell_key(c.variant, c.lr, c.seed, c.layers)] = {"status": "ok", "val_loss": loss(c), "lr": c.lr}

    first = o.next_cells(records, d)[:12]  # the grids at 12 and 24 first (the deep grids are known, and wait)
    assert {c.layers for c in first} == {12, 24} and {c.seed for c in first} == {0}
    finish(first)
    seeds = o.next_cells(records, d)[:12]  # then the seeds at their best rates, seed by seed
    assert [c.seed for c in seeds] == [1] * 4 + [2] * 4 + [3] * 4 and {c.layers for c in seeds} == {12, 24}
    while cells := o.next_cells(records, d):
        finish(cells)
    c = o.counts(records, d)
    assert c["missing"] == 0 and c["waiting_at_least"] == 0 and c["done"] == len(records)
    for (v, L), k in o.CENTRES.items():
        assert o.best(records, d, v, L) == t.rate(k)
    assert c["done"] == 8 * 3 + 8 * 3  # 8 grids of three rates; seeds 1-3 at each of the 8 best rates
    plan = o.plan(d)
    assert plan["margins"]["equivalence_nats"] == 0.01 and plan["margins"]["holds_its_rate_slope"]["12-48"] == 0.25
    assert plan["families"]["primary"]["tests"] == ["lns - pre at N = 12", "lns - pre at N = 24",
                                                    "lns - pre at N = 48"]


def test_data_prepare_writes_and_prints_the_validation_make_up(tmp_path, capsys):
    from depthlab.data.cli import print_info
    from depthlab.data.prepare import prepare
    from depthlab.data.prepared import load_prepared

    docs = _docs(60)
    docs[10] = Document("doc010.txt", docs[10].text * 40)  # position 10: held out (every 20th, from the 10th)
    _write(tmp_path / "docs", docs)
    idx = prepare([str(tmp_path / "docs")], tmp_path / "out", vocab_size=300, workers=1, progress=False,
                  log=lambda m: None)
    comp, val = idx["splits"]["val"]["composition"], idx["splits"]["val"]
    assert comp["documents"] == val["documents"] == 3 and comp["tokens"] == val["tokens"]
    _, tok, arrays = load_prepared(tmp_path / "out")
    sizes = np.diff(np.r_[0, np.flatnonzero(arrays["val"] == idx["eot_id"]) + 1])
    assert comp["effective"] == round(sizes.sum() ** 2 / (sizes ** 2).sum(), 1) < 3
    assert Path(comp["top"][0][0]).name == "doc010.txt" and comp["top"][0][1] == comp["max_share"] > 0.5
    print_info(tmp_path / "out", idx)
    out, err = capsys.readouterr()
    assert "validation make-up: 3 documents" in out and "doc010.txt" in out
    assert err.startswith("warning: a validation split of fewer than 30 effective documents")
