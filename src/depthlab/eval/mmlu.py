"""MMLU (Hendrycks et al. 2021) from local files, scored as lm-evaluation-harness's `mmlu` task (lm_eval 0.4,
tasks/mmlu/default): the first column of the LNS paper's downstream table.

Two layouts people have on disk, one file per subject and split:
- the `cais/mmlu` parquet layout: DIR/<subject>/test-*.parquet and dev-*.parquet, columns question, choices (four
  strings), answer (0-3);
- the original CSV release: DIR/test/<subject>_test.csv and DIR/dev/<subject>_dev.csv, no header, columns
  question, A, B, C, D, answer letter.

Each test question is a four-way log-likelihood choice (depthlab.eval.multiple_choice) with lm-eval's prompt:

    The following are multiple choice questions (with answers) about {subject}.\\n\\n
    [k examples of the subject's dev split in file order, each "{prompt} {letter}", joined by "\\n\\n", then "\\n\\n"]
    {question.strip()}\\nA. {choice 0}\\nB. {choice 1}\\nC. {choice 2}\\nD. {choice 3}\\nAnswer:

and the continuations " A", " B", " C", " D" (lm-eval's default target delimiter). `acc` is the argmax of the summed
log-probabilities. Averages: micro (every question counts once, lm-eval's `mmlu` group, weight_by_size) and macro
(the mean of the subjects' accuracies).
"""

from __future__ import annotations

import csv
from pathlib import Path

from depthlab import UserError
from depthlab.eval.multiple_choice import Question, ScoredQuestion, Scorer, argmax, choice_logprobs, choice_pairs

LETTERS = ("A", "B", "C", "D")
SPLITS = ("test", "dev")


def prompt(q: Question) -> str:
    """lm-eval's doc_to_text."""
    return q.question.strip() + "".join(f"\n{letter}. {c}" for letter, c in zip(LETTERS, q.choices)) + "\nAnswer:"


def description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def context(subject: str, q: Question, shots: list[Question]) -> str:
    """The whole context of one test question: description, the few-shot examples, the question."""
    examples = "".join(f"{prompt(s)} {LETTERS[s.answer]}\n\n" for s in shots)
    return description(subject) + examples + prompt(q)


def _question(question, choices, answer, where: str) -> Question:
    if not isinstance(question, str) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
        raise UserError(f"{where}: an MMLU question needs a string question and four string choices")
    if isinstance(answer, str) and answer.strip() in LETTERS:
        answer = LETTERS.index(answer.strip())
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < 4:
        raise UserError(f"{where}: the answer must be 0-3 or A-D, got {answer!r}")
    return Question(question, [str(c) for c in choices], answer)


def _read_parquet(files: list[Path]) -> list[Question]:
    import pyarrow.parquet as pq

    out = []
    for f in files:
        try:
            rows = pq.read_table(f).to_pylist()
        except Exception as e:  # pyarrow raises many kinds for a bad file
            raise UserError(f"cannot read {f}: {e}") from None
        for i, r in enumerate(rows):
            if not {"question", "choices", "answer"} <= set(r):
                raise UserError(f"{f}: expected columns question, choices, answer; it has {sorted(r)}")
            out.append(_question(r["question"], list(r["choices"] or []), r["answer"], f"{f} row {i}"))
    return out


def _read_csv(f: Path) -> list[Question]:
    try:
        with open(f, newline="", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark (Excel) is not text
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"cannot read {f}: {e}") from None
    out = []
    for i, r in enumerate(rows, 1):
        if len(r) != 6:
            raise UserError(f"{f}:{i}: expected 6 columns (question, A, B, C, D, answer), got {len(r)}")
        out.append(_question(r[0], r[1:5], r[5], f"{f}:{i}"))
    return out


def read_mmlu(root: str | Path) -> dict[str, dict[str, list[Question]]]:
    """{subject: {"test": [...], "dev": [...]}} for every subject with a test file, in either layout."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"--mmlu {root}: not a directory (expected SUBJECT/test-*.parquet or test/SUBJECT_test.csv)")
    csvs = sorted((root / "test").glob("*_test.csv"))
    parquets = {d: sorted(d.glob("test-*.parquet")) for d in sorted(root.iterdir()) if d.is_dir() and d.name != "all"}
    parquets = {d: files for d, files in parquets.items() if files}
    if csvs and parquets:  # which one is meant? reading either would silently drop the other's subjects
        raise UserError(f"--mmlu {root} holds both layouts, {len(csvs)} test/SUBJECT_test.csv and {len(parquets)} "
                        "SUBJECT/test-*.parquet subjects: keep one of them there")
    subjects: dict[str, dict[str, list[Question]]] = {}
    for f in csvs:  # the CSV release
        name = f.name[:-len("_test.csv")]
        dev = root / "dev" / f"{name}_dev.csv"
        subjects[name] = {"test": _read_csv(f), "dev": _read_csv(dev) if dev.is_file() else [], "file": f}
    for d, tests in parquets.items():
        subjects[d.name] = {"test": _read_parquet(tests), "dev": _read_parquet(sorted(d.glob("dev-*.parquet"))),
                            "file": tests[0] if len(tests) == 1 else d}
    if not subjects:
        raise UserError(f"--mmlu {root}: no subject with test questions (SUBJECT/test-*.parquet as in cais/mmlu, "
                        "or test/SUBJECT_test.csv as in the original release)")
    for name, splits in subjects.items():  # a subject left out would change the macro average unseen
        where = splits.pop("file")
        if not splits["test"]:
            raise UserError(f"MMLU subject {name}: {where} holds no test questions; fix or remove it (the averages "
                            "are over the subjects present)")
    return subjects


def shot_examples(subject: str, splits: dict, shots: int) -> list[Question]:
    """The first `shots` dev questions of the subject, in file order (lm-eval's few-shot examples)."""
    if shots < 0:
        raise UserError(f"--mmlu-shots must be >= 0, got {shots}")
    if len(splits["dev"]) < shots:
        raise UserError(f"MMLU subject {subject}: {shots}-shot needs {shots} dev questions, it has "
                        f"{len(splits['dev'])}")
    return splits["dev"][:shots]


def mmlu_questions(scorer: Scorer, subjects: dict, shots: int = 0, limit: int | None = None) -> list[ScoredQuestion]:
    """Every subject's test questions (at most `limit` of each) as evaluate_mmlu scores them."""
    out = []
    for subject, splits in subjects.items():
        examples = shot_examples(subject, splits, shots)
        out += [ScoredQuestion.of(scorer, choice_pairs(scorer, context(subject, q, examples), list(LETTERS)), q.answer)
                for q in splits["test"][:limit]]
    return out


def evaluate_mmlu(scorer: Scorer, subjects: dict, shots: int = 0) -> dict:
    """{'subjects': {s: {'n', 'acc', 'scores', 'picks'}}, 'micro', 'macro', 'n', 'shots'}."""
    per = {}
    for subject, splits in subjects.items():
        examples = shot_examples(subject, splits, shots)
        scores = [choice_logprobs(scorer, context(subject, q, examples), list(LETTERS)) for q in splits["test"]]
        picked = [argmax(s) for s in scores]
        right = sum(p == q.answer for p, q in zip(picked, splits["test"]))
        per[subject] = {"n": len(picked), "acc": right / len(picked), "scores": scores, "picks": picked}
    n = sum(r["n"] for r in per.values())
    return {"subjects": per, "n": n, "shots": shots, "micro": sum(r["acc"] * r["n"] for r in per.values()) / n,
            "macro": sum(r["acc"] for r in per.values()) / len(per)}
