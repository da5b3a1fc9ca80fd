"""What `analyze --removal-generate`'s sweep costs against L independent generations
(PYTHONPATH=src:. nice -n 10 python -m benchmarks.generate_cost [--model PATH] [--questions N] [--rounds R]).

sweep: the model itself run once per question over the prompt and the answer, recorded; each single-block removal
then scored from that record (blocks before the removed one replay their output and KV, the rest run once over the
prompt and the answer, and exact match is read off the greedy token at each answer position).
naive: for each block, the model with that block pruned generates every question from scratch (prefill with the
head at the last position, then one decode step a token), as `prune` then greedy `generate` would. Both must give
the same exact match; CPU time of each, interleaved rounds; the ratio is printed beside each figure and written to
benchmarks/results/generate_cost.json. Default model: SmolLM2-135M from benchmarks/real_model.py's cache (a random
16-block Llama when it is not there).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import best_ratio, environment, interleaved, paired_ratio, write_result

SMOLLM = Path("~/.cache/depthlab/real_model/model/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()


def load(path: str | None, tmp: Path):
    """(model, tokenizer, name): the given model, SmolLM2-135M if cached, else a random 16 x 128 Llama."""
    from depthlab.loading import load_model

    if path is None and SMOLLM.is_file():
        path = str(SMOLLM)
    if path in (None, "random"):
        import transformers

        from benchmarks.tiny_models import save_hf_model

        cfg = dict(num_hidden_layers=16, hidden_size=128, intermediate_size=256)
        hf = save_hf_model(tmp / "hf", "llama")
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(hf, **cfg)).eval()
        m.save_pretrained(hf)
        loaded = load_model(str(hf))
        return loaded.model, loaded.tokenizer, "random Llama 16 x 128, ffn 256, vocab 300"
    loaded = load_model(path)
    return loaded.model, loaded.tokenizer, Path(path).name


def questions(tok, n: int) -> tuple[list, str]:
    """n questions of each family: 2-digit addition, copying 8 letters, closing 4 brackets (3 shots each), and
    continuing a text (32 words, then 8; a play from real_model's cache, when there)."""
    from depthlab.eval.gen_tasks import read_task
    from depthlab.eval.generate import encode_pair

    text = next(iter(sorted(SMOLLM.parent.parent.glob("plays/*.txt"))), None)
    specs = [f"add:digits=2,n={n}", f"copy:n={n}", f"brackets:n={n}"] + ([f"continue:{text},n={n}"] if text else [])
    encode = lambda s: tok(s)["input_ids"]  # noqa: E731
    return [encode_pair(encode, p, a) for s in specs for p, a in read_task(s).pairs], " + ".join(specs)


def main(argv=None) -> None:
    from depthlab.eval.generate import Greedy, Removal, eos_of, exact_match, generation_sweep

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="any model path analyze reads, or 'random' (default: SmolLM2-135M if "
                    "cached)")
    ap.add_argument("--questions", type=int, default=4, help="questions of each family (default 4)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", help="the result file (default benchmarks/results/generate_cost.json)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, name = load(a.model, Path(tmp))
    qs, tasks = questions(tok, a.questions)
    L, eos = len(Greedy(model).blocks), eos_of(model)
    removals = {l: Removal(frozenset({l})) for l in range(L)}

    got: dict = {}
    split: dict = {}  # the last round's model calls of each contender: {kind: [calls, CPU s]}, the running one last

    def begin(name: str) -> None:
        split.pop(name, None)
        split[name] = {}

    def naive():
        g = Greedy(model, eos)
        begin("naive")
        got["naive"] = {l: [exact_match(g.generate(q.prompt, len(q.answer), r), q) for q in qs]
                        for l, r in removals.items()}

    def sweep():
        begin("sweep")
        got["sweep"] = generation_sweep(model, qs, removals, eos)

    def timed(m, args, kwargs, out=None):
        """Pre and post hook of the model's forward: its CPU time, by kind of call (a pass over many tokens, or
        a decode step of one), added to the running contender's split."""
        if out is None:
            m.t0 = time.process_time()
            return
        kind = "decode_steps" if kwargs["input_ids"].shape[1] == 1 else "passes"
        c = split[next(reversed(split))].setdefault(kind, [0, 0.0])
        c[0], c[1] = c[0] + 1, c[1] + time.process_time() - m.t0

    model.register_forward_pre_hook(timed, with_kwargs=True)
    model.register_forward_hook(timed, with_kwargs=True)
    with torch.no_grad():
        t = interleaved({"sweep": sweep, "naive": naive}, a.rounds, 1, warmup=0)
    base, cached = got["sweep"]
    assert cached == got["naive"], "the sweep and the independent generations disagree"
    kept = sum(map(sum, cached.values())) / (len(qs) * L)
    result = {"model": f"{name}, {L} blocks", "tasks": tasks, "questions": len(qs),
              "prompt_tokens_mean": sum(len(q.prompt) for q in qs) / len(qs),
              "answer_tokens_mean": sum(len(q.answer) for q in qs) / len(qs), "rounds": a.rounds,
              "base_exact_match": sum(base) / len(base),
              "exact_match_with_a_block_removed_mean": kept,
              "sweep_cpu_s": min(t["sweep"]), "L_independent_generations_cpu_s": min(t["naive"]),
              "sweep_over_L_generations": paired_ratio(t["sweep"], t["naive"]),
              "sweep_over_L_generations_best": best_ratio(t["sweep"], t["naive"]),
              "model_calls_last_round": {c: {k: {"calls": n, "cpu_s": sec} for k, (n, sec) in v.items()}
                                         for c, v in split.items()},
              "environment": environment()}
    for k, v in result.items():
        print(f"{k}: {v}")
    print(f"written: {write_result('generate_cost', result, a.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
