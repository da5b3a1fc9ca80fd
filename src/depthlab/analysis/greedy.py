"""Greedy block removal (SLEB's procedure): take out the block whose removal costs least, score every remaining block
again on the model without it, and repeat K times; beside each step, the one-shot choice at the same k (the k
blocks whose removal alone costs least, taken out at once), scored on the same windows or questions.

A removal is ranked as `depthlab analyze` ranks it (depthlab.analysis.tasks.usefulness_orders): by the loss on the
calibration windows, by the task answers lost (ties by their log-likelihood), or by the generation tasks' answers
lost (ties by block order). Nothing is rebuilt: each step traces every window (or question) once, runs the model
without the blocks already removed, and replays each candidate from the cached input of its block, as the
single-layer sweep replays from the model's own stream; generation decodes each candidate from the model's own
record of each question, as `analyze --removal-generate` does (depthlab.eval.generate).
"""

from __future__ import annotations

import torch

from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.removal import BASE, Plan, RemovalSums, through_block
from depthlab.analysis.tasks import TaskSums, answer_logits, question_mask, usefulness_orders

GREEDY_BY = ("loss", "tasks", "generate")  # what greedy removal ranks by


def key_of(removed: frozenset) -> tuple:
    """The results key of the model without `removed` (the model itself: BASE's)."""
    return ("without", *sorted(removed)) if removed else BASE.key


def states_without(lm: LayeredLM, tr, removed: frozenset) -> list[torch.Tensor]:
    """The stream entering each block, and after the last, of the model without `removed`, from a trace of the
    model's own (the states before the first removed block are the traced ones)."""
    plan = Plan(key_of(removed), removed)
    first = lm.n_layers if plan.first is None else plan.first
    states = list(tr.hidden[:first + 1])
    for j in range(first, lm.n_layers):
        states.append(through_block(lm, j, j, plan, states[-1], tr.calls[j]))
    return states


class Scorer:
    """Scores models without some blocks on its units, (inputs, mask, observe(key, last state)): the calibration
    batches or the task questions. `scored` holds the keys already scored (each is added to the sums once)."""

    by: str

    def __init__(self, lm: LayeredLM, units: list[tuple]):
        self.lm, self.units, self.scored = lm, units, set()

    @torch.no_grad()
    def score(self, removed: frozenset, candidates: list[int | None]) -> None:
        """Score the model without `removed` and one more block, for each candidate (None: without no more)."""
        L = self.lm.n_layers
        plans = [(L if b is None else b, Plan(key_of(w), w))
                 for b in candidates for w in [removed if b is None else removed | {b}]
                 if key_of(w) not in self.scored]
        if not plans:
            return
        for inputs, mask, observe in self.units:
            tr = self.lm.trace(inputs, mask)
            states = states_without(self.lm, tr, removed)
            for start, plan in plans:
                h = states[start]
                for j in range(start, L):
                    h = through_block(self.lm, j, j, plan, h, tr.calls[j])
                observe(plan.key, h)
        self.scored |= {plan.key for _, plan in plans}

    def order(self, options: dict[int, frozenset]) -> list[int]:
        """The blocks of `options` ({block: the blocks removed with it}), from the cheapest removal up."""
        raise NotImplementedError

    def metrics(self, removed: frozenset) -> dict:
        """What the model without `removed` scores."""
        raise NotImplementedError


class LossScorer(Scorer):
    by = "loss"

    def __init__(self, lm: LayeredLM, batches: list):
        self.sums = RemovalSums(lm.n_layers)
        super().__init__(lm, [(b.inputs, b.mask, lambda key, h, b=b: self.sums.add(key, lm.logits(h), b))
                              for b in batches])

    def order(self, options: dict[int, frozenset]) -> list[int]:
        single = [{"block": b + 1, **self.sums.row(key_of(r))} for b, r in options.items()]
        return [b - 1 for b in usefulness_orders({"single": single}, None)["loss"]]

    def metrics(self, removed: frozenset) -> dict:
        return self.sums.row(key_of(removed))


class TaskScorer(Scorer):
    by = "tasks"

    def __init__(self, lm: LayeredLM, questions: dict[str, list]):
        self.sums = TaskSums()
        super().__init__(lm, [(q.ids, question_mask(q), lambda key, h, t=t, q=q: self.sums.add(
            t, key, q, answer_logits(lm, q, h))) for t, qs in questions.items() for q in qs])

    def order(self, options: dict[int, frozenset]) -> list[int]:
        # generation's rows have no log-likelihood to break ties with: block order does
        tasks = {t: {"n": len(self.sums.right[t, BASE.key]),
                     "single": [{"block": b + 1, "ll_drop": 0.0, **self.sums.row(t, key_of(r))}
                                for b, r in options.items()]}
                 for t in self.sums.tasks}
        return [b - 1 for b in usefulness_orders(None, {"tasks": tasks})["tasks"]]

    def metrics(self, removed: frozenset) -> dict:
        rows = {t: self.sums.row(t, key_of(removed)) for t in self.sums.tasks}
        n = sum(len(self.sums.right[t, BASE.key]) for t in rows)
        right = sum(sum(self.sums.right[t, key_of(removed)]) for t in rows)
        keep = ("acc", "acc_ci", "acc_drop", "drop_ci", "drop_p", "ll", "ll_drop")
        return {"acc": right / n, "questions": n, "tasks": {t: {k: r[k] for k in keep if k in r}
                                                            for t, r in rows.items()}}


class GenerationScorer(TaskScorer):
    """By exact match of greedy generation (depthlab.eval.generate): each removal scored in one pass from the
    model's own record of each question, as `analyze --removal-generate` scores it."""

    by = "generate"

    def __init__(self, lm: LayeredLM, questions: dict[str, list]):
        super().__init__(lm, {})
        self.questions = questions

    def score(self, removed: frozenset, candidates: list[int | None]) -> None:
        from depthlab.eval.generate import Removal, eos_of, generation_sweep

        wanted = {key_of(w): w for b in candidates for w in [removed if b is None else removed | {b}]}
        wanted = {key: w for key, w in wanted.items() if key not in self.scored}
        if not wanted:
            return
        removals = {key: Removal(w) for key, w in wanted.items() if w}
        for task, qs in self.questions.items():
            base, outcomes = generation_sweep(self.lm.model, qs, removals, eos_of(self.lm.model))
            for key, right in [(BASE.key, base), *outcomes.items()]:
                for ok in right if key in wanted else ():
                    self.sums.record(task, key, ok)
        self.scored |= set(wanted)


def greedy_removal(scorer: Scorer, k: int) -> dict:
    """Remove k blocks greedily, each step re-scoring every remaining block; beside each step the one-shot choice
    (the first k of the single-removal ranking) at the same k. Blocks are counted from 1 in the record."""
    L = scorer.lm.n_layers
    scorer.score(frozenset(), [None, *range(L)])
    ranking = scorer.order({b: frozenset({b}) for b in range(L)})
    removed, steps = frozenset(), []
    for step in range(1, k + 1):
        rest = [b for b in range(L) if b not in removed]
        scorer.score(removed, rest)  # the first step's are scored already
        removed |= {scorer.order({b: removed | {b} for b in rest})[0]}
        one_shot = frozenset(ranking[:step])
        scorer.score(one_shot - {ranking[step - 1]}, [ranking[step - 1]])  # nothing when greedy scored it
        steps.append({"k": step, "greedy": {"blocks": blocks(removed), **scorer.metrics(removed)},
                      "one_shot": {"blocks": blocks(one_shot), **scorer.metrics(one_shot)}})
    return {"by": scorer.by, "k": k, "n_blocks": L, "base": scorer.metrics(frozenset()),
            "one_shot_order": [b + 1 for b in ranking], "removed": blocks(removed), "steps": steps}


def blocks(removed: frozenset) -> list[int]:
    return [b + 1 for b in sorted(removed)]
