"""The paper's Figure 1 at scale (PYTHONPATH=src:. nice -n 5 python -m benchmarks.figure_one [--part sweep|memory]).

sweep: `analyze --removal-tasks`'s sweep (the question traced once, each block's removal replayed from the cached
input of that block) against L independent evaluations of the model with one block swapped out (what `prune` then
`eval` compute), CPU time, interleaved rounds, on a 48-block depthlab model; both must score alike.
memory: a random 1.37B Llama saved in bf16 shards, `analyze --dtype bfloat16` with loss and task removal on a few
tokens, layer by layer and whole, each in a fresh process (peak RSS); both must give the same numbers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import best_ratio, environment, interleaved, paired_ratio, write_result

CODE = "".join(f"def f{j}(x):\n    return x * {j} + {j % 7}\n" for j in range(6))  # a few-shot-like context
QUESTION = json.dumps({"question": f"{CODE}def f9(x):\n    return x * 9 +", "choices": ["2", "x", "line", "y"],
                       "answer": 0}) + "\n"


def bench_sweep(tmp: Path, n_layers: int = 48, dim: int = 128, reps: int = 5) -> dict:
    from benchmarks.tiny_models import save_depthlab_checkpoint
    from depthlab.analysis.removal import BASE, single_plans
    from depthlab.analysis.run import load_layered
    from depthlab.analysis.tasks import TaskSums, naive_task_sweep, question_mask, sweep_agreement, task_sweep
    from depthlab.eval.suite import TaskSuite

    torch.manual_seed(0)
    ck = save_depthlab_checkpoint(tmp / "ck", "pre", n_layers, dim=dim, ffn_dim=4 * dim, max_seq_len=256)
    lm = load_layered(str(ck)).lm
    (tmp / "mc.jsonl").write_text(QUESTION)
    questions = TaskSuite.read([tmp / "mc.jsonl"]).for_model(ck)
    q0 = questions["mc"][0]
    lm.discover(q0.ids, question_mask(q0))
    worst, same = sweep_agreement(lm, questions)
    assert same and worst < 1e-3, worst
    plans = [BASE, *single_plans(n_layers)]
    with torch.no_grad():
        t = interleaved({"cached": lambda: task_sweep(lm, questions, plans, TaskSums()),
                         "naive": lambda: naive_task_sweep(lm, questions)}, reps, 1, warmup=0)
    L = n_layers
    return {"model": f"depthlab pre, {L} blocks x {dim}, vocab 300; 1 question of 4 choices x {q0.ids.shape[1]} "
            "tokens", "rounds": reps, "cached_sweep_cpu_s": min(t["cached"]),
            "L_independent_evaluations_cpu_s": min(t["naive"]), "max_ll_difference": worst,
            "cached_over_L_evaluations": paired_ratio(t["cached"], t["naive"]),
            "cached_over_L_evaluations_best": best_ratio(t["cached"], t["naive"]),
            "block_pass_ratio_theory": (L + L * (L - 1) / 2) / (L * (L - 1))}


# the child's own peak (VmHWM): getrusage's ru_maxrss also counts the parent's, inherited across exec
CHILD = """import sys
from depthlab.cli import main
main(sys.argv[1:])
print("VmHWM", open("/proc/self/status").read().split("VmHWM:")[1].split()[0], file=sys.stderr)"""


def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """`depthlab ARGS` in a fresh process: (its peak resident memory in MB, wall seconds)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args], check=True, capture_output=True, text=True)
    return int(p.stderr.rsplit("VmHWM", 1)[1].split()[0]) / 1024, time.perf_counter() - t0


def bench_memory(tmp: Path, layers: int = 24, dim: int = 2048, ffn: int = 5632, vocab: int = 32000) -> dict:
    """A random Llama (and a 2 x 64 one of the same vocabulary: what the command holds besides the model)."""
    import transformers

    from benchmarks.tiny_models import save_random_hf

    (tmp / "q.jsonl").write_text(QUESTION)
    out = {}
    for name, (n, d, f) in (("m", (layers, dim, ffn)), ("tiny", (2, 64, 128))):
        (tmp / name).mkdir()
        out[f"{name}_params"] = save_random_hf(tmp / name, transformers.LlamaConfig(
            hidden_size=d, intermediate_size=f, num_hidden_layers=n, num_attention_heads=16, vocab_size=vocab,
            max_position_embeddings=2048, bos_token_id=0, eos_token_id=0, dtype="bfloat16"))
    size = sum(f.stat().st_size for f in (tmp / "m").glob("*.safetensors")) / 2**20
    args = ["--dtype", "bfloat16", "--tokens", "16", "--seq-len", "16", "--batch-size", "1", "--no-jacobian",
            "--no-progress", "--removal-tasks", str(tmp / "q.jsonl")]
    out.update(model=f"random Llama, {layers} x {dim}, ffn {ffn}, vocab {vocab}: {out.pop('m_params') / 1e9:.2f}B "
               f"parameters, bf16 safetensors {size / 1024:.2f} GiB", weights_file_mb=size)
    for mode, path, extra in (("baseline_2x64_layer_by_layer", "tiny", ["--layer-by-layer"]),
                              ("layer_by_layer", "m", ["--layer-by-layer"]), ("whole_model", "m", [])):
        rss, wall = peak_rss_mb(["analyze", str(tmp / path), *args, *extra, "--out", str(tmp / mode)])
        out[mode] = {"peak_rss_mb": rss, "over_weights_file": rss / size, "wall_s": wall}
    a, b = (json.loads((tmp / m / "metrics.json").read_text()) for m in ("layer_by_layer", "whole_model"))
    ta, tb = (r["task_removal"]["tasks"]["q"]["single"] for r in (a, b))
    return {**out, "max_task_ll_difference": max(abs(x["ll"] - y["ll"]) for x, y in zip(ta, tb)),
            "same_task_picks": all(x["acc"] == y["acc"] for x, y in zip(ta, tb)),
            "max_loss_difference": max(abs(x["loss"] - y["loss"]) for x, y in zip(a["removal"]["single"],
                                                                                   b["removal"]["single"]))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=["sweep", "memory", "all"], default="all")
    args = p.parse_args()
    torch.set_num_threads(1)
    path = Path(__file__).parent / "results" / "figure_one.json"
    res = json.loads(path.read_text()) if path.is_file() and args.part != "all" else {}  # a part updates the file
    res["environment"] = environment()
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("sweep", "all"):
            res["sweep"] = bench_sweep(Path(tmp))
        if args.part in ("memory", "all"):
            res["memory"] = bench_memory(Path(tmp))
    print(json.dumps(res, indent=2))
    write_result("figure_one", res)


if __name__ == "__main__":
    main()
