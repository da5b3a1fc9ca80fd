"""lm-evaluation-harness on any depthlab model: `depthlab eval harness MODEL --harness TASK...`.

`DepthlabLM` is an lm_eval `LM` (a `TemplateLM`, as lm-eval's own `hf` backend) around the Scorer of
depthlab.eval.multiple_choice, so every scheme, including those that do not export to a stock class, is evaluated by
the harness itself: lm-eval builds the requests and computes the metrics, depthlab's model only scores tokens.
Context/continuation encoding is lm-eval's own (`TemplateLM._encode_pair`); the start token is the one depthlab's
scoring puts in front (multiple_choice).

- loglikelihood: lm-eval's `hf` backend semantics (left truncation, right-padded batches, greedy flag);
- loglikelihood_rolling: rolling windows of the model's context (`lm_eval.utils.get_rolling_token_windows`), the
  start token as the first window's context; the text itself is encoded without it (lm-eval's `hf` backend
  encodes it with the tokenizer's special tokens, so a tokenizer that adds BOS also scores P(BOS | BOS));
- generate_until: greedy decoding, stopped at the end-of-text token, at `max_gen_toks` or at an `until` string.

Tasks are lm-eval task names, YAML task files or directories of them (local datasets: hubs are not needed).
Needs `pip install depthlab[eval]` (lm-eval); imported only when --harness is used.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import yaml
from lm_eval.api.model import TemplateLM

from depthlab import UserError
from depthlab.eval.multiple_choice import Scorer, score_pairs
from depthlab.progress import on_terminal


class DepthlabLM(TemplateLM):
    def __init__(self, scorer: Scorer, batch_size: int = 16, max_gen_toks: int = 256):
        super().__init__()
        self.scorer, self.batch_size, self.max_gen_toks = scorer, batch_size, max_gen_toks

    @property
    def eot_token_id(self) -> int:
        return self.scorer.eot_id

    @property
    def prefix_token_id(self) -> int:
        return self.scorer.prefix_id

    @property
    def max_length(self) -> int:
        return self.scorer.max_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.scorer.encode(string, add_special_tokens is not False)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        out = []
        for i in range(0, len(pairs), self.batch_size):
            out += score_pairs(self.scorer, pairs[i:i + self.batch_size])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for (text,) in (r.args for r in requests):
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            out.append(sum(ll for ll, _ in self._loglikelihood_tokens([(None, *w) for w in windows])))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, kwargs in (r.args for r in requests):
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            out.append(self._greedy(self.tok_encode(context), until, kwargs.get("max_gen_toks", self.max_gen_toks)))
        return out

    @torch.no_grad()
    def _greedy(self, ids: list[int], until: list[str], max_new: int) -> str:
        new: list[int] = []
        text = ""
        for _ in range(max_new):
            x = torch.tensor([(ids + new)[-self.max_length:]], device=self.scorer.device)
            nxt = int(self.scorer.logits(x)[0, -1].argmax())
            if nxt == self.eot_token_id:
                break
            new.append(nxt)
            text = self.scorer.decode(new)
            if any(u in text for u in until):
                break
        cut = min((text.index(u) for u in until if u in text), default=len(text))
        return text[:cut]


def task_names_and_paths(items: list[str]) -> tuple[list[str], list[str], dict[str, Path]]:
    """(task names, include paths, the file defining each local task): a YAML file is its `task:` name plus its
    folder; a folder is every task defined by the YAML files in it; anything else is a task name lm-eval knows."""
    names, include, defined = [], [], {}
    for item in items:
        p = Path(item)
        if _is_task_path(p):
            if not p.exists():
                raise UserError(f"task file {p} does not exist")
            files = sorted(p.glob("*.y*ml")) if p.is_dir() else [p]
            found = {n: f for f in files for n in _yaml_task_names(f)}
            if not found:
                raise UserError(f"{p}: no lm-eval task definition (a YAML file with a 'task:' line)")
            names += found
            defined.update(found)
            include.append(str(p if p.is_dir() else p.parent))
        else:
            names.append(item)
    return names, include, defined


def _is_task_path(p: Path) -> bool:
    return p.is_dir() or p.suffix in (".yaml", ".yml")


class _TaskYaml(yaml.SafeLoader):
    """YAML as lm-eval reads task files, its own tags (`!function utils.process_docs`) accepted as they are."""


_TaskYaml.add_multi_constructor("!", lambda loader, suffix, node: None)


def _yaml_task_names(path: Path) -> list[str]:
    """The `task:` names a YAML file defines (read as lines: a group file lists its tasks under `task:` too). A
    file that is not YAML is refused here: lm-eval would skip it and then not know its task."""
    text = path.read_text(encoding="utf-8")
    try:
        yaml.load(text, _TaskYaml)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML: {getattr(e, 'problem', None) or e}{where}") from None
    out = []
    for line in text.splitlines():
        if line.startswith("task:"):
            out.append(line.split(":", 1)[1].strip().strip("'\""))
    return out


def run_harness(scorer: Scorer, items: list[str], batch_size: int = 16, limit: int | None = None,
                log_samples: bool = False, progress: bool = True) -> dict:
    """lm_eval.simple_evaluate on the scorer's model; returns lm-eval's results dictionary. `progress`: lm-eval's
    bars, on a terminal only (as depthlab's own)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local dataset files: never wait for a hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names, include, defined = task_names_and_paths(items)
    local = len(names) - sum(1 for i in items if not _is_task_path(Path(i)))  # lm-eval's own tasks only if named
    manager = TaskManager(include_path=include or None, include_defaults=local < len(names))
    unknown = [n for n in names if n not in manager.all_tasks]
    for n in unknown:
        if n in defined:  # lm-eval skipped the file it is defined in (its log says why)
            raise UserError(f"lm-eval skipped {defined[n]}, so it does not know its task {n}: the file is YAML but "
                            "not a task lm-eval reads (its keys?)")
    if unknown:
        raise UserError(f"lm-eval does not know task(s) {', '.join(unknown)}; give a task name, a YAML task file or "
                        "a folder of them")
    with _quiet(bars=on_terminal(progress)):
        tasks = [t for n in names for t in _built(manager, n, defined.get(n))]
        return lm_eval.simple_evaluate(model=DepthlabLM(scorer, batch_size), tasks=tasks, task_manager=manager,
                                       limit=limit, log_samples=log_samples, bootstrap_iters=0)


def _hidden(bar):
    """tqdm that draws nothing, also where the caller passes disable=False (lm-eval's "Tokenizing inputs")."""
    return lambda *args, **kwargs: bar(*args, **{**kwargs, "disable": True})


@contextlib.contextmanager
def _quiet(bars: bool) -> Iterator[None]:
    """lm-eval without its noise on stderr: the commit of the working directory it records by running `git describe`
    (outside a repository git prints "fatal: not a git repository"; depthlab prints the table, which does not show
    it), and, unless `bars`, its progress bars (tqdm, imported by name into the modules that draw them) and those
    of `datasets`, which reads the tasks' files."""
    from unittest import mock

    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.evaluator
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", lambda: None))
        if not bars:
            for module in (lm_eval.api.model, lm_eval.api.task):
                stack.enter_context(mock.patch.object(module, "tqdm", _hidden(module.tqdm)))
            if is_progress_bar_enabled():
                disable_progress_bar()
                stack.callback(enable_progress_bar)
        yield


def _built(manager, name: str, source: Path | None) -> list:
    """lm-eval's task (or group, or a tag's tasks) of `name`, every multiple-choice answer checked against its
    choices. lm-eval checks only the first document, with an IndexError traceback, and scores any other answer
    beyond the choices as wrong, a warning in its log."""
    where = f"task {name}" + (f" ({source})" if source else "")
    try:
        loaded = manager.load([name])
    except (IndexError, KeyError, ValueError, TypeError, FileNotFoundError) as e:  # it reads its data files, and
        # its first document
        hint = " (its first document's answer is beyond its choices)" if isinstance(e, IndexError) else ""
        raise UserError(f"lm-eval cannot build {where}: {type(e).__name__}: {e}{hint}") from None
    for task_name, task in loaded["tasks"].items():
        _check_answers(task, f"task {task_name}" + (f" ({source})" if source else ""))
    group = loaded["groups"].get(name)
    return [group] if group is not None else list(loaded["tasks"].values())


def _check_answers(task, where: str) -> None:
    if task.config.output_type != "multiple_choice" or task.multiple_input:
        return
    for i, doc in enumerate(task.eval_docs):
        choices, answer = task.doc_to_choice(doc), task.doc_to_target(doc)
        for a in answer if isinstance(answer, list) else [answer]:
            if not (a in choices if isinstance(a, str) else isinstance(a, int) and 0 <= a < len(choices)):
                raise UserError(f"{where}, document {i}: the answer {a!r} is not one of its {len(choices)} choices "
                                f"(an index 0..{len(choices) - 1} or a choice's text)")
