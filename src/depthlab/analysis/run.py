"""From a model path to results: load, read calibration text, batch, analyse. Shared by the CLI, `compare`
and the benchmark."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from depthlab.analysis.calibration import Batch, calibration_batches, read_calibration_text
from depthlab.analysis.study import Options, analyze, analyze_layerwise


@dataclass
class Request:
    model: str
    data: list[str] | None = None
    tokens: int = 4096
    seq_len: int | None = None
    batch_size: int = 8
    layerwise: bool = False
    trust_remote_code: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    options: Options = field(default_factory=Options)


def _vocab_size(lm) -> int:
    return lm.head.weight.shape[0]


def run_request(req: Request) -> dict:
    t0 = time.perf_counter()
    if req.layerwise:
        from depthlab.analysis.layerwise import load_skeleton

        skel, tok, seq_len, info = load_skeleton(req.model, req.trust_remote_code, req.dtype, req.device)
        lm = skel.lm
    else:
        from depthlab.analysis.layers import load_model

        loaded = load_model(req.model, req.trust_remote_code, req.dtype, req.device)
        lm, tok, seq_len, info = loaded.lm, loaded.tokenizer, loaded.seq_len, loaded.info
    texts, source = read_calibration_text(req.data, req.tokens)
    batches = calibration_batches(tok, texts, req.tokens, req.seq_len or seq_len, req.batch_size, _vocab_size(lm))
    batches = [Batch(b.ids.to(req.device), b.mask.to(req.device)) for b in batches]
    res = analyze_layerwise(skel, batches, req.options) if req.layerwise else analyze(lm, batches, req.options)
    res["model"] = {**lm.describe(), **info, "path": req.model}
    if req.layerwise:
        res["model"]["blocks"] = f"{lm.blocks_path} ({skel.n_layers} x {type(lm.blocks[0]).__name__}, one at a time)"
    res["data"] = {"source": source, "seq_len": req.seq_len or seq_len, "batch_size": req.batch_size}
    res["run"] = {"device": str(req.device), "dtype": req.dtype}
    res["wall_s"] = time.perf_counter() - t0
    return res
