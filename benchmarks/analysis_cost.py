"""Cost of the analysis: the single-layer removal sweep against the naive L full forward passes, peak memory of
layer-by-layer mode against whole-model mode, and each panel model's default analysis in forward-pass equivalents.

    PYTHONPATH=src python benchmarks/analysis_cost.py            # sweep and memory, a few minutes on 2 CPU cores
    PYTHONPATH=src python benchmarks/analysis_cost.py --part sweep
    PYTHONPATH=src:. python benchmarks/analysis_cost.py --part passes   # counted: results/analysis_passes.json

The sweep part times, in one process and on the same batches: (a) the cached sweep (one traced pass, then for
each removed block l only blocks l+1..L and the head), (b) L independent full passes with block l swapped out.
It checks that both give the same losses. The memory part runs `depthlab analyze` on a saved checkpoint in two
fresh processes (whole-model and --layer-by-layer, same options) and reads each one's peak resident memory.

The passes part counts, rather than times, what the default analysis of each panel model computes (`analyze
--tokens 2048 --seq-len 256 --batch-size 8 --no-jacobian`, whole-model): every token a block or the head is applied
to, by the part of the analysis it is applied in. The count is structural, so it is made on a tiny random model of
the same family with the same blocks (their number and kinds) and the same batches, and weighed by the real
model's multiply-accumulates per token (a block's parameters; the head's, vocabulary x width; attention scores
over 256 positions are left out: under 5% of a block at these widths). One forward-pass equivalent is the model's
own forward pass over the 2,048 tokens: L blocks and the head for each token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def tiny_config(dim: int, n_layers: int, vocab: int, ffn: int):
    from depthlab.config import ModelConfig

    return ModelConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=4, ffn_dim=ffn, max_seq_len=512)


def bench_sweep(dim=256, n_layers=16, vocab=1024, ffn=688, seq=128, batch=4, n_batches=1, reps=5) -> dict:
    from depthlab.analysis.calibration import Batch
    from depthlab.analysis.layers import from_depthlab
    from depthlab.analysis.removal import RemovalSums, naive_single_layer_sweep, single_layer_sweep
    from depthlab.model import Transformer

    torch.manual_seed(0)
    lm = from_depthlab(Transformer(tiny_config(dim, n_layers, vocab, ffn)).eval(), "bench")
    batches = [Batch(torch.randint(0, vocab, (batch, seq)), torch.ones(batch, seq, dtype=torch.bool))
               for _ in range(n_batches)]
    lm.discover(batches[0].ids, batches[0].mask)  # also the warm-up
    t_full, t_cached, t_naive = [], [], []
    with torch.no_grad():
        # The CPUs are shared: measure this process's CPU time (not wall time), interleave the three
        # measurements, and report the median over `reps` of each round's ratios.
        for _ in range(reps):
            t0 = time.process_time()
            for _ in range(n_layers):  # the yardstick: L independent full forward passes
                for b in batches:
                    lm.forward_fn(b.ids, b.mask)
            t_full.append(time.process_time() - t0)
            t0 = time.process_time()
            sums = RemovalSums(n_layers)
            for b in batches:
                single_layer_sweep(lm, b, lm.trace(b.ids, b.mask), sums)
            t_cached.append(time.process_time() - t0)
            t0 = time.process_time()
            naive = naive_single_layer_sweep(lm, batches)
            t_naive.append(time.process_time() - t0)
    cached = [s["loss"] for s in sums.results(n_layers)["single"]]
    err = max(abs(a - b) for a, b in zip(cached, naive))
    return {"model": f"depthlab pre, {n_layers} layers x {dim}, vocab {vocab}, {n_batches}x{batch}x{seq} tokens",
            "rounds": reps, "L_full_passes_cpu_s": statistics.median(t_full),
            "cached_sweep_cpu_s": statistics.median(t_cached), "naive_sweep_cpu_s": statistics.median(t_naive),
            "cached_over_L_full_passes": statistics.median(c / f for c, f in zip(t_cached, t_full)),
            "cached_over_naive": statistics.median(c / n for c, n in zip(t_cached, t_naive)),
            "block_pass_ratio_theory": (n_layers + 1) / (2 * n_layers), "max_loss_difference": err}


CHILD = """import resource, runpy, sys
sys.argv = ["depthlab"] + sys.argv[1:]
if sys.argv[1:] != ["--imports-only"]:
    try:
        runpy.run_module("depthlab", run_name="__main__")
    except SystemExit:
        pass
else:
    import torch, matplotlib.pyplot, depthlab.analysis.analyze, depthlab.analysis.report, depthlab.analysis.layerwise
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """Run `depthlab ARGS` in a fresh process; (that process's own peak RSS in MB, wall seconds)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    kb = int(next(line for line in p.stderr.splitlines() if line.startswith("PEAK_KB")).split()[1])
    return kb / 1024, wall


def bench_memory(dim=512, n_layers=16, vocab=4096, ffn=1376, tokens=512) -> dict:
    from benchmarks.tiny_models import tiny_tokenizer, write_checkpoint
    from depthlab.config import Config
    from depthlab.model import Transformer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config()
        cfg.model = tiny_config(dim, n_layers, vocab, ffn)
        cfg.data.seq_len = 128
        model = Transformer(cfg.model)
        n_params = model.num_params()
        ck = write_checkpoint(Path(tmp) / "ck", model, cfg, {"step": 0}, tiny_tokenizer(vocab))
        del model
        base = ["analyze", str(ck), "--tokens", str(tokens), "--no-removal", "--no-jacobian", "--batch-size", "4"]
        out = {"imports_only": {"peak_rss_mb": peak_rss_mb(["--imports-only"])[0]}}
        for name, extra in (("layer_by_layer", ["--layer-by-layer"]), ("whole_model", [])):
            rss, wall = peak_rss_mb(base + extra + ["--out", str(Path(tmp) / name)])
            out[name] = {"peak_rss_mb": rss, "above_imports_mb": rss - out["imports_only"]["peak_rss_mb"],
                         "wall_s": wall}
        out["model"] = f"depthlab pre, {n_layers} layers x {dim}, vocab {vocab}: {n_params / 1e6:.1f}M params, " \
                       f"{n_params * 4 / 2**20:.0f} MiB fp32; {tokens} calibration tokens"
        return out


# The panel (docs/analysis.md): each model's real shape, from the config its dequantized GGUF directory carries.
PANEL = {
    "SmolLM2-135M": dict(model_type="llama", num_hidden_layers=30, hidden_size=576, intermediate_size=1536,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         tie_word_embeddings=True),
    "Gemma-3-270M": dict(model_type="gemma3_text", num_hidden_layers=18, hidden_size=640, intermediate_size=2048,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                         tie_word_embeddings=True, sliding_window=512,
                         layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3),
    "Qwen2.5-0.5B": dict(model_type="qwen2", num_hidden_layers=24, hidden_size=896, intermediate_size=4864,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False),
}
TINY = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            vocab_size=64, max_position_embeddings=512)


def macs_per_token(shape: dict) -> tuple[float, float]:
    """(one block's, the head's) multiply-accumulates per token at the real size: parameters counted on the meta
    device (nothing allocated)."""
    import transformers

    config = transformers.AutoConfig.for_model(**shape)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    block = sum(p.numel() for n, p in model.model.layers[0].named_parameters() if p.dim() == 2)
    return float(block), float(shape["vocab_size"] * shape["hidden_size"])


class PassCounter:
    """Tokens through each block and through the head, by the part of the analysis they are computed in (the
    innermost of the wrapped functions running: discovery, the traced passes, the removal sweep, the lens; the rest
    is "other")."""

    PARTS = {"discovery": ("layers", "LayeredLM.discover"), "traced passes": ("layers", "LayeredLM.trace"),
             "removal": ("analyze", "single_layer_sweep"), "lens": ("analyze", "subsampled_lens")}

    def __init__(self):
        self.stack, self.blocks, self.heads = ["other"], {}, {}

    def wrap(self, label: str, fn):
        def wrapped(*args, **kwargs):
            self.stack.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
        return wrapped

    def add(self, where: dict, h: torch.Tensor) -> None:
        where[self.stack[-1]] = where.get(self.stack[-1], 0) + h.shape[:-1].numel()

    def hook(self, lm) -> None:
        first = lambda args, kwargs: args[0] if args else kwargs["hidden_states"]  # noqa: E731
        for blk in lm.blocks:
            blk.register_forward_pre_hook(lambda m, a, k: self.add(self.blocks, first(a, k)), with_kwargs=True)
        lm.head.register_forward_pre_hook(lambda m, a: self.add(self.heads, a[0]))


def count_passes(shape: dict, tokens: int = 2048, seq_len: int = 256, batch_size: int = 8, chosen_runs=None,
                 **options) -> dict:
    """The default analysis of a tiny model of `shape`'s family and blocks, counted (`PassCounter`), in forward-pass
    equivalents of the real shape: per part, and in all. Which contiguous runs are removed depends on the weights
    (the angular distances choose them): `chosen_runs`, [(start block from 1, n)], are those a real analysis chose,
    else the tiny random model's are counted. `options`: the analysis's (Options), besides no Jacobians."""
    from contextlib import ExitStack
    from unittest import mock

    import transformers

    import depthlab.analysis.analyze as analyze_module
    import depthlab.analysis.layers as layers_module
    from depthlab.analysis.analyze import Options, analyze
    from depthlab.analysis.calibration import Batch
    from depthlab.analysis.layers import from_hf

    block, head = macs_per_token(shape)
    L = shape["num_hidden_layers"]
    tiny = {**shape, **TINY}
    if shape["model_type"] == "qwen2":
        tiny.pop("head_dim")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**tiny),
                                                          attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TINY["vocab_size"], (tokens // seq_len, seq_len), generator=g)
    batches = [Batch(ids[i:i + batch_size], torch.ones(len(ids[i:i + batch_size]), seq_len, dtype=torch.bool))
               for i in range(0, len(ids), batch_size)]
    counter = PassCounter()
    lm = from_hf(model, "tiny")
    counter.hook(lm)
    modules = {"layers": layers_module, "analyze": analyze_module}
    with ExitStack() as stack:
        if chosen_runs is not None:
            from depthlab.analysis.removal import run_plans

            stack.enter_context(mock.patch.object(analyze_module, "later_plans", lambda *a: run_plans(
                [(start - 1, n) for start, n in chosen_runs])))
        for label, (module, name) in PassCounter.PARTS.items():
            owner, _, attr = name.rpartition(".")
            target = getattr(modules[module], owner) if owner else modules[module]
            stack.enter_context(mock.patch.object(target, attr, counter.wrap(label, getattr(target, attr))))
        with torch.no_grad():
            analyze(lm, batches, Options(jacobian=False, **options))
    unit = tokens * (L * block + head)
    parts = sorted(set(counter.blocks) | set(counter.heads))
    per = {p: (counter.blocks.get(p, 0) * block + counter.heads.get(p, 0) * head) / unit for p in parts}
    return {"blocks": L, "block_macs_per_token": block, "head_macs_per_token": head,
            "head_over_forward": head / (L * block + head), "block_tokens": counter.blocks,
            "head_tokens": counter.heads, "forward_pass_equivalents": per, "total": sum(per.values()),
            "removal_floor": (L * (L - 1) / 2 * block + L * head) / (L * block + head)}


RESULT = Path(__file__).parent / "results" / "analysis_passes.json"  # --part passes writes it
RECORDED_RUNS = {"SmolLM2-135M": Path(__file__).parent / "results" / "real_model" / "removal_prose.json"}


def recorded_runs(name: str) -> list[tuple[int, int]] | None:
    """The contiguous runs the real model's recorded analysis removed (start block from 1, n), where there is one."""
    path = RECORDED_RUNS.get(name)
    if path is None or not path.is_file():
        return None
    return [(r["start_block"], r["n"]) for r in json.loads(path.read_text())["runs"]]


def bench_passes() -> dict:
    """Per panel model: the default analysis (the runs of the real model's record where there is one, else the tiny
    random model's), and the same without the runs (`--no-removal-runs`)."""
    out = {}
    for name, shape in PANEL.items():
        runs = recorded_runs(name)
        out[name] = {"default": count_passes(shape, chosen_runs=runs), "runs_from": "the real model's record" if runs
                     else "the tiny random model (not the real model's)",
                     "no_removal_runs": count_passes(shape, runs=False)}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=["sweep", "memory", "passes", "all"], default="all")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = {"torch_threads": torch.get_num_threads()}
    if args.part in ("sweep", "all"):
        res["sweep"] = bench_sweep()
    if args.part in ("memory", "all"):
        res["memory"] = bench_memory()
    if args.part == "passes":
        res["passes"] = bench_passes()
        RESULT.write_text(json.dumps(res["passes"], indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
