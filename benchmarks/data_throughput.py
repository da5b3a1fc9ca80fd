"""Data throughput, side by side in one run.

1. `data prepare` MB/s on the built-in corpus against a naive loop that calls `encode` one document at a time
   (same tokenizer, same documents, both writing a token file; BPE training is excluded from both).
2. Loader tokens/s (PackedSampler over the memory-mapped train.bin, the 130M preset's sequence length and
   micro-batch) against the tokens/s the llama-130m preset consumes in a training step on this machine.

    PYTHONPATH=src python benchmarks/data_throughput.py [--mb 8] [--workers 0] [--repeat 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from depthlab.data.prepare import prepare
from depthlab.data.prepared import load_prepared
from depthlab.data.sources import builtin_documents, builtin_files, read_text_file
from depthlab.data.tokenizer import eot_id, train_bpe
from depthlab.data.tokens import token_dtype

# Only light imports at the top: `data prepare` worker processes are spawned, and re-import this module.
from depthlab.model.families import preset


def naive_prepare(tok, mb: float, out: Path) -> None:
    """The loop the reference code amounts to: read a file, one `encode` call per document, append to a file.
    The same work as `data prepare` on the built-in corpus: list the files, read, encode, write."""
    eot, dtype = eot_id(tok), token_dtype(tok.get_vocab_size())
    with open(out, "wb") as f:
        for path in builtin_files(mb):
            text = read_text_file(path)
            np.asarray(tok.encode(text, add_special_tokens=False).ids + [eot], dtype=dtype).tofile(f)


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: less sensitive than wall time to a shared machine."""
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                          resource.RUSAGE_CHILDREN)))


def loader_tokens_per_s(tokens: np.ndarray, seq_len: int, batch: int, seconds: float = 2.0) -> float:
    from depthlab.data.dataset import PackedSampler

    sampler = PackedSampler(tokens, seq_len, batch, seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x, _ = sampler.next_batch()
        n += x.numel()
    return n / (time.perf_counter() - t0)


def model_tokens_per_s(device: str, batch: int, steps: int) -> float:
    """Forward + backward + AdamW step of the llama-130m preset; tokens per second after one warm-up step."""
    import torch

    from depthlab.model import Transformer, lm_loss

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
    ap.add_argument("--workers", type=int, default=0, help="worker processes in the second run (0: one per core)")
    ap.add_argument("--device", default="cpu", help="device for the 130M training step")
    ap.add_argument("--model-batch", type=int, default=4, help="sequences per 130M step")
    ap.add_argument("--model-steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs of each prepare variant")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    workers = args.workers or os.cpu_count() or 1
    docs = builtin_documents(args.mb)
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    tok = train_bpe((d.text for d in docs), args.vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok.save(str(tmp / "tok.json"))
        seconds = {"naive": [], "batch": [], "workers": []}
        cpu = {k: [] for k in seconds}
        for r in range(args.repeat):  # interleaved, best of `repeat`: the machine may be shared
            for name in seconds:
                t0, c0 = time.perf_counter(), cpu_seconds()
                if name == "naive":
                    naive_prepare(tok, args.mb, tmp / "naive.bin")
                else:  # auto: one process for this small input; or units spread over worker processes
                    prepare([], tmp / f"{name}{r}", tokenizer=str(tmp / "tok.json"), builtin_mb=args.mb,
                            workers=workers, unit_mb=mb / (4 * workers) if name == "workers" else None,
                            progress=False, log=lambda m: None)
                seconds[name].append(time.perf_counter() - t0)
                cpu[name].append(cpu_seconds() - c0)
        seconds, cpu = {k: min(v) for k, v in seconds.items()}, {k: min(v) for k, v in cpu.items()}
        naive_s = seconds["naive"]
        index, _, arrays = load_prepared(tmp / "batch0")
        n_tokens = sum(s["tokens"] for s in index["splits"].values())
        assert n_tokens == os.path.getsize(tmp / "naive.bin") // np.dtype(index["dtype"]).itemsize  # same work
        cfg = preset("llama-130m")
        micro = cfg.train.batch_size
        load = loader_tokens_per_s(arrays["train"], cfg.data.seq_len, micro)
    model = model_tokens_per_s(args.device, args.model_batch, args.model_steps)

    fig = {"corpus_mb": round(mb, 2), "documents": len(docs), "tokens": n_tokens, "vocab": tok.get_vocab_size(),
           "cpu_cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "workers": workers,
           "naive_encode_mb_s": round(mb / naive_s, 2),
           "prepare_batch_mb_s": round(mb / seconds["batch"], 2),
           "prepare_workers_mb_s": round(mb / seconds["workers"], 2),
           "cpu_s_per_mb": {k: round(v / mb, 3) for k, v in cpu.items()},
           "loader_tokens_s": round(load), "loader_batch": f"{micro} x {cfg.data.seq_len}",
           "model_device": args.device, "model_130m_tokens_s": round(model, 1),
           "loader_headroom": round(load / model)}
    print(f"corpus: {mb:.1f} MB, {len(docs)} documents, {n_tokens} tokens, vocab {fig['vocab']}, "
          f"{fig['cpu_cores']} cores")
    per_mb = fig["cpu_s_per_mb"]
    print(f"naive encode loop                {fig['naive_encode_mb_s']:8.2f} MB/s   {per_mb['naive']:.3f} CPU s/MB")
    print(f"data prepare, batch API          {fig['prepare_batch_mb_s']:8.2f} MB/s   {per_mb['batch']:.3f} CPU s/MB"
          f"  ({naive_s / seconds['batch']:.2f}x naive)")
    print(f"data prepare, {workers} worker processes {fig['prepare_workers_mb_s']:8.2f} MB/s   "
          f"{per_mb['workers']:.3f} CPU s/MB  ({naive_s / seconds['workers']:.2f}x naive)")
    print(f"machine load (1 min average): {fig['load_avg_1m']} on {fig['cpu_cores']} cores")
    print(f"loader ({fig['loader_batch']})           {load:14,.0f} tokens/s")
    print(f"llama-130m training step ({args.device}) {model:10,.1f} tokens/s -> loader headroom "
          f"{fig['loader_headroom']:,.0f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
