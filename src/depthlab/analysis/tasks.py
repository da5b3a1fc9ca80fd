"""Layer removal scored by multiple-choice tasks, as `eval tasks / mmlu / commonsense` scores them (the
paper's Figure 1 is MMLU accuracy with one layer removed): for each plan (depthlab.analysis.removal), per task, the
accuracy (the choice with the highest summed log-likelihood is the pick) with its 95% Wilson score interval, and
the mean log-likelihood of the correct answer, beside the model's own and the drop.

The questions are depthlab.eval's (TaskSuite, ScoredQuestion: the requests `eval` scores). Each question is traced
as its own batch (its choices, as `eval` scores them), then every plan is replayed from the cached input of the
first block it changes; the head is applied only from the first position whose logits are read (`answer_logits`).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.removal import BASE, Plan, plan_rows, replay_state, single_plans, skipping
from depthlab.eval.multiple_choice import ScoredQuestion
from depthlab.stats import paired_drop, wilson

INTERVAL = ("acc_ci: 95% Wilson score interval of the accuracy (scipy.stats.binomtest(k, n).proportion_ci("
            "method='wilson')); drop_ci: exact 95% interval of the paired drop, conditional on the discordant "
            "questions (Clopper-Pearson, so it excludes 0 exactly when drop_p < 0.05); drop_p: exact McNemar test")


def answer_logits(lm: LayeredLM, q: ScoredQuestion, h: torch.Tensor) -> torch.Tensor:
    """The head applied where the question's answers are read only: the logits of a long few-shot context over a
    large vocabulary, at every position and for every removal, would dwarf the model's activations."""
    return lm.logits(h[:, q.first:])


def question_mask(q: ScoredQuestion) -> torch.Tensor:
    """All ones: the pads are on the right, where causal attention never lets a real token see them, and `eval`
    calls the model without a mask; with one the numbers would be the same up to rounding, not bit for bit."""
    return torch.ones_like(q.ids, dtype=torch.bool)


class TaskSums:
    """Per task and plan key: each question's pick right or wrong, and the log-likelihood of its answer (none for
    generation, scored by exact match), in question order."""

    def __init__(self):
        self.right: dict = defaultdict(list)
        self.ll: dict = defaultdict(list)
        self.tasks: dict[str, None] = {}

    def add(self, task: str, key: tuple, question: ScoredQuestion, logits: torch.Tensor) -> None:
        self.record(task, key, *question.outcome(logits))

    def record(self, task: str, key: tuple, ok: bool, ll: float | None = None) -> None:
        self.tasks[task] = None
        self.right[task, key].append(bool(ok))
        if ll is not None:
            self.ll[task, key].append(ll)

    def row(self, task: str, key: tuple) -> dict:
        """acc and its Wilson interval; acc_drop = the model's accuracy minus it, with the paired interval and test
        of `paired_drop`; ll: the answer's mean log-likelihood, and ll_drop (multiple choice)."""
        right, base = self.right[task, key], self.right[task, BASE.key]
        n, c = len(right), sum(right)
        row = {"acc": c / n, "acc_ci": wilson(c, n), "acc_drop": (sum(base) - c) / n, **paired_drop(base, right)}
        if (task, key) in self.ll:
            ll, base_ll = sum(self.ll[task, key]) / n, sum(self.ll[task, BASE.key]) / n
            row.update(ll=ll, ll_drop=base_ll - ll)
        return row

    def per_question(self, task: str) -> dict:
        """Each question's outcome under the model itself (first) and each single block removed, for the
        bootstrap of the removal profiles (depthlab.analysis.profiles)."""
        keys = [BASE.key, *sorted(k for t, k in self.right if t == task and k[0] == "block")]
        out = {"right": [[int(x) for x in self.right[task, k]] for k in keys]}
        if (task, BASE.key) in self.ll:
            out["ll"] = [self.ll[task, k] for k in keys]
        return out

    def results(self) -> dict:
        out = {}
        for t in self.tasks:
            base = self.row(t, BASE.key)
            keys = [k for (task, k) in self.right if task == t]
            out[t] = {"n": len(self.right[t, BASE.key]), "base_acc": base["acc"], "base_acc_ci": base["acc_ci"],
                      **({"base_ll": base["ll"]} if "ll" in base else {}),
                      **plan_rows(keys, lambda k, t=t: self.row(t, k)), "per_question": self.per_question(t)}
        return {"interval": INTERVAL, "tasks": out}


def questions_to(questions: dict[str, list], device) -> dict[str, list]:
    for qs in questions.values():
        for q in qs:
            q.ids = q.ids.to(device)
    return questions


@torch.no_grad()
def task_sweep(lm: LayeredLM, questions: dict[str, list], plans: list[Plan], sums: TaskSums, linear=None,
               progress=lambda it, desc: it) -> None:
    """Every question traced once (the model's own scores), every plan replayed on its cached activations."""
    for task, qs in questions.items():
        for q in progress(qs, f"analyze: {task}"):
            tr = lm.trace(q.ids, question_mask(q))
            for plan in plans:
                sums.add(task, plan.key, q, answer_logits(lm, q, replay_state(lm, tr, plan, linear)))


@torch.no_grad()
def naive_task_sweep(lm: LayeredLM, questions: dict[str, list]) -> TaskSums:
    """L independent evaluations, each of the model with one block swapped out (the benchmark's yardstick)."""
    sums = TaskSums()
    for l in range(lm.n_layers):
        with skipping(lm, l):
            for task, qs in questions.items():
                for q in qs:
                    sums.add(task, ("block", l), q, lm.forward_fn(q.ids, question_mask(q))[:, q.first:])
    return sums


def sweep_agreement(lm: LayeredLM, questions: dict[str, list]) -> tuple[float, bool]:
    """The cached sweep against L independent evaluations (naive_task_sweep): the largest difference in an answer's
    summed log-likelihood, and whether every removal gets as many questions right."""
    cached = TaskSums()
    task_sweep(lm, questions, [BASE, *single_plans(lm.n_layers)], cached)
    naive = naive_task_sweep(lm, questions)
    keys = list(naive.right)
    gap = max(abs(sum(cached.ll[k]) - sum(naive.ll[k])) for k in keys)
    return gap, all(cached.right[k] == naive.right[k] for k in keys)


def usefulness_orders(removal: dict | None, task_removal: dict | None) -> dict[str, list[int]]:
    """Blocks (1-based) from least to most useful, by what removing each one alone costs: "loss", the loss
    increase; "tasks", the correct answers lost over all tasks, then the answers' log-likelihood lost (ties keep
    block order)."""
    out = {}
    if removal and "single" in removal:
        out["loss"] = [r["block"] for r in sorted(removal["single"], key=lambda r: r["delta_loss"])]
    if task_removal and task_removal["tasks"]:
        tasks = task_removal["tasks"].values()
        cost = {r["block"]: (0.0, 0.0) for r in next(iter(tasks))["single"]}
        for t in tasks:
            for r in t["single"]:
                lost, ll = cost[r["block"]]
                cost[r["block"]] = (lost + t["n"] * r["acc_drop"], ll + t["n"] * r["ll_drop"])
        out["tasks"] = sorted(cost, key=lambda b: (round(cost[b][0], 6), cost[b][1]))
    return out
