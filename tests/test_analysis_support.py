"""Builders shared by the analysis tests: tiny depthlab models and checkpoints, tiny HF models with a tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.tiny_models import (  # noqa: F401 (the tests' builders are the benchmarks': one home)
    HF_FAMILIES,
    TEXT,
    save_depthlab_checkpoint,
    save_hf_model,
    save_random_hf,
    tiny_hf_model,
    tiny_tokenizer,
    write_checkpoint,
    zero_block,
)
from depthlab.analysis.calibration import Batch


def random_batches(vocab: int, n: int = 2, B: int = 2, T: int = 24, seed: int = 0) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [Batch(torch.randint(0, vocab, (B, T), generator=g), torch.ones(B, T, dtype=torch.bool)) for _ in range(n)]


def hf_model_text_and_tasks(tmp_path: Path) -> tuple[Path, list[str], Path]:
    """A random HF Llama, a calibration text and a 4-question multiple-choice file under tmp_path: (the model, the
    analysis's data arguments, the task file)."""
    hf = save_hf_model(tmp_path / "hf", "llama")
    (tmp_path / "t.txt").write_text(TEXT)
    lines = [{"question": f"def f{i}(x):\n    return x *", "choices": [str(i), "x", "line"], "answer": i % 3}
             for i in range(4)]
    (tmp_path / "mc.jsonl").write_text("\n".join(json.dumps(q) for q in lines) + "\n")
    return hf, ["--data", str(tmp_path / "t.txt"), "--tokens", "64", "--seq-len", "32", "--no-jacobian",
                "--no-progress"], tmp_path / "mc.jsonl"
