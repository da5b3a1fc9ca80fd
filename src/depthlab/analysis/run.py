"""From a model path to results: load, read calibration text, batch, analyse. Shared by the CLI, `compare`
and the benchmark."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from depthlab import UserError
from depthlab.analysis.calibration import Batch, calibration_batches, read_calibration_text
from depthlab.analysis.layers import LayeredLM
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


@dataclass
class LayeredModel:
    lm: LayeredLM
    tokenizer: object  # tokenizers.Tokenizer (depthlab) or a transformers tokenizer (HF)
    seq_len: int  # the default window
    info: dict  # about the model, including "context": the longest window it takes


def load_layered(path: str, trust_remote_code: bool = False, dtype: str = "float32",
                 device: str = "cpu") -> LayeredModel:
    """Any model path (depthlab.rundir.load_model: a run, a checkpoint, an HF directory) as a LayeredLM, on
    `device` in `dtype` (the metrics are accumulated in fp32/fp64 whatever the model's dtype)."""
    from depthlab.analysis.layers import from_depthlab, from_hf
    from depthlab.rundir import Kind, load_model

    loaded = load_model(path, device, dtype, trust_remote_code=trust_remote_code)
    if loaded.kind is Kind.HF:
        info = {"model_type": loaded.model.config.model_type, "context": loaded.context}
        return LayeredModel(from_hf(loaded.model, loaded.path.name), loaded.tokenizer, loaded.seq_len, info)
    info = {"scheme": loaded.cfg.model.norm_scheme, "step": loaded.meta.get("step"), "checkpoint": str(loaded.path),
            "context": loaded.context}
    return LayeredModel(from_depthlab(loaded.model, Path(path).name or str(path)), loaded.fast_tokenizer(),
                        loaded.seq_len, info)


def _vocab_size(lm) -> int:
    return lm.head.weight.shape[0]


def _batches(req: Request, lm, tok, seq_len: int, context: int) -> tuple[list[Batch], str]:
    if seq_len > context:
        raise UserError(f"--seq-len {seq_len} is beyond the model's context of {context} tokens")
    texts, source = read_calibration_text(req.data, req.tokens)
    batches = calibration_batches(tok, texts, req.tokens, seq_len, req.batch_size, _vocab_size(lm))
    got = sum(b.n_tokens for b in batches)
    if got < req.tokens:  # the metrics then rest on too little text to mean much
        warnings.warn(f"only {got} calibration tokens in {source} (asked for {req.tokens}); the metrics are noisy: "
                      "give more text with --data", stacklevel=2)
    return [Batch(b.ids.to(req.device), b.mask.to(req.device)) for b in batches], source


def run_request(req: Request) -> dict:
    t0 = time.perf_counter()
    if req.layerwise:
        from depthlab.analysis.layerwise import load_skeleton

        skel, tok, seq_len, info = load_skeleton(req.model, req.trust_remote_code, req.dtype, req.device)
        lm = skel.lm
    else:
        loaded = load_layered(req.model, req.trust_remote_code, req.dtype, req.device)
        lm, tok, seq_len, info = loaded.lm, loaded.tokenizer, loaded.seq_len, loaded.info
    batches, source = _batches(req, lm, tok, req.seq_len or seq_len, info["context"])
    res = analyze_layerwise(skel, batches, req.options) if req.layerwise else analyze(lm, batches, req.options)
    res["model"] = {**lm.describe(), **info, "path": req.model}
    if req.layerwise:
        res["model"]["blocks"] = f"{lm.blocks_path} ({skel.n_layers} x {type(lm.blocks[0]).__name__}, one at a time)"
    res["data"] = {"source": source, "seq_len": req.seq_len or seq_len, "batch_size": req.batch_size}
    res["run"] = {"device": str(req.device), "dtype": req.dtype}
    res["wall_s"] = time.perf_counter() - t0
    return res
