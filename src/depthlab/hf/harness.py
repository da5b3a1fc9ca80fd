"""lm-evaluation-harness on any depthlab model: `depthlab eval MODEL --harness TASK...`.

`DepthlabLM` is an lm_eval `LM` (a `TemplateLM`, as lm-eval's own `hf` backend) around mc_eval's Scorer, so every
scheme, including those that do not export to a stock class, is evaluated by the harness itself: lm-eval builds
the requests and computes the metrics, depthlab's model only scores tokens. Context/continuation encoding is
lm-eval's own (`TemplateLM._encode_pair`); the start token is the one depthlab's scoring puts in front (mc_eval).

- loglikelihood: lm-eval's `hf` backend semantics (left truncation, right-padded batches, greedy flag);
- loglikelihood_rolling: rolling windows of the model's context (`lm_eval.utils.get_rolling_token_windows`), the
  start token as the first window's context; the text itself is encoded without it (lm-eval's `hf` backend
  encodes it with the tokenizer's special tokens, so a tokenizer that adds BOS also scores P(BOS | BOS));
- generate_until: greedy decoding, stopped at the end-of-text token, at `max_gen_toks` or at an `until` string.

Tasks are lm-eval task names, YAML task files or directories of them (local datasets: hubs are not needed).
Needs `pip install depthlab[eval]` (lm-eval); imported only when --harness is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM

from depthlab import UserError
from depthlab.hf.mc_eval import Scorer, score_pairs


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


def task_names_and_paths(items: list[str]) -> tuple[list[str], list[str]]:
    """(task names, include paths): a YAML file is its `task:` name plus its folder; a folder is every task defined
    by the YAML files in it; anything else is a task name lm-eval knows."""
    names, include = [], []
    for item in items:
        p = Path(item)
        if _is_task_path(p):
            if not p.exists():
                raise UserError(f"task file {p} does not exist")
            files = sorted(p.glob("*.y*ml")) if p.is_dir() else [p]
            found = [n for f in files for n in _yaml_task_names(f)]
            if not found:
                raise UserError(f"{p}: no lm-eval task definition (a YAML file with a 'task:' line)")
            names += found
            include.append(str(p if p.is_dir() else p.parent))
        else:
            names.append(item)
    return names, include


def _is_task_path(p: Path) -> bool:
    return p.is_dir() or p.suffix in (".yaml", ".yml")


def _yaml_task_names(path: Path) -> list[str]:
    """The `task:` names a YAML file defines (read as lines: task files may hold lm-eval's own !function tags)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("task:"):
            out.append(line.split(":", 1)[1].strip().strip("'\""))
    return out


def run_harness(scorer: Scorer, items: list[str], batch_size: int = 16, limit: int | None = None,
                log_samples: bool = False) -> dict:
    """lm_eval.simple_evaluate on the scorer's model; returns lm-eval's results dictionary."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local dataset files: never wait for a hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names, include = task_names_and_paths(items)
    local = len(names) - sum(1 for i in items if not _is_task_path(Path(i)))  # lm-eval's own tasks only if named
    manager = TaskManager(include_path=include or None, include_defaults=local < len(names))
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise UserError(f"lm-eval does not know task(s) {', '.join(unknown)}; give a task name, a YAML task file or "
                        "a folder of them")
    return lm_eval.simple_evaluate(model=DepthlabLM(scorer, batch_size), tasks=names, task_manager=manager,
                                   limit=limit, log_samples=log_samples, bootstrap_iters=0)
