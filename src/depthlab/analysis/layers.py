"""A causal LM seen as a stack of blocks: discovery, capture and replay, for depthlab models and any HF model; a
depthlab ViT the same way (its head reads the class from the pooled final-normed stream).

Nothing here is looked up in a per-class table. The block list is the largest nn.ModuleList of repeated modules;
a traced forward pass then proves the discovery: every block must feed the next one, the final norm is the module
that receives the last block's output, and head(final_norm(h_L)) must reproduce the model's logits, after the
transform the model applies to them where it has one (`LogitMap`: Cohere's and Granite's logit scales, Gemma-2's
soft cap). A model that fails a check is refused with a message naming what was found.

Replay: during the traced pass each block's call (its other arguments: RoPE tables, masks, position ids) is
recorded, so a block can later be re-run on any hidden state with exactly the arguments the model gave it. That
is what makes layer removal and Jacobians work the same way for every architecture.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch
from torch import nn

from depthlab import UserError
from depthlab.analysis.calibration import last_real_index
from depthlab.model.blocks import find_blocks, is_norm  # generic block discovery lives in one place, shared with hf/
from depthlab.model.parts import softcap
from depthlab.progress import detail

ATTN_NAME = re.compile(r"attn|attention", re.I)
SUBLAYER_NAMES = {"attn": ATTN_NAME, "mlp": re.compile(r"mlp|feed_?forward|ffn", re.I)}


@dataclass
class BlockCall:
    """One block's call, minus the hidden state: replay it with `run_block`."""
    args: tuple
    kwargs: dict
    hidden_kw: str | None  # the hidden state came as this keyword (else as the first positional argument)


@dataclass
class Trace:
    """One batch through the model. hidden[l] is the residual stream entering block l, hidden[L] the raw output of
    the last block (before the final norm); mid[l] is the stream between block l's attention and MLP halves;
    logits the model's own (None in a kept trace: `LayeredLM._keep`)."""
    hidden: list[torch.Tensor]
    mid: list[torch.Tensor | None]
    calls: list[BlockCall]
    logits: torch.Tensor | None


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def _received(t: torch.Tensor, sent: torch.Tensor) -> bool:
    """t is the tensor `sent`, or (a model placed over several devices) the original of its gathered copy."""
    return t is sent or (t.device != sent.device and t.shape == sent.shape and torch.equal(t.to(sent.device), sent))


def _zeroed(out):
    if isinstance(out, torch.Tensor):
        return torch.zeros_like(out)
    return (torch.zeros_like(out[0]), *out[1:])  # HF attention: (output, weights)


@dataclass(frozen=True)
class LogitMap:
    """What a model does to head(final_norm(h)) to make its logits: times or over a factor (Cohere's logit_scale,
    Granite's logits_scaling), then soft-capped as cap * tanh(z / cap) (Gemma-2's final_logit_softcapping); in
    transformers' order of operations, so that the logits are the model's own to the last bit."""
    op: str | None = None  # "*" or "/"
    factor: float = 1.0
    cap: float | None = None

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.op == "*":
            z = z * self.factor
        elif self.op == "/":
            z = z / self.factor
        return z if self.cap is None else softcap(z, self.cap)

    def __str__(self) -> str:
        parts = [f"logits {self.op} {self.factor:g}" if self.op else "", f"soft-capped at {self.cap:g}" if self.cap
                 else ""]
        return ", ".join(p for p in parts if p) or "none"


def hf_logit_maps(config) -> list[LogitMap]:
    """The logit transforms an HF config can mean, the most specific first (discovery keeps the first that
    reproduces the model's logits): logit_scale multiplies (Cohere); logits_scaling divides (Granite) or multiplies
    (HyperCLOVA X); final_logit_softcapping caps (Gemma-2/3); the plain head last (a field the model ignores)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    cap = getattr(cfg, "final_logit_softcapping", None)
    cap = float(cap) if number(cap) else None
    ops = [("*", getattr(cfg, "logit_scale", None)), ("/", getattr(cfg, "logits_scaling", None)),
           ("*", getattr(cfg, "logits_scaling", None))]
    maps = [LogitMap(op, float(f), cap) for op, f in ops if number(f)] + [LogitMap(cap=cap), LogitMap()]
    return list(dict.fromkeys(maps))


class LayeredLM:
    """A causal LM as embedding -> blocks -> final norm -> head, with capture and replay.

    `forward_fn(inputs, mask)` runs the whole model and returns logits; for depthlab models the calibration
    batches are packed (no padding), for HF models the attention mask is passed on. A classifier (a ViT) has `pool`:
    its inputs are images, its head reads head(pool(final_norm(h))) and its logits are (B, classes).
    `logit_maps`: what the model may do to the head's output (`LogitMap`), tried in order by `discover`.
    """

    def __init__(self, model: nn.Module, forward_fn, name: str, kind: str, head,
                 mid_probes: list | None = None, pool=None, logit_maps: list[LogitMap] | None = None):
        self.model, self.forward_fn, self.name, self.kind, self.head = model, forward_fn, name, kind, head
        self.pool = pool
        self.logit_maps = logit_maps or [LogitMap()]
        self.logit_map = self.logit_maps[0]  # the one discovery proves
        self.blocks_path, self.blocks = find_blocks(model)
        self.norm: nn.Module | None = None
        self.norm_path = ""
        # (module, "input" | "output") per block: where the stream between attention and MLP can be read.
        self.mid_probes = mid_probes

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def classifier(self) -> bool:
        return self.pool is not None

    def readout(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, d): where the prediction is read from the stream: each sequence's last real token, or a
        classifier's pooled token (a ViT's class token, or the mean of its patch tokens)."""
        if self.pool is not None:
            return self.pool(h)
        return h[torch.arange(h.shape[0], device=mask.device), last_real_index(mask)]

    # --- placement over several devices ----------------------------------------------------------------------
    home: torch.device | None = None  # a model placed by a device map (depthlab.loading.place): the device every
    # tensor handed to the analysis is gathered on (its inputs'); None: the model sits on one device

    def gather_on(self, device) -> None:
        """Hand the analysis every stream, block output and logit on `device`: accelerate's hooks move each
        module's inputs to its own device but leave its output there."""
        self.home = torch.device(device)
        self.head.register_forward_hook(lambda mod, args, out: out.to(self.home))

    def _home(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return t if self.home is None or t is None else t.to(self.home)

    # --- capture ---------------------------------------------------------------------------------------------
    KEEP_BYTES = 512 * 2**20  # traces kept for a second use, at most this many bytes of stream states in all
    _kept: dict | None = None  # id(inputs) -> (inputs, mask, the model's state, Trace without its logits)

    def _state(self) -> tuple:
        """What a trace depends on besides its inputs: the blocks, every parameter (each one's identity and its
        in-place version), the hooks on the blocks (a sublayer zeroed) and where the mid-block states are read."""
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in self.blocks.modules())
        probes = tuple(id(p[0]) if p else None for p in self.mid_probes or ())  # which mid states a trace reads
        return (tuple(map(id, self.blocks)), hooks, probes,
                tuple((id(p), p._version) for p in self.model.parameters()))

    def _kept_trace(self, inputs: torch.Tensor, mask: torch.Tensor) -> Trace | None:
        """The trace of these very inputs kept by an earlier `trace`, handed out once (then let go), if the model
        has not changed since: an analysis traces each batch again for the plans it chose after the first pass."""
        hit = (self._kept or {}).pop(id(inputs), None)
        if hit is None:
            return None
        was_inputs, was_mask, state, tr = hit
        same = was_inputs is inputs and (was_mask is mask or torch.equal(was_mask, mask))
        return tr if same and state == self._state() else None

    def _keep(self, inputs: torch.Tensor, mask: torch.Tensor, tr: Trace) -> None:
        """Keep `tr`'s stream states (mid-block ones included) and calls for one more use while they fit in
        KEEP_BYTES (SmolLM2's 2,048 tokens: 290 MB); not its logits (the batch's B x T x vocabulary: 2.1 GB for
        Gemma-3's 8 x 256 tokens): `replay` reads them off the last state, as the model does."""
        if self._kept is None:
            self._kept = {}
        size = lambda t: sum(h.numel() * h.element_size() for h in [*t.hidden, *t.mid] if h is not None)  # noqa: E731
        if size(tr) + sum(size(k) for *_, k in self._kept.values()) <= self.KEEP_BYTES:
            self._kept[id(inputs)] = (inputs, mask, self._state(), Trace(tr.hidden, tr.mid, tr.calls, None))

    @torch.no_grad()
    def trace(self, inputs: torch.Tensor, mask: torch.Tensor, keep: bool = True) -> Trace:
        """One batch through the model, every block's input and call recorded. With `keep`, the trace is also kept
        for the next trace of the same inputs (`_keep`), which then costs nothing."""
        kept = self._kept_trace(inputs, mask)
        if kept is not None:
            return kept
        tr = self._trace(inputs, mask)
        if keep:
            self._keep(inputs, mask, tr)
        return tr

    def _trace(self, inputs: torch.Tensor, mask: torch.Tensor) -> Trace:
        L = self.n_layers
        calls: list[BlockCall | None] = [None] * L
        hidden: list[torch.Tensor | None] = [None] * (L + 1)
        outs: list[torch.Tensor | None] = [None] * L
        mid: list[torch.Tensor | None] = [None] * L
        handles = []

        def pre(i):
            def hook(mod, args, kwargs):
                if args:
                    h, call = args[0], BlockCall(tuple(args[1:]), dict(kwargs), None)
                else:
                    key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
                    h, call = kwargs[key], BlockCall((), {k: v for k, v in kwargs.items() if k != key}, key)
                hidden[i], calls[i] = self._home(h), call
                detail(f"traced pass: block {i + 1} of {L}")
            return hook

        def post(i):
            def hook(mod, args, kwargs, out):
                outs[i] = self._home(_first_tensor(out))
            return hook

        def mid_hook(i, where):
            def hook(mod, args, out):
                mid[i] = self._home(_first_tensor(args if where == "input" else out))
            return hook

        try:
            for i, blk in enumerate(self.blocks):
                handles.append(blk.register_forward_pre_hook(pre(i), with_kwargs=True))
                handles.append(blk.register_forward_hook(post(i), with_kwargs=True))
                if self.mid_probes and self.mid_probes[i] is not None:
                    mod, where = self.mid_probes[i]
                    handles.append(mod.register_forward_hook(mid_hook(i, where)))
            logits = self.forward_fn(inputs, mask)
        finally:
            for h in handles:
                h.remove()
        if any(c is None for c in calls):
            raise UserError(f"{self.name}: the blocks in {self.blocks_path} were not all called by the forward pass")
        hidden[L] = outs[L - 1]
        return Trace(hidden, mid, calls, logits)

    # --- replay ----------------------------------------------------------------------------------------------
    def run_block(self, i: int, h: torch.Tensor, call: BlockCall) -> torch.Tensor:
        if call.hidden_kw is None:
            out = self.blocks[i](h, *call.args, **call.kwargs)
        else:
            out = self.blocks[i](*call.args, **{call.hidden_kw: h}, **call.kwargs)
        return self._home(_first_tensor(out))

    def run_block_mid(self, i: int, h: torch.Tensor, call: BlockCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run block i and also read the stream between its attention and MLP halves (None without a split)."""
        probe = self.mid_probes[i] if self.mid_probes else None
        if probe is None:
            return self.run_block(i, h, call), None
        got = []
        mod, where = probe
        handle = mod.register_forward_hook(lambda m, a, o: got.append(_first_tensor(a if where == "input" else o)))
        try:
            out = self.run_block(i, h, call)
        finally:
            handle.remove()
        return out, self._home(got[0])

    def sublayer(self, i: int, part: str) -> nn.Module:
        """Block i's attention ("attn") or MLP ("mlp"): the direct child named so (attn, self_attn, attention; mlp,
        feed_forward, ffn) that is not a norm, the one with the most parameters if several are (depthlab's attn
        beside its attn_add)."""
        named = [(n, m) for n, m in self.blocks[i].named_children()
                 if SUBLAYER_NAMES[part].search(n) and not is_norm(m)]
        if not named:
            children = ", ".join(n for n, _ in self.blocks[i].named_children())
            raise UserError(f"{self.name}: no {'attention' if part == 'attn' else 'MLP'} sublayer found in block "
                            f"{type(self.blocks[i]).__name__} (children: {children}); sublayer removal needs one")
        return max(named, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))[1]

    @contextlib.contextmanager
    def without(self, i: int, part: str):
        """Block i with its attention or MLP output zeroed: the residual branch adds nothing (a norm on the branch
        output then sees zeros, as it would with that sublayer's output projection zeroed)."""
        handle = self.sublayer(i, part).register_forward_hook(lambda mod, args, out: _zeroed(out))
        try:
            yield
        finally:
            handle.remove()

    def run_blocks(self, start: int, stop: int, h: torch.Tensor, calls: list[BlockCall]) -> torch.Tensor:
        for j in range(start, stop):
            h = self.run_block(j, h, calls[j])
        return h

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self._home(self.norm(h))

    def logits(self, h_raw: torch.Tensor) -> torch.Tensor:
        """Logits read from a raw residual stream: head(final_norm(h)) and the model's logit transform, as the model
        itself does after the last block. Everything that reads logits off a stream calls this: the logit lens at
        every layer, removal's loss, task scoring, layer-by-layer mode."""
        return self.logit_map(self.head(self.norm(h_raw)))

    # --- discovery checks ------------------------------------------------------------------------------------
    @torch.no_grad()
    def discover(self, inputs: torch.Tensor, mask: torch.Tensor) -> None:
        """Find the final norm and prove the block chain and the head on one traced sequence (the batch's first:
        what is found is the model's structure, the same on any sequence), in the same pass watching block 0 for
        where its mid stream can be read (`_BlockWatch`)."""
        inputs, mask = inputs[:1], mask[:1]
        seen: list[tuple[str, nn.Module, torch.Tensor]] = []
        inside = {id(m) for m in self.blocks.modules()}
        handles = []

        def record(name):
            def hook(mod, args):
                t = _first_tensor(args)
                if t is not None:
                    seen.append((name, mod, t))
            return hook

        for name, mod in self.model.named_modules():
            if id(mod) not in inside and mod is not self.model and not isinstance(mod, nn.ModuleList):
                handles.append(mod.register_forward_pre_hook(record(name)))
        watch = _BlockWatch(self.blocks[0]) if self.mid_probes is None else None
        try:
            with watch or contextlib.nullcontext():
                tr = self.trace(inputs, mask, keep=False)
        finally:
            for h in handles:
                h.remove()
        chain_ok = all(torch.allclose(self.run_block(i, tr.hidden[i], tr.calls[i]), tr.hidden[i + 1], atol=1e-5)
                       for i in range(self.n_layers))
        if not chain_ok:
            raise UserError(f"{self.name}: replaying the blocks of {self.blocks_path} does not reproduce the "
                            "model's own stream (something sits between the blocks)")
        last = tr.hidden[-1]
        found = [(n, m) for n, m, t in seen if _received(t, last) and m is not self.head]
        if not found:
            names = ", ".join(sorted({n for n, _, _ in seen})) or "none"
            raise UserError(f"{self.name}: no final norm found: no module outside {self.blocks_path} receives the "
                            f"last block's output (modules called: {names})")
        # Prefer a norm by name: a module in between (an eval-mode dropout, say) also receives the same tensor.
        self.norm_path, self.norm = next(((n, m) for n, m in found if "norm" in type(m).__name__.lower()), found[0])
        # checked on one sequence: the batch's whole (B x T x vocabulary) and allclose's temporaries of its size
        # took SmolLM2's layer-by-layer peak from 1.1 GB to 3.0 GB (8 x 256 tokens, 49,152 tokens of vocabulary)
        ref, raw = tr.logits.float(), self.head(self.norm(last))
        same = lambda got: got.shape == ref.shape and torch.allclose(  # noqa: E731
            got, ref, atol=1e-4 * max(1.0, ref.abs().max().item()), rtol=1e-3)
        self.logit_map = next((m for m in self.logit_maps if same(m(raw).float())), None)
        if self.logit_map is None:
            tried = "; ".join(map(str, self.logit_maps))
            raise UserError(f"{self.name}: head({self.norm_path}(h_L)) does not reproduce the model's logits "
                            f"(blocks {self.blocks_path}, final norm {self.norm_path}: {type(self.norm).__name__}, "
                            f"head {type(self.head).__name__}, logit transforms tried: {tried}); the model changes "
                            "its logits in some other way, which analysis does not reproduce")
        if watch is not None:
            self.mid_probes = watch.probes(self, tr.hidden[0].shape)

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "class": type(self.model).__name__,
                "blocks": f"{self.blocks_path} ({self.n_layers} x {type(self.blocks[0]).__name__})",
                "final_norm": f"{self.norm_path} ({type(self.norm).__name__})",
                "head": type(self.head).__name__, "logits": str(self.logit_map),
                "attn_mlp_split": self.mid_probes is not None and any(p is not None for p in self.mid_probes)}


# --- the mid-block probe -------------------------------------------------------------------------------------

def depthlab_mid_probes(model) -> list:
    """Our blocks route the residual adds through `Residual` modules: attn_add's output is the mid stream."""
    return [(blk.attn_add, "output") for blk in model.layers]


class _BlockWatch:
    """Inside its `with`: the order in which a block's direct children are called, with each one's input and
    output, for `probes` to find the mid stream in."""

    def __init__(self, blk: nn.Module):
        self.children = [(n, m) for n, m in blk.named_children() if not isinstance(m, nn.ModuleList)]
        self.order: list[tuple[str, torch.Tensor | None, object]] = []

    def __enter__(self):
        self.handles = [m.register_forward_hook(
            lambda mod, a, o, n=n: self.order.append((n, _first_tensor(a), _first_tensor(o))))
            for n, m in self.children]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def probes(self, lm: LayeredLM, stream_shape) -> list | None:
        """Where the stream between attention and MLP can be read in each block, found in block 0's calls.

        The rule: the first direct child called after the attention child whose input is not the attention output
        itself receives the mid stream. Llama/Mistral/Qwen2/GPT-2: the MLP-side norm (its input is h + attn);
        OLMo-2: the MLP (the attention output first goes through its own post-norm); Gemma-2/3: the norm before the
        MLP (the attention output goes through its own post-norm first). A candidate whose input is not shaped like
        the residual stream is rejected, and then no split is reported."""
        attn = next((n for n, _ in self.children if ATTN_NAME.search(n)), None)
        names = [n for n, _, _ in self.order]
        if attn is None or attn not in names:
            return None
        k = names.index(attn)
        attn_out = self.order[k][2]
        probe = next(((n, inp) for n, inp, _ in self.order[k + 1:] if inp is not None and inp is not attn_out), None)
        if probe is None or probe[1].shape != stream_shape:
            return None
        return [(getattr(b, probe[0]), "input") for b in lm.blocks]


# --- wrapping loaded models (loading itself is depthlab.loading's) -----------------------------------------

def from_depthlab(model, name: str) -> LayeredLM:
    from depthlab.model.vit import ViT

    if isinstance(model, ViT):
        return from_vit(model, name)
    model.eval()

    def fwd(ids, mask):
        return model(ids)  # packed batches: no padding, the mask is all ones

    return LayeredLM(model, fwd, name, "depthlab", model.lm_head, depthlab_mid_probes(model),
                     logit_maps=[LogitMap(cap=getattr(model, "logit_softcap", None))])


class PooledHead:
    """A ViT's head as read from the final-normed stream: head(pool(h)). A plain callable, not a module, so the
    ViT does not appear twice in a module tree."""

    def __init__(self, model):
        self.model = model

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.head(self.model.pool(h))


def from_vit(model, name: str) -> LayeredLM:
    """A depthlab ViT: images in (cast to the weights' dtype), class logits out; the blocks are called as
    block(h, None) (no RoPE), so the recorded calls replay as for a language model."""
    model.eval()

    def fwd(images, mask):
        return model(images.to(model.head.weight.dtype))

    return LayeredLM(model, fwd, name, "depthlab-vit", PooledHead(model), depthlab_mid_probes(model), model.pool)


def from_hf(model, name: str) -> LayeredLM:
    model.eval()
    head = model.get_output_embeddings()
    if head is None:
        raise UserError(f"{name}: {type(model).__name__} has no output embedding (not a causal LM?)")

    def fwd(ids, mask):
        return model(input_ids=ids, attention_mask=mask.long(), use_cache=False).logits

    return LayeredLM(model, fwd, name, "hf", head, logit_maps=hf_logit_maps(model.config))
