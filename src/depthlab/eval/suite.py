"""The task sources of `eval tasks / mmlu / commonsense`, read and checked once before any model loads, and
encoded for one model as the requests each scorer scores (ScoredQuestion): what `analyze --removal-tasks /
--removal-mmlu / --removal-commonsense` replays with blocks removed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from depthlab.eval.commonsense import loglik_questions, read_task, task_files
from depthlab.eval.mmlu import mmlu_questions, read_mmlu, shot_examples
from depthlab.eval.multiple_choice import ScoredQuestion, Scorer, read_tasks, task_questions, text_scorer
from depthlab.paths import short_names


@dataclass
class TaskSuite:
    """`eval`'s task sources, read (and checked) once before any model loads: multiple-choice files, an MMLU
    directory with its shots, the commonsense tasks (their log-likelihood form: greedy generation has no fixed
    continuation to score). `questions` encodes them for one model, each task its list of ScoredQuestion;
    `analyze --removal-tasks` is given one."""

    files: dict[str, list] = field(default_factory=dict)  # name -> multiple_choice.Question list
    mmlu: dict | None = None  # read_mmlu's subjects
    shots: int = 0
    commonsense: dict[str, list[dict]] = field(default_factory=dict)  # task -> records
    limit: int | None = None  # at most this many questions of each file, MMLU subject and commonsense task

    @classmethod
    def read(cls, files=(), mmlu=None, shots: int = 0, commonsense=None, limit: int | None = None,
             flag: str = "--tasks") -> TaskSuite:
        """Every source read and checked; each file's results named apart from every other task's (`flag`, the
        option giving the files, names the one that cannot be)."""
        common = task_files(commonsense) if commonsense else {}
        names = short_names(list(map(str, files)), flag, {*common, *(["mmlu"] if mmlu else [])})
        suite = cls({n: read_tasks(f) for n, f in zip(names, files)}, read_mmlu(mmlu) if mmlu else None, shots,
                    {t: read_task(t, f) for t, f in common.items()}, limit)
        if suite.mmlu is not None:
            for subject, splits in suite.mmlu.items():  # too few dev questions: said now, not after a model loads
                shot_examples(subject, splits, shots)
        return suite

    def questions(self, scorer: Scorer) -> dict[str, list[ScoredQuestion]]:
        out = {name: task_questions(scorer, qs, self.limit) for name, qs in self.files.items()}
        if self.mmlu is not None:
            out["mmlu"] = mmlu_questions(scorer, self.mmlu, self.shots, self.limit)
        out.update({t: loglik_questions(scorer, t, recs[:self.limit]) for t, recs in self.commonsense.items()})
        return out

    def for_model(self, path: str | Path, trust_remote_code: bool = False) -> dict[str, list[ScoredQuestion]]:
        """The questions encoded by the tokenizer of the model at `path` (its weights are not loaded)."""
        return self.questions(text_scorer(path, trust_remote_code))
