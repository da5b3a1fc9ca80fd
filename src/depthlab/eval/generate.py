"""Generation scored by exact match, with blocks of a model removed: greedy decoding with a KV cache, one question
at a time, of a Hugging Face causal LM (anything whose forward takes `input_ids`, `cache` and `use_cache` and
whose attention layers write the cache at their `layer_idx`).

Removing blocks runs the model as `depthlab prune` would leave it: the block list without them, each kept
attention renumbered to its new place in the KV cache; nothing is copied and the model is restored afterwards.

A sweep (`generation_sweep`) first generates with the model itself, recording each block's output and KV at every
position it saw (the prompt and the tokens it generated). A removal whose first changed block is l then reuses
that record twice:
- blocks 0..l-1 are not run: they hand on the recorded outputs and KV (a removal changes nothing before block l);
- the model's own generation is the draft: blocks l.. run once over the prompt and the model's own answer, in one
  pass, and the removed model's greedy tokens agree with the model's own up to the first position where its
  prediction differs. Only the tokens after that are decoded one at a time, and those decode steps run every kept
  block (what the removed model generates after it parts from the model's own depends on the removed block, so
  no earlier record holds it).
The tokens are those of decoding from scratch with the blocks pruned (a test pins it against transformers'
`generate`); the one-pass prefix sums in another order, so a near-tie between two tokens could in principle fall
the other way.
"""

from __future__ import annotations

import contextlib
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
    """The model's own generation of one question: its tokens, and per block its output and KV at each position
    it saw (the prompt, then each generated token but the last)."""
    tokens: list[int]
    outputs: list[torch.Tensor] = field(default_factory=list)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class _Replay(nn.Module):
    """Block j of the model itself, whose first call returns its recorded output and writes its recorded KV; the
    block runs on later calls (the decode steps)."""

    def __init__(self, block: nn.Module, j: int, out, kv, cache):
        super().__init__()
        self.block, self.j, self.record, self.cache = block, j, (out, kv), cache

    def forward(self, *args, **kwargs):
        if self.record is None:
            return self.block(*args, **kwargs)
        (out, kv), self.record = self.record, None
        self.cache.update(*kv, self.j)
        return out


class Greedy:
    """Greedy decoding of one model with a KV cache, blocks removed as `prune` removes them. `eos`: the tokens that
    end a generation (as `generate` stops at the model's eos_token_id)."""

    def __init__(self, model: nn.Module, eos: Iterable[int] = ()):
        self.model, self.eos = model.eval(), frozenset(eos)
        self.path, self.blocks = find_blocks(model)

    @contextlib.contextmanager
    def _with_blocks(self, blocks: list[nn.Module]):
        """The model running `blocks` as its block list, for the time of the `with`."""
        set_blocks(self.model, self.path, blocks)
        try:
            yield
        finally:
            set_blocks(self.model, self.path, self.blocks)

    def _logits(self, ids: list[int], cache) -> torch.Tensor:
        x = torch.tensor([ids], device=next(self.model.parameters()).device)
        return self.model(input_ids=x, cache=cache, use_cache=True).logits[0].float()

    def _decode(self, first: int, n: int, cache, out: list[int]) -> list[int]:
        """Append `first` and then greedy tokens to `out` until it holds n tokens or ends with eos."""
        out.append(first)
        while len(out) < n and out[-1] not in self.eos:
            out.append(int(self._logits([out[-1]], cache)[-1].argmax()))
        return out

    @torch.no_grad()
    def generate(self, prompt: Iterable[int], n: int, removal: Removal = Removal()) -> list[int]:
        """n greedy tokens (fewer if eos comes) after `prompt`, from scratch: prefill, then one step a token."""
        from transformers import DynamicCache

        kept = [i for i in range(len(self.blocks)) if i not in removal.skip]
        cache = DynamicCache()
        with self._with_blocks([self.blocks[i] for i in kept]), (removal.patch or contextlib.nullcontext)():
            return self._decode(int(self._logits(list(prompt), cache)[-1].argmax()), n, cache, [])

    @torch.no_grad()
    def record(self, prompt: Iterable[int], n: int) -> Record:
        """The model's own generation, with every block's output and KV recorded (for `generate_from`)."""
        from transformers import DynamicCache

        outs: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        hooks = [b.register_forward_hook(lambda m, a, o, j=j: outs[j].append(o)) for j, b in enumerate(self.blocks)]
        cache = DynamicCache()
        try:
            tokens = self._decode(int(self._logits(list(prompt), cache)[-1].argmax()), n, cache, [])
        finally:
            for h in hooks:
                h.remove()
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        return Record(tokens, [_cat(o) for o in outs], kv)

    @torch.no_grad()
    def generate_from(self, rec: Record, prompt: tuple[int, ...], n: int, removal: Removal) -> list[int]:
        """What `generate` gives for `removal`, from the model's own record (see the module's docstring)."""
        from transformers import DynamicCache

        l = removal.start
        kept = [i for i in range(len(self.blocks)) if i not in removal.skip]
        cache = DynamicCache()
        seen = [*prompt, *rec.tokens[:-1]]  # the positions the record holds
        blocks = [_Replay(self.blocks[j], j, rec.outputs[j], rec.kv[j], cache) if j < l else self.blocks[j]
                  for j in kept]
        with self._with_blocks(blocks), (removal.patch or contextlib.nullcontext)():
            pred = self._logits(seen, cache)[len(prompt) - 1:].argmax(-1).tolist()
            agree = next((i for i, (a, b) in enumerate(zip(pred, rec.tokens)) if a != b), len(rec.tokens))
            if agree == len(rec.tokens):
                return list(rec.tokens)
            cache.crop(-(len(seen) - len(prompt) - agree))  # back to the prompt and the agreed tokens
            return self._decode(pred[agree], n, cache, list(rec.tokens[:agree]))


def _cat(outputs: list) -> object:
    """One block's outputs over several calls, joined along the sequence (tuple outputs: their first element)."""
    if isinstance(outputs[0], torch.Tensor):
        return torch.cat(outputs, 1)
    return (torch.cat([o[0] for o in outputs], 1), *outputs[0][1:])


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
        rec = g.record(q.prompt, len(q.answer))
        base.append(exact_match(rec.tokens, q))
        for key, removal in removals.items():
            out[key].append(exact_match(g.generate_from(rec, q.prompt, len(q.answer), removal), q))
    return base, out


def eos_of(model: nn.Module) -> frozenset[int]:
    """The tokens transformers' `generate` stops at: the generation config's eos_token_id (one, or a list)."""
    cfg = getattr(model, "generation_config", None) or getattr(model, "config", None)
    eos = getattr(cfg, "eos_token_id", None)
    return frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
