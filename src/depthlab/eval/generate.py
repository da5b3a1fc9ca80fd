"""Generation scored by exact match, with blocks of a model removed: greedy decoding with a KV cache, one question
at a time, of a Hugging Face causal LM (anything whose forward takes `input_ids`, `cache` and `use_cache` and
whose attention layers write the cache at their `layer_idx`).

Removing blocks runs the model as `depthlab prune` would leave it: the block list without them, each kept
attention renumbered to its new place in the KV cache; nothing is copied and the model is restored afterwards.

A sweep (`generation_sweep`) needs exact match only, and greedy decoding gives the answer exactly when, at each of
the answer's positions, the model's greedy token after the prompt and the answer's earlier tokens is the answer's
token (and no eos token comes before its last). So nothing is decoded one token at a time: each question is run
once through the model itself over the prompt and the answer (its last token aside), recording each block's
output and KV there. A removal whose first changed block is l then reuses that record:
- blocks 0..l-1 are not run: they hand on the recorded outputs and KV (a removal changes nothing before block l);
- blocks l.. run once over the prompt and the answer together, and the head only at the answer's positions.
Its greedy tokens up to the first that differs from the answer's are those of decoding from scratch with the
blocks pruned (a test pins them against transformers' `generate`); what it would generate after that is not
computed (exact match is already lost). The one pass sums in another order than decoding one token at a time, so
a near-tie between two tokens could in principle fall the other way.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from depthlab.model.blocks import find_blocks, set_blocks


@dataclass(frozen=True)
class GenQuestion:
    """A prompt and the answer expected after it, as token ids; the model generates len(answer) tokens."""
    prompt: tuple[int, ...]
    answer: tuple[int, ...]


def encode_pair(encode: Callable[[str], list[int]], prompt: str, answer: str) -> GenQuestion:
    """Token ids of a prompt and its answer, the answer tokenized in context: the ids of prompt + answer after the
    ones they share with the prompt alone (where a token straddles the two, the prompt ends before it)."""
    alone, whole = list(encode(prompt)), list(encode(prompt + answer))
    k = next((i for i, (a, b) in enumerate(zip(alone, whole)) if a != b), min(len(alone), len(whole)))
    return GenQuestion(tuple(whole[:k]), tuple(whole[k:]))


@dataclass(frozen=True)
class Removal:
    """What is taken out: the blocks in `skip` (0-based), and `patch`, a context manager active while generating
    (a sublayer zeroed, say); `first`, the first block either changes (default: the first skipped)."""
    skip: frozenset = frozenset()
    first: int | None = None
    patch: Callable[[], contextlib.AbstractContextManager] | None = None

    @property
    def start(self) -> int:
        return self.first if self.first is not None else min(self.skip, default=0)


@dataclass
class Record:
    """The model's own pass over a question's prompt and answer (its last token aside): per block its output and KV
    at each position, and its greedy tokens (`Greedy._forced`)."""
    tokens: list[int]
    outputs: list = field(default_factory=list)  # as each block returned it (a tensor, or a tuple)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class _Replay(nn.Module):
    """Block j of the model itself as recorded: it writes its recorded KV to the cache and returns its recorded
    output."""

    def __init__(self, j: int, out, kv, cache):
        super().__init__()
        self.j, self.out, self.kv, self.cache = j, out, kv, cache

    def forward(self, *args, **kwargs):
        self.cache.update(*self.kv, self.j)
        return self.out


class Greedy:
    """Greedy decoding of one model with a KV cache, blocks removed as `prune` removes them. `eos`: the tokens that
    end a generation (as `generate` stops at the model's eos_token_id)."""

    def __init__(self, model: nn.Module, eos: Iterable[int] = ()):
        self.model, self.eos = model.eval(), frozenset(eos)
        self.path, self.blocks = find_blocks(model)
        self.keeps = "logits_to_keep" in inspect.signature(model.forward).parameters

    @contextlib.contextmanager
    def _with_blocks(self, blocks: list[nn.Module]):
        """The model running `blocks` as its block list, for the time of the `with`."""
        set_blocks(self.model, self.path, blocks)
        try:
            yield
        finally:
            set_blocks(self.model, self.path, self.blocks)

    def _logits(self, ids: list[int], cache, keep: int = 1) -> torch.Tensor:
        """The logits at the last `keep` positions of `ids` (the head applied there only, as `generate` does)."""
        x = torch.tensor([ids], device=next(self.model.parameters()).device)
        extra = {"logits_to_keep": keep} if self.keeps else {}
        return self.model(input_ids=x, cache=cache, use_cache=True, **extra).logits[0, -keep:].float()

    @torch.no_grad()
    def generate(self, prompt: Iterable[int], n: int, removal: Removal = Removal()) -> list[int]:
        """n greedy tokens (fewer if eos comes) after `prompt`, from scratch: prefill, then one step a token."""
        from transformers import DynamicCache

        kept = [i for i in range(len(self.blocks)) if i not in removal.skip]
        cache = DynamicCache()
        with self._with_blocks([self.blocks[i] for i in kept]), (removal.patch or contextlib.nullcontext)():
            out = [int(self._logits(list(prompt), cache)[-1].argmax())]
            while len(out) < n and out[-1] not in self.eos:
                out.append(int(self._logits([out[-1]], cache)[-1].argmax()))
            return out

    def _forced(self, q: GenQuestion, cache) -> list[int]:
        """One pass over the prompt and the answer (its last token aside), the head at the answer's positions only:
        the greedy tokens, the answer's up to the first prediction that differs from it, which ends them, as an eos
        token does (what decoding gives up to there; after it, exact match is lost)."""
        out: list[int] = []
        for pred, want in zip(self._logits([*q.prompt, *q.answer[:-1]], cache, len(q.answer)).argmax(-1).tolist(),
                              q.answer):
            out.append(pred)
            if pred != want or pred in self.eos:
                break
        return out

    @torch.no_grad()
    def record(self, q: GenQuestion) -> Record:
        """The model's own pass over the question, every block's output and KV recorded (for `generate_from`)."""
        from transformers import DynamicCache

        outs: list = [None] * len(self.blocks)
        hooks = [b.register_forward_hook(lambda m, a, o, j=j: outs.__setitem__(j, o))
                 for j, b in enumerate(self.blocks)]
        cache = DynamicCache()
        try:
            tokens = self._forced(q, cache)
        finally:
            for h in hooks:
                h.remove()
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        return Record(tokens, outs, kv)

    @torch.no_grad()
    def generate_from(self, rec: Record, q: GenQuestion, removal: Removal) -> list[int]:
        """What `generate` gives for `removal`, up to its first token that is not the answer's (all of it when
        none is), from the model's own record (see the module's docstring)."""
        from transformers import DynamicCache

        l = removal.start
        kept = [i for i in range(len(self.blocks)) if i not in removal.skip]
        cache = DynamicCache()
        blocks = [_Replay(j, rec.outputs[j], rec.kv[j], cache) if j < l else self.blocks[j] for j in kept]
        with self._with_blocks(blocks), (removal.patch or contextlib.nullcontext)():
            return self._forced(q, cache)


def exact_match(generated: list[int], q: GenQuestion) -> bool:
    return tuple(generated[:len(q.answer)]) == q.answer


def score_generation(model: nn.Module, questions: list[GenQuestion], removed: Iterable[int] = (),
                     eos: Iterable[int] = ()) -> list[bool]:
    """Exact match per question of the model with the blocks `removed` (0-based), decoded from scratch."""
    g, removal = Greedy(model, eos), Removal(frozenset(removed))
    return [exact_match(g.generate(q.prompt, len(q.answer), removal), q) for q in questions]


def generation_sweep(model: nn.Module, questions: list[GenQuestion], removals: dict, eos: Iterable[int] = (),
                     progress=lambda it: it) -> tuple[list[bool], dict[object, list[bool]]]:
    """Exact match per question of the model itself, and under each removal ({key: Removal}), reusing the model's
    own record of each question (module docstring)."""
    g = Greedy(model, eos)
    base: list[bool] = []
    out: dict[object, list[bool]] = {key: [] for key in removals}
    for q in progress(questions):
        rec = g.record(q)
        base.append(exact_match(rec.tokens, q))
        for key, removal in removals.items():
            out[key].append(exact_match(g.generate_from(rec, q, removal), q))
    return base, out


def eos_of(model: nn.Module) -> frozenset[int]:
    """The tokens transformers' `generate` stops at: the generation config's eos_token_id (one, or a list)."""
    cfg = getattr(model, "generation_config", None) or getattr(model, "config", None)
    eos = getattr(cfg, "eos_token_id", None)
    return frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
