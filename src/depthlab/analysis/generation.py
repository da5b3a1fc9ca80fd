"""Layer removal scored by generation: each plan (depthlab.analysis.removal) as a `Removal` of
depthlab.eval.generate, every question decoded greedily with a KV cache and scored by exact match; the accuracy
with its Wilson interval and the paired McNemar test against the model itself, as task removal reports them
(depthlab.analysis.tasks.TaskSums). A linear replacement is not generated with (it stands outside the model).
"""

from __future__ import annotations

import warnings

from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.removal import BASE, Plan
from depthlab.analysis.tasks import TaskSums
from depthlab.eval.generate import Removal, eos_of, generation_sweep


def removal_of(lm: LayeredLM, plan: Plan) -> Removal | None:
    """The plan as a Removal: its skipped blocks, or its sublayer zeroed while generating; None for a linear
    replacement and for the model itself."""
    if plan.part in ("attn", "mlp"):
        return Removal(first=plan.at, patch=lambda: lm.without(plan.at, plan.part))
    return Removal(plan.skip) if plan.skip else None


def generation_removal(lm: LayeredLM, questions: dict[str, list], plans: list[Plan],
                       progress=lambda it, desc: it) -> dict:
    """{task: [GenQuestion]} scored under the model itself and each plan, as TaskSums.results gives them; a
    generation ends at the model's eos token, as transformers' `generate` ends it."""
    past_context(lm, questions)
    sums = TaskSums()
    removals = {p.key: r for p in plans if (r := removal_of(lm, p)) is not None}
    for task, qs in questions.items():
        bar = lambda it, task=task: progress(it, f"analyze: generating, {task}")  # noqa: E731
        base, outcomes = generation_sweep(lm.model, qs, removals, eos_of(lm.model), bar)
        for key, right in [(BASE.key, base), *outcomes.items()]:
            for ok in right:
                sums.record(task, key, ok)
    return sums.results()


def past_context(lm: LayeredLM, questions: dict[str, list]) -> None:
    """One warning line for each task whose questions run past the model's context: generating an answer runs the
    model over the prompt and the answer (its last token aside), positions it was never trained at, so their scores
    say little. Warned, not refused, as a multiple-choice question is scored left-truncated rather than refused."""
    from depthlab.loading import hf_context

    context = hf_context(lm.model.config)
    for task, qs in questions.items():
        lengths = [len(q.prompt) + len(q.answer) - 1 for q in qs]
        over = [n for n in lengths if n > context]
        if over:
            warnings.warn(f"--removal-generate task {task}: {len(over)} of its {len(qs)} questions run past the "
                          f"model's context of {context} tokens (prompt and answer up to {max(over):,} tokens); their "
                          "scores are of positions the model was not trained at: fewer shots or words keep them in",
                          stacklevel=2)
