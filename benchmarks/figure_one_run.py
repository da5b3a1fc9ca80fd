"""The paper's Figure 1 on a real run of ours: a 48-block Pre-LN and LNS pair of the LNS study, each at its own best
rate at N = 48, with removal scored by a held-out continuation task built from the study corpus's test split.

    python -m benchmarks.figure_one_run --runs-dir DIR [--out DIR]   # resumable; record in results/figure_one_run.json
    python -m benchmarks.figure_one_run --runs-dir DIR --steps 600 --eval-every 200 --questions 150 \
        --analyze-tokens 4096                                       # what docs/analysis.md shows (the CPU's time)

1. train pre (4e-3) and lns (1.6e-2): the LNS study's model, data and training (width 64, 2,000 steps of 16 x 64
   tokens, the deduplicated study corpus), both at once, one thread each; cells recorded in DIR/runs.jsonl are
   not trained again and a killed cell resumes at its last evaluation; analyses of the same task and options are
   not run again either;
2. the task: --questions 4-choice questions from the test split (documents no training or selection read): a context
   of real text, its true continuation of --choice-tokens tokens, and three continuations of as many tokens taken
   from other test documents at a similar position (seeded);
3. `depthlab analyze` each run on the test documents: with --removal-tasks --drop-lowest (OUT/<scheme>), and
   with --sublayers --linear-replacement scored by loss (OUT/<scheme>_sublayers); `depthlab compare` overlays the
   two schemes (OUT/compare/figure_one.png, OUT/compare_sublayers/sublayers.png).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.common import environment
from benchmarks.depth_study import add_arguments, study
from depthlab import UserError
from depthlab.cli import Parser
from depthlab.study.records import load_records, recorded_command
from depthlab.study.runner import Cell, run_cells
from depthlab.study.script import parse

RECORD = Path(__file__).parent / "results" / "figure_one_run.json"
RATES = {"pre": 4e-3, "lns": 1.6e-2}  # each scheme's best rate at N = 48 in the LNS study (results/lns_study)


def train(a, command: str) -> tuple[object, dict]:
    """Train both cells unless recorded; (the study, scheme -> its record)."""
    s = study(argparse.Namespace(**{**vars(a), "out": a.runs_dir}), command, "fig1")
    s.probe, s.budgets, s.keep_runs = None, [], True  # analyze does the probing; the runs are what it reads
    cells = {v: Cell(v, lr, 0, a.layers) for v, lr in (("pre", a.pre_lr), ("lns", a.lns_lr))}
    run_cells(s, list(cells.values()), jobs=2)
    records = load_records(s.runs_file)
    return s, {v: records[c.key] for v, c in cells.items()}


def test_documents(s) -> list:
    """The corpus's test documents, as depthlab.study.corpus.build_corpus dealt them."""
    from depthlab.data.dataset import load_text, split_documents
    from depthlab.data.dedup import dedup
    from depthlab.study.corpus import NEAR_COPY

    cfg = s.config(Cell("pre", 1e-3, 0))
    kept, _ = dedup(load_text(cfg)[0], NEAR_COPY)
    return split_documents(kept, cfg.data.val_fraction)[1][1::2]


def cuts(text: str, tok, n: int, context: int) -> list[tuple[int, int, int]]:
    """(start, space, end) of every place where a token starting with one space is preceded by `context` tokens and
    followed by n - 1 more tokens of the same line: text[start:space] is a context, text[space + 1:end] its
    continuation of n tokens (eval joins the two with one space, so the model reads the original text)."""
    offs = tok.encode(text, add_special_tokens=False).offsets
    out = []
    for i in range(context, len(offs) - n):
        a, b = offs[i][0], offs[i + n - 1][1]
        if text[a] == " " and not text[a - 1].isspace() and not text[a + 1].isspace() and "\n" not in text[a:b]:
            out.append((offs[i - context][0], a, b))
    return out


def build_task(docs: list, tok, questions: int, n_tokens: int, context: int, seed: int) -> list[dict]:
    """Questions in eval's MC format: `context` tokens of a test document (the documents taken in turn, questions of
    one document not overlapping), its true continuation of n_tokens, and three continuations of as many tokens from
    three other documents, each at its place nearest the same relative position (seeded)."""
    rng = random.Random(seed)
    places = [cuts(d.text, tok, n_tokens, context) for d in docs]
    shuffled = [rng.sample(cs, len(cs)) for cs in places]
    # documents in turn, so that one long file does not make most of the questions
    pool = [(i, cs[k]) for k in range(max(map(len, places))) for i, cs in enumerate(shuffled) if k < len(cs)]
    taken: dict[int, list[tuple[int, int]]] = {}
    out = []
    for i, (start, space, end) in pool:
        if len(out) == questions:
            break
        if any(start < b and a < end for a, b in taken.get(i, [])):
            continue
        text = docs[i].text
        true, where = text[space + 1:end], space / len(text)
        choices = [true]
        for j in rng.sample(range(len(docs)), len(docs)):
            if j != i and places[j] and len(choices) < 4:
                other = docs[j].text
                _, a, b = min(places[j], key=lambda c: abs(c[1] / len(other) - where))
                choices += [other[a + 1:b]] if other[a + 1:b] not in choices else []
        if len(choices) == 4:
            taken.setdefault(i, []).append((start, end))
            rng.shuffle(choices)
            out.append({"question": text[start:space], "choices": choices, "answer": choices.index(true),
                        "document": docs[i].name})
    return out

def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m benchmarks.figure_one_run", description=__doc__.split("\n")[0],
               conflict_handler="resolve")  # its own --runs-dir and --out
    add_arguments(p)  # the study's model, data and training settings (--steps, --dim, --corpus-mb, ...)
    p.add_argument("--runs-dir", required=True, help="the two runs, their corpus and records (outside the repo)")
    p.add_argument("--out", help="the task file, the analyses and the comparison (default RUNS_DIR/figure_one)")
    p.add_argument("--record", default=str(RECORD), help=f"the numbers, as JSON (default {RECORD})")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--pre-lr", type=float, default=RATES["pre"])
    p.add_argument("--lns-lr", type=float, default=RATES["lns"])
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--choice-tokens", type=int, default=3, help="tokens of each continuation")
    p.add_argument("--context-tokens", type=int, default=48, help="tokens of each question's context")
    p.add_argument("--task-seed", type=int, default=0)
    p.add_argument("--drop-lowest", type=int, default=4)
    p.add_argument("--analyze-tokens", type=int, default=8192, help="analyze --tokens: calibration text")
    return p


def analyses(a, run_dir: Path, out: Path, scheme: str) -> dict[str, list[str]]:
    """The two `analyze` commands of one run: whole-block removal scored by the task (and by loss, with the k least
    useful blocks), and sublayer removal and linear replacement scored by loss. One analysis with all of them
    would score every sublayer and linear map on the task too: four times the task sweep, about 15 s a question
    at 48 blocks on one shared CPU thread."""
    cmd = [sys.executable, "-m", "depthlab", "analyze", str(run_dir), "--data", str(out / "test_documents.jsonl"),
           "--tokens", str(a.analyze_tokens), "--device", a.device, "--no-jacobian", "--no-progress"]
    return {f"{scheme}": [*cmd, "--removal-tasks", str(out / "continuation.jsonl"), "--drop-lowest",
                          str(a.drop_lowest), "--out", str(out / scheme)],
            f"{scheme}_sublayers": [*cmd, "--sublayers", "--linear-replacement", "--no-init", "--out",
                                    str(out / f"{scheme}_sublayers")]}


def summary(train_rec: dict, res: dict, parts: dict) -> dict:
    """What the docs read of one model: its training, and its analyses' removal numbers (Δ in nats, drops in
    accuracy points over 1); `parts`: the sublayer analysis."""
    from depthlab.analysis.curse import shallow_deep

    rm, idx = res["removal"], res["curse_index"]
    (name, t), = res["task_removal"]["tasks"].items()
    L = len(rm["single"])
    shallow, deep = shallow_deep(L)
    drops = [r["acc_drop"] for r in t["single"]]
    mean = lambda blocks: sum(drops[b - 1] for b in blocks) / len(blocks) if blocks else None  # noqa: E731
    r4 = lambda xs: [round(x, 4) for x in xs]  # noqa: E731
    return {
        "train": {k: train_rec.get(k) for k in ("key", "lr", "steps", "tokens", "val_loss", "test_loss", "wall_s")}
        | {"tokens_per_s": train_rec["tokens"] / train_rec["wall_s"]},
        "base_loss": rm["base_loss"], "task": name, "questions": t["n"], "base_acc": t["base_acc"],
        "base_acc_ci": t["base_acc_ci"], "base_ll": t["base_ll"],
        "acc_drop": r4(drops), "drop_ci": [r4(r["drop_ci"]) for r in t["single"]],
        "drop_p": r4([r["drop_p"] for r in t["single"]]),
        "cheapest_by_tasks": res["usefulness"]["tasks"][:4],  # accuracy lost, then the answers' log-likelihood
        "task_drop_shallow": mean(shallow), "task_drop_deep": mean(deep), "shallow": shallow, "deep": deep,
        **{f"delta_loss_{p}": r4([r["delta_loss"] for r in parts["removal"][p]])
           for p in ("single", "attn", "mlp", "linear")},
        "linear_fit_residual": r4([r["fit_residual"] for r in parts["removal"]["linear"]]),
        "cheapest_by_loss": res["usefulness"]["loss"][:4],
        **{k: idx.get(k) for k in ("removal_deep_over_shallow", "removal_deep_over_shallow_ci", "inert_fraction",
                                   "inert_fraction_ci")},  # none on a model too shallow for an interior
        "inert_fraction_at_init": idx.get("at_init", {}).get("inert_fraction"),
        "drop_lowest": {by: [{"k": d["k"], "blocks": sorted(res["usefulness"][by][:d["k"]]), "loss": d["loss"],
                              **{k: x for k, x in next(x for x in t["drop"][by] if x["k"] == d["k"]).items()
                                 if k in ("acc", "acc_drop", "drop_ci")}} for d in drops_k]
                        for by, drops_k in rm["drop"].items()},
    }


def main(argv=None) -> None:
    a = parse(parser(), argv)
    runs, out = Path(a.runs_dir), Path(a.out or Path(a.runs_dir) / "figure_one")
    s, records = train(a, recorded_command("benchmarks.figure_one_run", argv))
    from depthlab.data.tokenizer import load_tokenizer

    docs = test_documents(s)
    task = build_task(docs, load_tokenizer(Path(s.corpus) / "tokenizer.json"), a.questions, a.choice_tokens,
                      a.context_tokens, a.task_seed)
    out.mkdir(parents=True, exist_ok=True)
    cmds = {k: c for v, r in records.items() for k, c in analyses(a, runs / f"{s.name}-{r['key']}", out, v).items()}
    inputs = {"continuation.jsonl": "".join(json.dumps(q) + "\n" for q in task), "analyze.json": json.dumps(cmds),
              "test_documents.jsonl": "".join(json.dumps({"text": d.text}) + "\n" for d in docs)}
    if any(not (out / f).exists() or (out / f).read_text() != text for f, text in inputs.items()):
        for k in cmds:  # another task or other analyze options: the earlier analyses do not count
            shutil.rmtree(out / k, ignore_errors=True)
        for f, text in inputs.items():
            (out / f).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    jobs = {k: subprocess.Popen(c, env=env) for k, c in cmds.items()
            if not (out / k / "metrics.json").exists()}  # delete OUT/<name> to redo one
    if any(p.wait() for p in jobs.values()):
        raise UserError(f"depthlab analyze failed for {[k for k, p in jobs.items() if p.returncode]}")
    for suffix in ("", "_sublayers"):  # figure_one.png from the first, sublayers.png from the second
        subprocess.run([sys.executable, "-m", "depthlab", "compare", *(str(out / f"{v}{suffix}") for v in records),
                        "--labels", *records, "--no-progress", "--out", str(out / f"compare{suffix}")], env=env,
                       check=True)
    record = {"command": recorded_command("benchmarks.figure_one_run", argv),
              "environment": environment(threads=1, processes=len(cmds), what="the analyses: one thread each, "
                                         "side by side; training ran one thread per cell (train.threads=1)"),
              "settings": s.base, "task": {"file": "continuation.jsonl", "questions": len(task),
                                           "documents": sorted({q["document"] for q in task}),
                                           "choice_tokens": a.choice_tokens, "context_tokens": a.context_tokens,
                                           "seed": a.task_seed},
              "models": {v: summary(r, *(json.loads((out / f"{v}{x}" / "metrics.json").read_text())
                                         for x in ("", "_sublayers"))) for v, r in records.items()}}
    Path(a.record).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {a.record}, {out / 'compare'}")


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
