"""The eight commonsense tasks as the LNS paper (and LLM-Adapters, whose data it uses) evaluates them.

Test files: LLM-Adapters' `dataset/<task>/test.json` layout, DIR/<task>/test.json, each a JSON array (or JSON lines)
of Commonsense170K-format records: `instruction` (the question with its options and an "Answer format:" line),
`input`, `output` ("the correct answer is solution1") and `answer` ("solution1").

Two forms, both on the prompt fine-tuning trains on (depthlab.data.instructions: LLM-Adapters'
template, encoded as in fine-tuning):
- generation (the paper's): greedy decoding of up to `max_new_tokens` tokens (stopping at end of text), and the
  answer is the first match of the task's answer-vocabulary regex in the stripped output, as LLM-Adapters'
  `commonsense_evaluate.py` `extract_answer` does (no match: wrong);
- log-likelihood: the record's `output` with its answer replaced by each label of the task's vocabulary that the
  question offers (the "Answer format:" labels) is scored as the continuation of the prompt; the highest summed
  log-probability is the pick.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.data.instructions import prompt_of, read_records
from depthlab.eval.multiple_choice import ScoredQuestion, Scorer, argmax, score_pairs

# LLM-Adapters' directory name -> (the paper's column, the answer vocabulary of extract_answer)
TASKS = {
    "boolq": ("BoolQ", ["true", "false"]),
    "piqa": ("PIQA", ["solution1", "solution2"]),
    "social_i_qa": ("SIQA", [f"answer{i}" for i in range(1, 6)]),
    "hellaswag": ("HellaSwag", [f"ending{i}" for i in range(1, 5)]),
    "winogrande": ("WinoGrande", ["option1", "option2"]),
    "ARC-Easy": ("ARC-e", [f"answer{i}" for i in range(1, 6)]),
    "ARC-Challenge": ("ARC-c", [f"answer{i}" for i in range(1, 6)]),
    "openbookqa": ("OBQA", [f"answer{i}" for i in range(1, 6)]),
}
FORMS = ("generation", "loglik")
TABLE_MARK = "depthlab eval --commonsense"  # in the JSON half of a table: what may be written over


def extract_answer(task: str, text: str) -> str:
    """LLM-Adapters' extract_answer: the first match of the task's vocabulary in the stripped text, else ''."""
    found = re.findall("|".join(TASKS[task][1]), text.strip())
    return found[0] if found else ""


def task_files(root: str | Path) -> dict[str, Path]:
    """{task: DIR/task/test.json} for the tasks present (at least one)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"--commonsense {root}: not a directory (expected DIR/<task>/test.json, e.g. boolq/test.json)")
    found = {t: root / t / "test.json" for t in TASKS if (root / t / "test.json").is_file()}
    if not found:
        raise UserError(f"--commonsense {root}: none of {', '.join(f'{t}/test.json' for t in TASKS)} is there")
    return found


def read_task(task: str, path: Path) -> list[dict]:
    records = read_records(path)
    for r in records:
        if r.get("answer") not in TASKS[task][1]:
            raise UserError(f"{path}:{r['line']}: 'answer' must be one of {'/'.join(TASKS[task][1])} for {task}, "
                            f"got {r.get('answer')!r}")
    return records


@torch.no_grad()
def generate(scorer: Scorer, ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding (no cache: the models here are small), up to end of text or max_new_tokens."""
    out: list[int] = []
    for _ in range(max_new_tokens):
        x = torch.tensor([(ids + out)[-scorer.max_len:]], device=scorer.device)
        nxt = int(scorer.logits(x)[0, -1].argmax())
        if nxt == scorer.eot_id:
            break
        out.append(nxt)
    return out


def offered(task: str, instruction: str) -> list[str]:
    """The labels the question offers ("Answer format: answer1/answer2/answer3"), else the task's vocabulary."""
    labels = [w for w in TASKS[task][1] if re.search(rf"\b{w}\b", instruction.rsplit("Answer format:", 1)[-1])]
    return labels if len(labels) > 1 else TASKS[task][1]


def loglik_pairs(scorer: Scorer, task: str, rec: dict, ctx: list[int]) -> tuple[list[str], list]:
    """The labels the question offers, and for each the (prompt, output with that label) request."""
    labels = offered(task, rec["instruction"])
    out = rec["output"] if rec["answer"] in rec["output"] else rec["answer"]
    return labels, [(ctx, scorer.encode(out.replace(rec["answer"], label), False)) for label in labels]


def loglik_pick(scorer: Scorer, task: str, rec: dict, ctx: list[int]) -> str:
    labels, pairs = loglik_pairs(scorer, task, rec, ctx)
    return labels[argmax([ll for ll, _ in score_pairs(scorer, pairs)])]


def loglik_questions(scorer: Scorer, task: str, records: list[dict]) -> list[ScoredQuestion]:
    """The task's records as the log-likelihood form scores them."""
    out = []
    for rec in records:
        ctx = scorer.encode(prompt_of(rec["instruction"], rec["input"]), True)
        labels, pairs = loglik_pairs(scorer, task, rec, ctx)
        if rec["answer"] not in labels:  # eval counts it wrong whatever the model does; it has no answer to score
            raise UserError(f"{task} line {rec['line']}: answer {rec['answer']!r} is not among the labels the "
                            f"question offers ({'/'.join(labels)})")
        out.append(ScoredQuestion.of(scorer, pairs, labels.index(rec["answer"])))
    return out


def evaluate_task(scorer: Scorer, task: str, path: Path, max_new_tokens: int = 32) -> dict:
    """{'n', 'generation', 'loglik', 'outputs'}: both accuracies and each generated answer."""
    records = read_task(task, path)
    right = {form: 0 for form in FORMS}
    outputs = []
    for rec in records:
        ctx = scorer.encode(prompt_of(rec["instruction"], rec["input"]), True)
        text = scorer.decode(generate(scorer, ctx, max_new_tokens))
        outputs.append(text)
        right["generation"] += extract_answer(task, text) == rec["answer"]
        right["loglik"] += loglik_pick(scorer, task, rec, ctx) == rec["answer"]
    return {"n": len(records), **{f: right[f] / len(records) for f in FORMS}, "outputs": outputs}


def evaluate_models(models: list[str], root: str | Path | None, device: str = "auto", max_new_tokens: int = 32,
                    log=print, mmlu: str | Path | None = None, shots: int = 0, progress: bool = False) -> dict:
    """{model: {task: evaluate_task(...)}} for every model and every task present under root, and with `mmlu`
    (an MMLU directory, depthlab.eval.mmlu) {model: {"mmlu": evaluate_mmlu(...)}} too (`progress`: a bar of each
    model's tasks on a terminal)."""
    from depthlab.eval.mmlu import evaluate_mmlu, read_mmlu
    from depthlab.eval.multiple_choice import load_scorer
    from depthlab.progress import progress_bar

    files = task_files(root) if root is not None else {}
    subjects = read_mmlu(mmlu) if mmlu is not None else None  # every input is read before the first model
    results = {}
    for model in models:
        scorer = load_scorer(model, device)
        results[model] = {}
        with progress_bar(total=len(files) + (subjects is not None), enabled=progress, desc=str(model),
                          unit="task") as bar:
            for task, path in files.items():
                res = results[model][task] = evaluate_task(scorer, task, path, max_new_tokens)
                log(f"{model} {task}: {res['n']} questions  generation {res['generation']:.4f}  "
                    f"log-likelihood {res['loglik']:.4f}")
                bar.update(1)
            if subjects is not None:
                res = results[model]["mmlu"] = evaluate_mmlu(scorer, subjects, shots)
                log(f"{model} mmlu ({shots}-shot): {res['n']} questions in {len(res['subjects'])} subjects  micro "
                    f"{res['micro']:.4f}  macro {res['macro']:.4f}")
                bar.update(1)
    return results


# The paper's downstream table, in its column order; MMLU is scored by log-likelihood (lm-eval's task), the other
# columns by the form of the table.
PAPER = ("mmlu", "boolq", "ARC-Easy", "piqa", "hellaswag", "openbookqa", "winogrande")


def paper_table(results: dict, form: str) -> list[list[str]]:
    """Rows of the paper's table (MMLU's micro average, then its six commonsense columns, average), in %."""
    def acc(res: dict, col: str) -> float | None:
        if col == "mmlu":
            return res["mmlu"]["micro"] if "mmlu" in res else None
        return res[col][form] if col in res else None

    cols = [c for c in PAPER if any(acc(r, c) is not None for r in results.values())]
    rows = [["Model", *("MMLU" if c == "mmlu" else TASKS[c][0] for c in cols), "Avg."]]
    for model, res in results.items():
        accs = [acc(res, c) for c in cols]
        given = [100 * a for a in accs if a is not None]
        rows.append([model, *("-" if a is None else f"{100 * a:.1f}" for a in accs),
                     f"{sum(given) / len(given):.1f}" if given else "-"])
    return rows


def table(results: dict, form: str) -> list[list[str]]:
    """Rows of the Table-2-style table (model, one column per task present, average), accuracies in %."""
    tasks = [t for t in TASKS if any(t in r for r in results.values())]
    rows = [["Model", *(TASKS[t][0] for t in tasks), "Avg."]]
    for model, res in results.items():
        accs = [100 * res[t][form] for t in tasks if t in res]
        cells = [f"{100 * res[t][form]:.1f}" if t in res else "-" for t in tasks]
        rows.append([model, *cells, f"{sum(accs) / len(accs):.1f}"])
    return rows


def _markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines) + "\n"


FORM_TITLES = {"generation": "greedy generation + answer extraction (the paper's)", "loglik": "log-likelihood"}


def has_tasks(results: dict) -> bool:
    return any(t in r for r in results.values() for t in TASKS)


def markdown(results: dict) -> str:
    parts = []
    if has_tasks(results):
        for form in FORMS:
            parts.append(f"### Accuracy (%), {FORM_TITLES[form]}\n\n" + _markdown_table(table(results, form)))
    mmlu = next((r["mmlu"] for r in results.values() if "mmlu" in r), None)
    if mmlu is not None:
        for form in FORMS if has_tasks(results) else FORMS[:1]:
            scoring = f"the other columns by {FORM_TITLES[form]}" if has_tasks(results) else "no other columns"
            parts.append(f"### The paper's table (%): MMLU by log-likelihood ({mmlu['shots']}-shot, micro average "
                         f"over {mmlu['n']} questions), {scoring}\n\n" + _markdown_table(paper_table(results, form)))
    return "\n".join(parts)


def is_table(path: Path) -> bool:
    """PREFIX.md or PREFIX.json written by write_tables: the JSON half holds its tables and results."""
    from depthlab.paths import read_json

    d = read_json(path.with_suffix(".json"))
    return isinstance(d, dict) and d.get("written_by") == TABLE_MARK and path.suffix in (".md", ".json")


def table_paths(prefix: str | Path) -> tuple[Path, Path]:
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".json")


def _numbers(rows: list[list[str]]) -> dict:
    header, *body = rows
    return {r[0]: {h: None if c == "-" else float(c) for h, c in zip(header[1:], r[1:])} for r in body}


def write_tables(results: dict, md: Path, js: Path) -> None:
    """The .md file (every table) and the .json file (every number and generated answer)."""
    summary = {form: _numbers(table(results, form)) for form in FORMS} if has_tasks(results) else {}
    if any("mmlu" in r for r in results.values()):
        summary.update({f"paper_{form}": _numbers(paper_table(results, form))
                        for form in (FORMS if has_tasks(results) else FORMS[:1])})
    md.write_text(markdown(results))
    js.write_text(json.dumps({"written_by": TABLE_MARK, "tables": summary, "results": results}, indent=2) + "\n")
