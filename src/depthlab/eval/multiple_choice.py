"""Zero-shot multiple choice by log-likelihood, on local JSONL task files, for depthlab checkpoints and HF models,
with lm-evaluation-harness's semantics (lm_eval 0.4: api/task.py, api/model.py, models/huggingface.py).

Task format: one JSON object per line,

    {"question": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "answer": 0}

`answer` is the 0-based index of the correct choice. As lm-eval's `multiple_choice` output type does with
`doc_to_text: question`, `doc_to_choice: choices`, `doc_to_target: answer`:

- each choice is the request (context = question, continuation = " " + choice): the target delimiter " " is
  always inserted, whatever whitespace the question ends or the choice starts with;
- the context's trailing whitespace is moved to the front of the continuation, the pair is encoded as a whole
  and split after the context's tokens (so the continuation's tokens are those of the joint text); an empty
  question is replaced by the prefix token (BOS, or EOS where the tokenizer has no BOS);
- texts are encoded with the start token: for depthlab checkpoints the document separator (<|endoftext|>), the
  token that precedes every training document; a depthlab export's tokenizer adds the same through its
  post-processor, so lm-eval's `hf` backend and transformers pipelines see it by default; any other HF tokenizer
  adds what it adds by default (add_special_tokens=True), which is what lm-eval's `hf` backend does;
- the score is the summed log-probability of the continuation's tokens, the input left-truncated to the context;
- `acc`: argmax of the sums; `acc_norm`: argmax of sum / len(choice) in characters (the choice text alone, without
  the delimiter); `acc_bytes`: argmax of sum / its UTF-8 bytes. Ties go to the first choice (numpy's argmax).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.jsonl import json_line

DELIMITER = " "  # lm-eval's default target_delimiter
METRICS = ("acc", "acc_norm", "acc_bytes")


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
        d = json_line(line, where)
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
    encode: Callable[[str, bool], list[int]]  # text, with the tokenizer's special tokens? -> ids
    decode: Callable[[list[int]], str]
    prefix_id: int | None  # the context of an empty question (lm-eval's prefix_token_id: BOS, else EOS)
    eot_id: int | None  # end of text (ends generation)
    max_len: int
    device: torch.device


def start_token(tok) -> int | None:
    """The token a depthlab model sees before every document (the packer's separator, data.tokens.pack)."""
    from depthlab.data.tokenizer import eot_id

    try:
        return eot_id(tok)
    except UserError:
        return None


def scorer_for(loaded) -> Scorer:
    """A scorer for a model loaded by depthlab.loading.load_model (a depthlab checkpoint or an HF model)."""
    if loaded.cfg is not None and loaded.cfg.model.is_vit:
        raise UserError(f"scoring text needs a language model, and {loaded.path} is a ViT (an image classifier)")
    device = loaded.device or next(loaded.model.parameters()).device  # a placed model's: its main device
    if loaded.cfg is not None:
        return _scorer(loaded.model.eval(), loaded.fast_tokenizer(), True, loaded.context, device)
    model = loaded.model
    return _scorer(lambda x: model(x).logits, loaded.tokenizer, False, loaded.context, device)


def _scorer(logits, tok, own: bool, context: int, device) -> Scorer:
    """`own`: a depthlab tokenizer, whose document separator goes in front, as before every training document;
    else a transformers tokenizer, which adds what it adds by default."""
    if own:
        eot = start_token(tok)
        start = [] if eot is None else [eot]

        def encode(s: str, special: bool = True) -> list[int]:
            return (start if special else []) + tok.encode(s, add_special_tokens=False).ids

        return Scorer(logits, encode, tok.decode, eot, eot, context, device)
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    return Scorer(logits, lambda s, special=True: tok(s, add_special_tokens=special).input_ids, tok.decode, prefix,
                  tok.eos_token_id, context, device)


def text_scorer(path: str | Path, trust_remote_code: bool = False) -> Scorer:
    """The tokenizing half of `scorer_for`, from a model path without loading its weights (no logits): how
    `analyze --removal-tasks` encodes the questions of a model it streams block by block."""
    from depthlab.checkpoint import CONFIG, TOKENIZER
    from depthlab.config import Config
    from depthlab.loading import hf_context, load_hf_tokenizer
    from depthlab.paths import Kind, model_path

    kind, p = model_path(path)
    if kind is Kind.HF:
        import transformers

        config = transformers.AutoConfig.from_pretrained(str(p), trust_remote_code=trust_remote_code)
        return _scorer(None, load_hf_tokenizer(p, trust_remote_code), False, hf_context(config), torch.device("cpu"))
    from depthlab.data.tokenizer import load_tokenizer

    cfg = Config.load(p / CONFIG)
    if cfg.model.is_vit:
        raise UserError(f"scoring text needs a language model, and {path} is a ViT (an image classifier)")
    if not (p / TOKENIZER).is_file():
        raise UserError(f"{p} has no {TOKENIZER}")
    return _scorer(None, load_tokenizer(p / TOKENIZER), True, cfg.model.max_seq_len, torch.device("cpu"))


def load_scorer(path: str | Path, device: str = "auto") -> Scorer:
    """A scorer for any model path: a depthlab checkpoint or run, or a Hugging Face model directory."""
    from depthlab.device import resolve_device
    from depthlab.loading import load_model

    return scorer_for(load_model(path, device=str(resolve_device(device))))


def encode_pair(scorer: Scorer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM.loglikelihood / _encode_pair for a causal model: (context ids, continuation ids)."""
    if not context:
        cont = scorer.encode(continuation, False)
        if scorer.prefix_id is None:
            raise UserError("cannot score an empty question: the tokenizer has no start or end token")
        return (cont[:1], cont[1:]) if cont and cont[0] == scorer.prefix_id else ([scorer.prefix_id], cont)
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = scorer.encode(context + continuation, True)
    ctx = scorer.encode(context, True)
    return ctx, whole[len(ctx):]


def padded_inputs(scorer: Scorer, pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, list]:
    """(ids (len(pairs), T), each row's input): context + continuation without its last token, left-truncated
    to the model's context as lm-eval does, right-padded (causal attention never lets real tokens see a pad)."""
    inps = []
    for ctx, cont in pairs:
        if not ctx or not cont or len(cont) > scorer.max_len:
            why = "no context tokens" if not ctx else "no tokens" if not cont else "more tokens than the context"
            raise UserError(f"cannot score continuation {scorer.decode(cont)[:40]!r}: it has {why}")
        inps.append((ctx + cont)[-(scorer.max_len + 1):][:-1])
    x = torch.zeros(len(inps), max(map(len, inps)), dtype=torch.long)
    for i, inp in enumerate(inps):
        x[i, :len(inp)] = torch.tensor(inp)
    return x, inps


@torch.no_grad()
def pair_scores(logits: torch.Tensor, inps: list, pairs: list, offset: int = 0) -> list[tuple[float, bool]]:
    """(summed log-probability of the continuation, whether it is the greedy one) of each pair, read from the
    logits of `padded_inputs` from position `offset` on."""
    out = []
    for i, (inp, (_, cont)) in enumerate(zip(inps, pairs)):
        # only the positions that predict the continuation's tokens: a float copy of all the logits of a long
        # few-shot context over a large vocabulary is hundreds of MB
        rows = torch.log_softmax(logits[i, len(inp) - len(cont) - offset:len(inp) - offset].float(), dim=-1).cpu()
        target = torch.tensor(cont)
        out.append((rows[torch.arange(len(cont)), target].sum().item(), bool((rows.argmax(-1) == target).all())))
    return out


@torch.no_grad()
def score_pairs(scorer: Scorer, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
    """(summed log-probability of the continuation, whether it is the greedy one) for each (context, continuation)
    pair, in one right-padded batch."""
    x, inps = padded_inputs(scorer, pairs)
    return pair_scores(scorer.logits(x.to(scorer.device)), inps, pairs)


def requests(question: str, choices: list[str]) -> list[tuple[str, str]]:
    """lm-eval's (context, continuation) requests of a zero-shot question."""
    return [(question, DELIMITER + c) for c in choices]


def choice_pairs(scorer: Scorer, question: str, choices: list[str]) -> list[tuple[list[int], list[int]]]:
    """The (context ids, continuation ids) request of each choice of a zero-shot question."""
    pairs = []
    for context, cont in requests(question, choices):
        try:
            pairs.append(encode_pair(scorer, context, cont))
        except UserError as e:
            raise UserError(f"cannot score question {question[:40]!r}: {e}") from None
    for choice, (_, cont) in zip(choices, pairs):
        if not cont:
            raise UserError(f"cannot score question {question[:40]!r}: choice {choice!r} encodes to no tokens")
    return pairs


def choice_logprobs(scorer: Scorer, question: str, choices: list[str]) -> list[float]:
    """Summed log-probability of each choice's tokens given the question, all choices in one padded batch."""
    return [ll for ll, _ in score_pairs(scorer, choice_pairs(scorer, question, choices))]


@dataclass
class ScoredQuestion:
    """One question as the requests `eval` scores (its choices' (context, continuation) pairs in one right-padded
    batch) and its answer: what `analyze --removal-tasks` replays with blocks removed."""

    ids: torch.Tensor  # (choices, T), from padded_inputs
    inps: list
    pairs: list
    answer: int

    @classmethod
    def of(cls, scorer: Scorer, pairs: list, answer: int) -> ScoredQuestion:
        return cls(*padded_inputs(scorer, pairs), pairs, answer)

    @property
    def first(self) -> int:
        """The first position whose logits are read: the earliest that predicts a continuation token."""
        return min(len(inp) - len(cont) for inp, (_, cont) in zip(self.inps, self.pairs))

    def outcome(self, logits: torch.Tensor) -> tuple[bool, float]:
        """From the logits of ids[:, first:]: whether the highest summed log-likelihood is the answer's (`acc`), and
        the answer's log-likelihood."""
        lls = [ll for ll, _ in pair_scores(logits, self.inps, self.pairs, self.first)]
        return argmax(lls) == self.answer, lls[self.answer]


def task_questions(scorer: Scorer, questions: list[Question], limit: int | None = None) -> list[ScoredQuestion]:
    return [ScoredQuestion.of(scorer, choice_pairs(scorer, q.question, q.choices), q.answer) for q in questions[:limit]]


def argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)  # the first of equal maxima, as numpy.argmax


def picks(lls: list[float], choices: list[str]) -> dict[str, int]:
    """The choice each metric picks: acc (sum), acc_norm (sum / characters), acc_bytes (sum / UTF-8 bytes)."""
    return {"acc": argmax(lls), "acc_norm": argmax([s / float(len(c)) for s, c in zip(lls, choices)]),
            "acc_bytes": argmax([s / float(len(c.encode("utf-8"))) for s, c in zip(lls, choices)])}


def evaluate_tasks(model: str | Path | Scorer, tasks: str | Path, device: str = "auto", progress: bool = False) -> dict:
    """{'n', 'acc', 'acc_norm', 'acc_bytes', 'scores', 'picks'} over the task file: the metrics, each question's
    per-choice log-likelihoods and each metric's pick (`progress`: a bar of its questions on a terminal)."""
    from depthlab.progress import progress_bar

    scorer = model if isinstance(model, Scorer) else load_scorer(model, device)
    questions = read_tasks(tasks)
    scores, chosen = [], []
    for q in progress_bar(questions, enabled=progress, desc=Path(tasks).name, unit="question"):
        scores.append(choice_logprobs(scorer, q.question, q.choices))
        chosen.append(picks(scores[-1], q.choices))
    n = len(questions)
    metrics = {m: sum(p[m] == q.answer for p, q in zip(chosen, questions)) / n for m in METRICS}
    return {"n": n, **metrics, "scores": scores, "picks": chosen}
