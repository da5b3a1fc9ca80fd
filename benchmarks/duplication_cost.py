"""Cost of the layer-duplication scan (`analyze --duplicate MAX_SPAN`) against independent evaluations of each
duplicated model, side by side in one process, on the same batches.

    PYTHONPATH=src:. OMP_NUM_THREADS=1 python -m benchmarks.duplication_cost      # a few CPU-minutes

(a) the cached scan: one traced pass per batch, then for each span i..j only the n repeated blocks and blocks
j+1..L-1 from the stream after block j (depthlab.analysis.duplication.duplication_scan, with its per-window sums
and the best span's bootstrap interval); (b) the yardstick: for each span, the model run whole with its block list
swapped for the duplicated order (L + n blocks), what `depthlab duplicate` then an evaluation compute. CPU time of
this process, contenders interleaved (benchmarks.common.interleaved), the ratio paired per round. It checks that
both give the same losses, and records the block-pass ratio the arithmetic predicts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks import common

OUT = Path(__file__).parent / "results" / "duplication_cost.json"


def random_llama(n_layers: int, dim: int, vocab: int, ffn: int):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=n_layers,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()


def bench(n_layers=12, dim=128, vocab=512, ffn=344, seq=128, batch=2, n_batches=1, max_span=3, reps=3) -> dict:
    from depthlab.analysis.calibration import Batch
    from depthlab.analysis.duplication import block_passes, duplication_scan, naive_scan
    from depthlab.analysis.layers import from_hf

    lm = from_hf(random_llama(n_layers, dim, vocab, ffn), "bench")
    g = torch.Generator().manual_seed(1)
    batches = [Batch(torch.randint(0, vocab, (batch, seq), generator=g), torch.ones(batch, seq, dtype=torch.bool))
               for _ in range(n_batches)]
    lm.discover(batches[0].ids, batches[0].mask)
    got = {}
    with torch.no_grad():
        times = common.interleaved({"cached_scan": lambda: got.update(scan=duplication_scan(lm, batches, max_span)),
                                    "independent": lambda: got.update(naive=naive_scan(lm, batches, max_span))},
                                   reps=reps, steps=1)
    scan, naive = got["scan"], got["naive"]
    err = max(abs(r["loss"] - naive[("dup", r["start_block"] - 1, r["end_block"] - 1)]) for r in scan["spans"])
    cached_blocks, naive_blocks = block_passes(n_layers, max_span)
    b = scan["best"]
    return {"model": f"random HF Llama, {n_layers} layers x {dim}, ffn {ffn}, vocab {vocab}; "
                     f"{n_batches}x{batch}x{seq} tokens",
            "max_span": max_span, "spans": len(scan["spans"]), "rounds": reps,
            "cached_scan_cpu_s": min(times["cached_scan"]), "independent_cpu_s": min(times["independent"]),
            "cached_over_independent": common.paired_ratio(times["cached_scan"], times["independent"]),
            "block_pass_ratio_theory": cached_blocks / naive_blocks, "max_loss_difference": err,
            "best_span": {"blocks": [b["start_block"], b["end_block"]], "delta_loss": b["delta_loss"]}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--max-span", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    res = {"environment": common.environment(),
           "scan": bench(n_layers=args.layers, max_span=args.max_span, reps=args.reps)}
    res["wall_s"] = time.perf_counter() - t0
    s = res["scan"]
    r = s["cached_over_independent"]
    print(f"{s['model']}, spans of 1..{s['max_span']} ({s['spans']} spans)")
    print(f"  cached scan {s['cached_scan_cpu_s']:.2f} s | independent evaluations {s['independent_cpu_s']:.2f} s "
          f"| ratio {r['median']:.3f} (rounds {r['min']:.3f}-{r['max']:.3f}; block passes alone "
          f"{s['block_pass_ratio_theory']:.3f}) | max loss difference {s['max_loss_difference']:.2e}")
    print(f"wall {res['wall_s']:.1f} s; written to {args.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
