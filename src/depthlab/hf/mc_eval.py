"""Zero-shot multiple choice by log-likelihood, on local JSONL task files, for depthlab checkpoints and HF models.

Task format: one JSON object per line,

    {"question": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "answer": 0}

`answer` is the 0-based index of the correct choice. Each choice is scored as the summed log-probability of its
tokens after the question, log P(" " + choice | question) (a space is inserted unless the question is empty or
ends in whitespace, or the choice starts with it), with the tokenizer's start token in front (<|endoftext|> for
depthlab models, BOS for HF models that have one). `acc` takes the highest sum; `acc_norm` the highest sum divided
by the choice's length in UTF-8 bytes (lm-evaluation-harness's acc_norm), which removes the bias toward short
choices. Ties go to the first choice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from depthlab import UserError


@dataclass
class Question:
    question: str
    choices: list[str]
    answer: int


def read_tasks(path: str | Path) -> list[Question]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read task file {path}: {e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            d = json.loads(line)
        except ValueError as e:
            raise UserError(f"{where}: not JSON ({e})") from None
        if not isinstance(d, dict) or not isinstance(d.get("question"), str):
            raise UserError(f"{where}: expected an object with a string 'question', 'choices' and 'answer'")
        choices, answer = d.get("choices"), d.get("answer")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise UserError(f"{where}: 'choices' must be a list of at least two non-empty strings")
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
            raise UserError(f"{where}: 'answer' must be a 0-based index into choices (0..{len(choices) - 1})")
        out.append(Question(d["question"], choices, answer))
    if not out:
        raise UserError(f"task file {path} holds no questions")
    return out


@dataclass
class Scorer:
    """A causal LM reduced to what scoring needs."""

    logits: Callable[[torch.Tensor], torch.Tensor]  # (B, T) ids -> (B, T, V)
    encode: Callable[[str], list[int]]
    prefix: list[int]  # start token(s) put before every question
    max_len: int
    device: torch.device


def scorer_for(loaded) -> Scorer:
    """A scorer for a model loaded by depthlab.rundir.load_model (a depthlab checkpoint or an HF model)."""
    device = next(loaded.model.parameters()).device
    if loaded.cfg is not None:  # depthlab: our BPE, <|endoftext|> in front
        from depthlab.data.tokenizer import EOT

        tok = loaded.fast_tokenizer()
        eot = tok.token_to_id(EOT)
        return Scorer(loaded.model.eval(), lambda s: tok.encode(s).ids, [] if eot is None else [eot],
                      loaded.context, device)
    tok = loaded.tokenizer
    prefix = [] if tok.bos_token_id is None else [tok.bos_token_id]
    model = loaded.model
    return Scorer(lambda x: model(x).logits, lambda s: tok(s, add_special_tokens=False).input_ids, prefix,
                  loaded.context, device)


def load_scorer(path: str | Path, device: str = "auto") -> Scorer:
    """A scorer for any model path: a depthlab checkpoint or run, or a Hugging Face model directory."""
    from depthlab.rundir import load_model
    from depthlab.train.trainer import resolve_device

    return scorer_for(load_model(path, device=str(resolve_device(device))))


def continuation(question: str, choice: str) -> str:
    if not question or question[-1].isspace() or choice[0].isspace():
        return choice
    return " " + choice


@torch.no_grad()
def choice_logprobs(scorer: Scorer, question: str, choices: list[str]) -> list[float]:
    """Summed log-probability of each choice's tokens given the question, all choices in one padded batch."""
    context = scorer.prefix + scorer.encode(question)
    conts = [scorer.encode(continuation(question, c)) for c in choices]
    seqs = []
    for choice, cont in zip(choices, conts):
        keep = scorer.max_len + 1 - len(cont)  # truncate the question from the left if needed
        problem = ("empty question and the tokenizer has no start token" if not context else
                   f"choice {choice!r} encodes to no tokens" if not cont else
                   f"choice {choice[:40]!r} is longer than the model's context" if keep < 1 else None)
        if problem:
            raise UserError(f"cannot score question {question[:40]!r}: {problem}")
        seqs.append(context[-keep:] + cont)
    width = max(map(len, seqs)) - 1
    x = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):  # right padding: causal attention never lets real tokens see it
        x[i, :len(s) - 1] = torch.tensor(s[:-1])
    logp = torch.log_softmax(scorer.logits(x.to(scorer.device)).float(), dim=-1).cpu()
    out = []
    for i, (s, cont) in enumerate(zip(seqs, conts)):
        pos = torch.arange(len(s) - 1 - len(cont), len(s) - 1)  # the positions that predict the choice's tokens
        out.append(logp[i, pos, torch.tensor(cont)].sum().item())
    return out


def evaluate_tasks(model: str | Path | Scorer, tasks: str | Path, device: str = "auto") -> dict:
    """{'n', 'acc', 'acc_norm', 'scores'}: accuracy and byte-length-normalised accuracy over the task file."""
    scorer = model if isinstance(model, Scorer) else load_scorer(model, device)
    questions = read_tasks(tasks)
    hits = hits_norm = 0
    scores = []
    for q in questions:
        lp = choice_logprobs(scorer, q.question, q.choices)
        lengths = [len(continuation(q.question, c).encode()) for c in q.choices]
        norm = [s / n for s, n in zip(lp, lengths)]
        hits += max(range(len(lp)), key=lp.__getitem__) == q.answer
        hits_norm += max(range(len(norm)), key=norm.__getitem__) == q.answer
        scores.append(lp)
    n = len(questions)
    return {"n": n, "acc": hits / n, "acc_norm": hits_norm / n, "scores": scores}
