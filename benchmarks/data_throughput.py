"""Data throughput, side by side in one run.

1. `data prepare` MB/s on the built-in corpus against a naive loop that calls `encode` one document at a time
   (same tokenizer, same documents, both writing a token file; BPE training is excluded from both).
2. Loader tokens/s (PackedSampler over the memory-mapped train.bin, the 130M preset's sequence length and
   micro-batch) against the tokens/s the llama-130m preset consumes in a training step on this machine.

    PYTHONPATH=src python benchmarks/data_throughput.py [--mb 8] [--workers 0] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from depthlab.config import preset
from depthlab.data.dataset import PackedSampler
from depthlab.data.prepare import load_prepared, prepare
from depthlab.data.sources import builtin_documents
from depthlab.data.tokenizer import eot_id, train_bpe
from depthlab.data.tokens import token_dtype
from depthlab.model import Transformer, lm_loss


def naive_prepare(tok, docs, out: Path) -> None:
    """The loop the reference code amounts to: one `encode` call per document, appended to a file."""
    eot, dtype = eot_id(tok), token_dtype(tok.get_vocab_size())
    with open(out, "wb") as f:
        for d in docs:
            np.asarray(tok.encode(d.text, add_special_tokens=False).ids + [eot], dtype=dtype).tofile(f)


def loader_tokens_per_s(tokens: np.ndarray, seq_len: int, batch: int, seconds: float = 2.0) -> float:
    sampler = PackedSampler(tokens, seq_len, batch, seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x, _ = sampler.next_batch()
        n += x.numel()
    return n / (time.perf_counter() - t0)


def model_tokens_per_s(device: str, batch: int, steps: int) -> float:
    """Forward + backward + AdamW step of the llama-130m preset; tokens per second after one warm-up step."""
    cfg = preset("llama-130m")
    model = Transformer(cfg.model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.model.vocab_size, (batch, cfg.data.seq_len + 1), device=device)
    bf16 = device.startswith("cuda")
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = lm_loss(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if bf16:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return batch * cfg.data.seq_len / float(np.median(times[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=8.0, help="built-in corpus size")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--workers", type=int, default=0, help="data prepare workers (0: one per core)")
    ap.add_argument("--device", default="cpu", help="device for the 130M training step")
    ap.add_argument("--model-batch", type=int, default=4, help="sequences per 130M step")
    ap.add_argument("--model-steps", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    docs = builtin_documents(args.mb)
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    tok = train_bpe((d.text for d in docs), args.vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok.save(str(tmp / "tok.json"))
        t0 = time.perf_counter()
        naive_prepare(tok, docs, tmp / "naive.bin")
        naive_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepare([], tmp / "prepared", tokenizer=str(tmp / "tok.json"), builtin_mb=args.mb, workers=args.workers,
                progress=False, log=lambda m: None)
        prepare_s = time.perf_counter() - t0
        index, _, arrays = load_prepared(tmp / "prepared")
        n_tokens = sum(s["tokens"] for s in index["splits"].values())
        assert n_tokens == os.path.getsize(tmp / "naive.bin") // np.dtype(index["dtype"]).itemsize  # same work
        cfg = preset("llama-130m")
        micro = cfg.train.batch_size
        load = loader_tokens_per_s(arrays["train"], cfg.data.seq_len, micro)
    model = model_tokens_per_s(args.device, args.model_batch, args.model_steps)

    fig = {"corpus_mb": round(mb, 2), "documents": len(docs), "tokens": n_tokens, "vocab": tok.get_vocab_size(),
           "cpu_cores": os.cpu_count(), "workers": args.workers or os.cpu_count(),
           "naive_encode_mb_s": round(mb / naive_s, 2), "prepare_mb_s": round(mb / prepare_s, 2),
           "prepare_speedup": round(naive_s / prepare_s, 2),
           "loader_tokens_s": round(load), "loader_batch": f"{micro} x {cfg.data.seq_len}",
           "model_device": args.device, "model_130m_tokens_s": round(model),
           "loader_headroom": round(load / model, 1)}
    print(f"corpus: {mb:.1f} MB, {len(docs)} documents, {n_tokens} tokens, vocab {fig['vocab']}, "
          f"{fig['cpu_cores']} cores")
    print(f"naive encode loop        {fig['naive_encode_mb_s']:8.2f} MB/s")
    print(f"data prepare ({fig['workers']} workers) {fig['prepare_mb_s']:8.2f} MB/s  ({fig['prepare_speedup']}x)")
    print(f"loader ({fig['loader_batch']})   {load:12,.0f} tokens/s")
    print(f"llama-130m step ({args.device}) {model:10,.0f} tokens/s  -> loader headroom {fig['loader_headroom']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
