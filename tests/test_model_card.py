"""The model card of an export (issue 51 item 4): `depthlab export` writes README.md, which huggingface_hub's
ModelCard parses, with the scheme, the data, the steps and tokens and the checkpoint's validation; `depthlab eval
KIND ... --card EXPORT_DIR` adds the numbers it printed in the Hub's eval-results format; exporting again keeps them
only for the same weights. Real runs, real exports, real files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from depthlab.cli import main
from depthlab.loading import load_checkpoint

pytestmark = pytest.mark.slow  # trains, exports and evaluates tiny runs end to end
hub = pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

TINY = [f"--set={k}={v}" for k, v in {"model.dim": 32, "model.n_layers": 3, "model.n_heads": 2, "model.ffn_dim": 64,
                                       "model.vocab_size": 300, "model.max_seq_len": 64, "data.seq_len": 32,
                                       "train.batch_size": 4, "train.eval_every": 2, "train.log_every": 1,
                                       "train.warmup_steps": 1, "train.monitor_every": 0}.items()]


@pytest.fixture(scope="module")
def world(tmp_path_factory, corpus):
    """A tiny LNS run (4 steps, validated at the last), its export, and a multiple-choice task file."""
    root = tmp_path_factory.mktemp("card")
    assert main(["train", "--scheme", "lns", "--data", str(corpus), "--run-dir", str(root / "run"), "--max-steps",
                 "4", "--no-progress", *TINY]) == 0
    assert main(["export", str(root / "run"), str(root / "hf")]) == 0
    questions = [("the quick brown", ["fox", "trees"], 0), ("birds sing in", ["green", "mat"], 0),
                 ("the lazy", ["dog", "sing"], 0), ("cat sat on", ["mat", "quick"], 0),
                 ("jumps over", ["lazy", "birds"], 1), ("in green", ["trees", "the"], 0)]
    tasks = root / "animals.jsonl"
    tasks.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in questions))
    return root


def card(directory: Path):
    return hub.ModelCard.load(Path(directory) / "README.md")


def test_export_writes_a_card_the_hub_reads(world):
    from transformers import AutoModelForCausalLM

    from depthlab.ownership import is_depthlab_hf

    c = card(world / "hf")
    _, cfg, meta = load_checkpoint(world / "run")
    assert c.data.library_name == "transformers" and c.data.license == "other" and c.data.base_model is None
    assert {"depthlab", "scheme-lns", "llama"} <= set(c.data.tags) and c.data.pipeline_tag == "text-generation"
    # the checkpoint's own validation, as the Hub's eval results
    got = {r.metric_type: r.metric_value for r in c.data.eval_results}
    assert got == {"loss": meta.val["val_loss"], "perplexity": meta.val["val_ppl"]}
    # the scheme from the registry, with its per-block constants and the fold; the steps and tokens trained on
    tokens = json.loads((world / "run" / "metrics.jsonl").read_text().splitlines()[-1])["tokens"]
    assert tokens == 4 * 4 * 32
    assert "Pre-LN with both norm outputs of block l scaled by l^(-p)" in c.text and "1/sqrt(l)" in c.text
    assert "| 2 | 0.7071 | 0.7071 |" in c.text and "| 3 | 0.5774 | 0.5774 |" in c.text
    assert "folded into the weights" in c.text and "stock `LlamaForCausalLM`" in c.text
    assert f"- steps: 4 ({tokens:,} tokens)" in c.text and f"`{cfg.data.paths[0]}`" in c.text
    assert f"hash `{meta.tokenizer_hash}`" in c.text
    # the card changes nothing for what reads the directory
    assert is_depthlab_hf(world / "hf") and AutoModelForCausalLM.from_pretrained(world / "hf") is not None


def printed_accuracies(out: str) -> dict[str, tuple[float, float]]:
    return {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(r"(\S+): \d+ questions\s+acc (\S+)\s+acc_norm (\S+)",
                                                                   out)}


def test_eval_card_adds_the_accuracies_eval_printed(world, tmp_path, capsys):
    export = tmp_path / "hf"
    shutil.copytree(world / "hf", export)
    capsys.readouterr()
    assert main(["eval", "tasks", str(world / "run"), "--tasks", str(world / "animals.jsonl"), "--card",
                 str(export)]) == 0
    out = capsys.readouterr().out
    printed = printed_accuracies(out)
    assert list(printed) == [str(world / "animals.jsonl")] and f"added 2 results to {export / 'README.md'}" in out
    results = {(r.task_name, r.metric_type): r.metric_value for r in card(export).data.eval_results}
    exact = results[("animals", "acc")], results[("animals", "acc_norm")]
    assert all(v * 6 == round(v * 6) for v in exact)  # k right of 6 questions, unrounded
    assert printed[str(world / "animals.jsonl")] == tuple(round(v, 4) for v in exact)
    assert ("validation", "perplexity") in results  # the export's own stay
    # the export itself, evaluated and carded: the same numbers replace the same entries, nothing is duplicated
    assert main(["eval", "tasks", str(export), "--tasks", str(world / "animals.jsonl"), "--card", str(export)]) == 0
    again = card(export)
    assert len(again.data.eval_results) == 4 and f"| animals | {world / 'animals.jsonl'} | acc |" in again.text
    assert again.text.count("## Evaluation") == 1


def test_eval_card_takes_commonsense_mmlu_and_perplexity(world, tmp_path, capsys):
    """The other evaluations' numbers, unrounded: the commonsense tasks' two forms and MMLU's micro and macro as
    the table's JSON records them, perplexity as eval printed it."""
    from tests.test_mmlu import make_mmlu

    export = tmp_path / "hf"
    shutil.copytree(world / "hf", export)
    make_mmlu(tmp_path / "mmlu", n_dev=1, n_test=2)
    commonsense = Path(__file__).parent / "data" / "commonsense" / "eval"
    assert main(["eval", "commonsense", str(world / "run"), "--commonsense", str(commonsense), "--mmlu",
                 str(tmp_path / "mmlu" / "parquet"), "--table", str(tmp_path / "table"), "--max-new-tokens", "2",
                 "--device", "cpu", "--card", str(export)]) == 0
    capsys.readouterr()
    assert main(["eval", "ppl", str(world / "run"), "--card", str(export)]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "table.json").read_text())["results"][str(world / "run")]
    got = {(r.task_name, r.metric_type): r.metric_value for r in card(export).data.eval_results}
    assert got[("BoolQ", "acc_generation")] == res["boolq"]["generation"]
    assert got[("ARC-c", "acc_loglik")] == res["ARC-Challenge"]["loglik"]
    assert (got[("MMLU", "acc")], got[("MMLU", "acc_macro")]) == (res["mmlu"]["micro"], res["mmlu"]["macro"])
    assert len(got) == 2 + 8 * 2 + 2 + 2  # the export's validation, 8 tasks, MMLU, perplexity
    assert f"loss {got[('perplexity', 'loss')]:.4f}  perplexity {got[('perplexity', 'perplexity')]:.3f}" in out


def test_bad_card_directories_are_one_line(world, tmp_path, capsys):
    tasks = str(world / "animals.jsonl")
    pruned = tmp_path / "pruned"
    assert main(["prune", str(world / "hf"), "--remove", "0:1", str(pruned)]) == 0
    capsys.readouterr()
    for directory, says in ((tmp_path / "missing", "does not exist"),
                            (world / "run", "is a depthlab run directory, not a `depthlab export` directory"),
                            (pruned, "has no model card (README.md); write one with `depthlab export`")):
        assert main(["eval", "tasks", str(world / "run"), "--tasks", tasks, "--card", str(directory)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    # the card of another model's export: refused before the evaluation, the card unchanged
    before = (world / "hf" / "README.md").read_text()
    assert main(["eval", "tasks", str(pruned), "--tasks", tasks, "--card", str(world / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is the export of" in err[0] and (world / "hf" / "README.md").read_text() == before


def test_export_again_keeps_the_results_of_the_same_weights_only(world, tmp_path, capsys):
    from depthlab.card import Scores, add_results

    export = tmp_path / "hf"
    shutil.copytree(world / "hf", export)
    add_results(export, [Scores("animals", "animals", {"acc": 0.5, "acc_norm": 1.0})])
    before = card(export).data.eval_results
    assert len(before) == 4 and "| animals | animals | acc | 0.5000 |" in card(export).text
    assert main(["export", str(world / "run"), str(export)]) == 0  # the same checkpoint: its results are still true
    after = card(export)
    assert [(r.task_name, r.metric_type, r.metric_value) for r in after.data.eval_results] == \
        [(r.task_name, r.metric_type, r.metric_value) for r in before]
    assert after.text.count("## Evaluation") == 1
    # another checkpoint exported over it (a pre run): the old results go with the old weights
    assert main(["train", "--scheme", "pre", "--data", str(json.loads((world / "run" / "config.json").read_text())
                                                          ["data"]["paths"][0]), "--run-dir", str(tmp_path / "pre"),
                 "--max-steps", "2", "--no-progress", *TINY]) == 0
    assert main(["export", str(tmp_path / "pre"), str(export)]) == 0
    other = card(export)
    assert "scheme-pre" in other.data.tags and {r.task_name for r in other.data.eval_results} == {"validation"}
    assert "folded" not in other.text  # pre multiplies nothing


def test_export_again_over_a_card_whose_metadata_does_not_parse_says_so_in_one_line(world, tmp_path, capsys):
    export = tmp_path / "hf"
    shutil.copytree(world / "hf", export)
    text = (export / "README.md").read_text()
    (export / "README.md").write_text(text.replace("library_name: transformers", "library_name: [transformers", 1))
    capsys.readouterr()
    assert main(["export", str(world / "run"), str(export)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"depthlab: warning: {export / 'README.md'}: cannot read its results "
                                               "(its metadata (the YAML between the --- lines) does not parse at line")
    assert card(export).data.library_name == "transformers"  # the new card, the checkpoint's own results


def test_a_vit_export_has_an_image_classification_card(tmp_path):
    assert main(["train", "--preset", "vit-digits", "--run-dir", str(tmp_path / "vit"), "--no-progress",
                 "--max-steps", "2", "--set", "train.warmup_steps=1", "--set", "model.dim=32", "--set",
                 "model.n_layers=2", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64"]) == 0
    assert main(["export", str(tmp_path / "vit"), str(tmp_path / "hf")]) == 0
    c = card(tmp_path / "hf")
    _, _, meta = load_checkpoint(tmp_path / "vit")
    assert c.data.pipeline_tag == "image-classification" and {"scheme-lns", "vit"} <= set(c.data.tags)
    assert {r.metric_type: r.metric_value for r in c.data.eval_results}["accuracy"] == meta.val["val_acc"]
    assert "`ViTForImageClassification`" in c.text and "AutoModelForImageClassification" in c.text


def test_base_model_is_the_hub_model_an_import_started_from(tmp_path, corpus):
    from depthlab.card import base_model, hub_id
    from depthlab.hf.exporter import hf_tokenizer
    from tests.test_hf_fixtures import tiny_hf, word_tokenizer

    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "0123abc"
    tiny_hf("llama").save_pretrained(snapshot)
    hf_tokenizer(word_tokenizer()).save_pretrained(snapshot)
    assert main(["import", str(snapshot), str(tmp_path / "imported"), "--scheme", "lns"]) == 0
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "hf")]) == 0
    assert card(tmp_path / "hf").data.base_model == "acme/tiny-llama"
    # continued pretraining from the import: the same base, found through train.init_from
    assert main(["train", "--init-from", str(tmp_path / "imported"), "--data", str(corpus), "--run-dir",
                 str(tmp_path / "cont"), "--max-steps", "2", "--no-progress", "--set", "data.seq_len=16",
                 "--set", "train.batch_size=2", "--set", "train.warmup_steps=1"]) == 0
    _, cfg, meta = load_checkpoint(tmp_path / "cont")
    assert base_model(cfg, meta) == "acme/tiny-llama"
    assert hub_id("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert hub_id(str(tmp_path)) is None and hub_id("model.gguf") is None
