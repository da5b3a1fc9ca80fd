"""The paper's Figure 1 for any model: removal scored by tasks equals pruning the block and evaluating; sublayer
removal equals zeroing that sublayer's output; linear replacement costs nothing on a planted affine block."""

import json

import pytest
import torch
from torch import nn

from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.layers import LayeredLM, from_depthlab, from_hf
from depthlab.cli import main
from tests.test_analysis_support import TEXT, random_batches, save_hf_model, tiny_hf_model

transformers = pytest.importorskip("transformers")

SUBJECT_ROWS = [("What is 2 + 2?", "3", "4", "5", "6", "B"), ("def f(x): return x * 3. What is f(2)?", "5", "6",
                                                                 "7", "8", "B")]


def write_tasks(root):
    """A small MMLU directory (the original CSV layout, two subjects with dev questions) and an MC jsonl file."""
    import csv

    for split in ("test", "dev"):
        (root / "mmlu" / split).mkdir(parents=True)
        for subject in ("arithmetic", "python_code"):
            rows = SUBJECT_ROWS if split == "test" else SUBJECT_ROWS[:1]
            with open(root / "mmlu" / split / f"{subject}_{split}.csv", "w", newline="") as f:
                csv.writer(f).writerows(rows)
    lines = [{"question": f"def f{i}(x):\n    return x * {i} +", "choices": [str(i % 7), "x", "line"], "answer": 0}
             for i in range(3)]
    (root / "mc.jsonl").write_text("\n".join(json.dumps(q) for q in lines) + "\n")
    return root / "mmlu", root / "mc.jsonl"


def _analyze(model, out, *extra):
    (out.parent / "text.txt").write_text(TEXT)
    assert main(["analyze", str(model), "--data", str(out.parent / "text.txt"), "--tokens", "64", "--seq-len", "32",
                 "--no-jacobian", "--no-progress", "--out", str(out), *extra]) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
def test_task_removal_equals_prune_then_eval_and_layerwise_equals_whole(tmp_path):
    from depthlab.analysis.run import Request, run_request
    from depthlab.eval.mmlu import evaluate_mmlu, read_mmlu
    from depthlab.eval.multiple_choice import evaluate_tasks, load_scorer
    from depthlab.eval.suite import TaskSuite
    from depthlab.hf import prune

    hf = save_hf_model(tmp_path / "hf", "llama")
    mmlu, mc = write_tasks(tmp_path)
    tasks = ["--removal-mmlu", str(mmlu), "--mmlu-shots", "1", "--removal-tasks", str(mc)]
    whole = _analyze(hf, tmp_path / "whole", *tasks, "--sublayers", "--drop-lowest", "2")
    suite = TaskSuite.read([mc], mmlu, 1)
    opts = Options(jacobian=False, sublayers=True, drop_lowest=2, activation_mb=0)
    layerwise = run_request(Request(str(hf), [str(tmp_path / "text.txt")], tokens=64, seq_len=32, layerwise=True,
                                    options=opts, tasks=suite))
    got = whole["task_removal"]["tasks"]
    assert set(got) == {"mmlu", "mc"} and got["mmlu"]["n"] == 4 and got["mc"]["n"] == 3
    for l in range(4):
        pruned = prune(hf, l, l + 1, tmp_path / f"pruned{l}")
        scorer = load_scorer(pruned, "cpu")
        m = evaluate_mmlu(scorer, read_mmlu(mmlu), 1)
        m_ll = [s[q.answer] for subj, res in m["subjects"].items() for s, q in zip(res["scores"],
                                                                                   read_mmlu(mmlu)[subj]["test"])]
        t = evaluate_tasks(scorer, mc)
        t_ll = [s[0] for s in t["scores"]]
        for name, acc, lls in (("mmlu", m["micro"], m_ll), ("mc", t["acc"], t_ll)):
            row = got[name]["single"][l]
            assert row["block"] == l + 1 and row["acc"] == acc, (name, l)
            assert row["ll"] == pytest.approx(sum(lls) / len(lls), abs=1e-4)
            assert row["acc_drop"] == pytest.approx(got[name]["base_acc"] - acc)
            assert row["acc_ci"][0] <= acc <= row["acc_ci"][1]
            assert row["drop_ci"][0] <= row["acc_drop"] <= row["drop_ci"][1]
            assert row["lost"] - row["gained"] == round(row["acc_drop"] * got[name]["n"])
    base = evaluate_tasks(load_scorer(hf, "cpu"), mc)
    assert got["mc"]["base_acc"] == base["acc"]
    # layer-by-layer mode, every stream on disk: the same numbers
    for kind in ("single", "attn", "mlp", "runs"):
        for name in got:
            for a, b in zip(got[name][kind], layerwise["task_removal"]["tasks"][name][kind], strict=True):
                assert a["acc"] == b["acc"] and a["ll"] == pytest.approx(b["ll"], abs=1e-4)
        for a, b in zip(whole["removal"][kind], layerwise["removal"][kind], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert whole["usefulness"] == layerwise["usefulness"]
    for by in ("loss", "tasks"):
        assert [d["loss"] for d in whole["removal"]["drop"][by]] == pytest.approx(
            [d["loss"] for d in layerwise["removal"]["drop"][by]], rel=1e-5)
    assert layerwise["removal"]["streams"]["in_memory_peak_mb"] == 0 < layerwise["removal"]["streams"]["on_disk_mb"]
    html = (tmp_path / "whole" / "report.html").read_text()
    for name in ("figure_one", "sublayers"):  # the figures, each beside its own table
        assert f"{name}.png" in html and (tmp_path / "whole" / f"{name}.png").stat().st_size > 1000
    written = {p.name for p in (tmp_path / "whole").iterdir()}
    assert {"task_removal.csv", "sublayer_removal.csv", "drop_lowest.csv"} <= written


def _zeroed(model, l: int, part: str, hf: bool):
    layer = model.model.layers[l] if hf else model.layers[l]
    attn = layer.self_attn if hf else layer.attn
    with torch.no_grad():
        (attn.o_proj if part == "attn" else layer.mlp.down_proj).weight.zero_()
    return model


@pytest.mark.parametrize("family", ["llama", "depthlab-lns"])
def test_sublayer_removal_equals_that_sublayers_output_zeroed(family):
    import copy

    from depthlab.model import Transformer
    from tests.conftest import tiny_model_config

    hf = family == "llama"
    if hf:
        model = tiny_hf_model("llama")
    else:
        torch.manual_seed(0)
        model = Transformer(tiny_model_config(norm_scheme="lns", vocab_size=300)).eval()
    wrap = from_hf if hf else from_depthlab
    batches = random_batches(300)
    res = analyze(wrap(model, family), batches, Options(sublayers=True, jacobian=False))["removal"]
    for part in ("attn", "mlp"):
        for l in range(4):
            zeroed = _zeroed(copy.deepcopy(model), l, part, hf)
            want = analyze(wrap(zeroed, "z"), batches, Options(jacobian=False))["removal"]["base_loss"]
            assert res[part][l]["loss"] == pytest.approx(want, rel=1e-5), (part, l)
    # each half costs something, and less than the whole block does on average
    assert all(r["delta_loss"] != 0 for part in ("attn", "mlp") for r in res[part])


class ToyBlock(nn.Module):
    """A residual MLP block, or (planted) a plain affine map."""

    def __init__(self, d: int, affine: bool):
        super().__init__()
        self.affine = affine
        self.lin, self.up, self.down = nn.Linear(d, d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, h, *args):
        return self.lin(h) if self.affine else h + self.down(torch.tanh(3 * self.up(h)))


class Toy(nn.Module):
    def __init__(self, d=16, vocab=50, affine=1):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(ToyBlock(d, i == affine) for i in range(4))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        for blk in self.layers:
            h = blk(h)
        return self.head(self.norm(h))


def test_linear_replacement_costs_nothing_on_a_planted_affine_block_only():
    torch.manual_seed(0)
    toy = Toy().eval()
    with torch.no_grad():  # visible work in every block, a head that reads it
        for w in (toy.head.weight, *(b.lin.weight for b in toy.layers)):
            w.mul_(4)
    lm = LayeredLM(toy, lambda ids, mask: toy(ids), "toy", "hf", toy.head)
    evaluate, fit = random_batches(50, n=2, T=32, seed=1), random_batches(50, n=4, T=32, seed=2)
    res = analyze(lm, evaluate, Options(linear=True, jacobian=False), fit=fit)["removal"]
    planted, other = res["linear"][1], res["linear"][2]
    assert abs(planted["delta_loss"]) < 1e-6 and planted["fit_residual"] < 1e-6
    assert abs(res["single"][1]["delta_loss"]) > 0.01  # removing it is not free: it is affine, not the identity
    assert other["delta_loss"] > 1e-3 and other["fit_residual"] > 0.05
    assert res["linear_fit_tokens"] == 4 * 2 * 32


def test_linear_fit_windows_are_kept_apart_from_the_evaluation_windows(tmp_path):
    from depthlab.analysis.run import Request, batches_for, load_layered

    hf = save_hf_model(tmp_path / "hf", "llama")
    loaded = load_layered(str(hf))
    (tmp_path / "t.txt").write_text(TEXT)
    req = Request(str(hf), data=[str(tmp_path / "t.txt")], tokens=100, options=Options(linear=True),
                  linear_fit_tokens=200)
    batches, fit, source = batches_for(req, loaded.lm, loaded.tokenizer, 32, 64)
    rows = {tuple(r[m].tolist()) for b in batches for r, m in zip(b.ids, b.mask)}
    fit_rows = {tuple(r[m].tolist()) for b in fit for r, m in zip(b.ids, b.mask)}
    assert sum(b.n_tokens for b in batches) >= 100 and sum(b.n_tokens for b in fit) >= 200
    assert not rows & fit_rows and "linear maps fitted on" in source


def test_every_removal_option_on_a_depthlab_run_with_its_index_at_initialisation(tmp_path):
    from depthlab.analysis.run import Request, run_request
    from tests.test_analysis_support import save_depthlab_checkpoint

    ck = save_depthlab_checkpoint(tmp_path / "ck", "lns", 4)
    (tmp_path / "t.txt").write_text(TEXT)
    opts = Options(jacobian=False, sublayers=True, linear=True, drop_lowest=1)
    res = run_request(Request(str(ck), [str(tmp_path / "t.txt")], tokens=64, seq_len=32, options=opts,
                              linear_fit_tokens=64))
    assert {"attn", "mlp", "linear", "drop"} <= set(res["removal"]) and "at_init" in res["curse_index"]


def test_paired_drop_reads_the_discordant_questions():
    from depthlab.stats import paired_drop

    base = [True] * 30 + [False] * 10
    after = [False] * 12 + [True] * 18 + [True] * 2 + [False] * 8  # 12 lost, 2 gained
    d = paired_drop(base, after)
    assert (d["lost"], d["gained"]) == (12, 2) and d["drop_ci"][0] < 10 / 40 < d["drop_ci"][1]
    assert d["drop_ci"][0] > 0 and d["drop_p"] == pytest.approx(0.012939, abs=1e-5)  # exact McNemar, 2-sided
    assert paired_drop(base, base) == {"lost": 0, "gained": 0, "drop_ci": [0.0, 0.0], "drop_p": 1.0}


@pytest.mark.parametrize("lost,gained", [(k, g) for k in range(13) for g in range(6) if k + g])
def test_the_drops_interval_excludes_0_exactly_when_mcnemar_rejects(lost, gained):
    """The interval and the test read the same discordant questions alike (a Wilson interval did not: 4 lost, 0
    gained excluded 0 at p 0.125)."""
    from depthlab.stats import paired_drop

    base = [True] * lost + [False] * gained + [True] * 7
    after = [False] * lost + [True] * gained + [True] * 7
    d = paired_drop(base, after)
    assert (d["drop_ci"][0] > 0 or d["drop_ci"][1] < 0) == (d["drop_p"] < 0.05)


def test_figure_one_draws_drops_that_sit_on_their_interval_end(tmp_path):
    """A drop equal to an end of its interval up to rounding (all the discordant questions lost, or gained) draws."""
    from depthlab.analysis.removal_report import plot_figure_one

    drop = -1 / 300
    row = {"block": 1, "acc": 0.59, "acc_ci": [0.53, 0.64], "acc_drop": drop, "drop_ci": [drop + 1e-17, 0.01]}
    res = {"task_removal": {"tasks": {"t": {"n": 300, "base_acc": 0.5866666666666667, "single": [row]}}}}
    assert plot_figure_one([("m", res)], tmp_path / "f.png").stat().st_size > 1000
