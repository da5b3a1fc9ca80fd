"""From a model path to results: load, read calibration text (or a ViT's validation images), batch, analyse.
Shared by the CLI, `compare` and the benchmark."""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from depthlab import UserError
from depthlab.analysis.analyze import Options, analyze, analyze_layerwise
from depthlab.analysis.calibration import (
    Batch,
    ImageBatch,
    calibration_windows,
    image_batches,
    read_calibration_text,
    split_windows,
    to_batches,
)
from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.profiles import removal_profiles
from depthlab.analysis.results import IMAGE_CLASSIFICATION, LANGUAGE_MODELLING, kind_of
from depthlab.checkpoint import CheckpointMeta
from depthlab.eval.suite import TaskSuite
from depthlab.progress import phase, plan_phases, unnumbered


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
    images: int | None = None  # a ViT's calibration images (default: the whole validation split)
    at_init: bool = True  # also index the same model at initialisation, when its config is known (depthlab runs)
    windows: int | None = None  # sample this many windows (seeded) over the whole calibration text instead
    window_seed: int = 0
    tasks: TaskSuite | None = None  # what removal is also scored by: `tasks.for_model(path, trust_remote_code)`
    # gives {task: [ScoredQuestion]} (depthlab.eval.suite; see depthlab.analysis.tasks)
    linear_fit_tokens: int = 4096  # with options.linear: the windows the linear maps are fitted on
    device_map: str | dict | None = None  # place the model over several devices (depthlab.loading.place): auto,
    # balanced, sequential or {module name: device}; `device` is then the main device the map gives
    max_memory: dict | None = None  # with a device-map strategy: {device: size} (accelerate's max_memory)
    offload_folder: str | None = None  # with a device map putting weights on disk: where they are written
    generate: list | None = None  # generation tasks to score removal by (depthlab.eval.gen_tasks.GenTask)
    gutenberg: bool = False  # each --data file a Project Gutenberg play: its licence header left out


@dataclass
class LayeredModel:
    lm: LayeredLM
    tokenizer: object  # tokenizers.Tokenizer (depthlab) or a transformers tokenizer (HF); None for a ViT
    seq_len: int  # the default window
    info: dict  # about the model, including "context": the longest window it takes
    cfg: object = None  # the depthlab Config (None for HF)
    meta: CheckpointMeta | None = None  # the checkpoint's (a ViT's pixel statistics in its data); None for HF
    device: str = "cpu"  # where its inputs go (a model placed by a device map: its main device)
    device_map: dict | None = None  # where a placed model has each module


def load_layered(path: str, trust_remote_code: bool = False, dtype: str = "float32", device: str = "cpu",
                 device_map: str | dict | None = None, max_memory: dict | None = None,
                 offload_folder: str | None = None) -> LayeredModel:
    """Any model path (depthlab.loading.load_model: a run, a checkpoint, an HF directory) as a LayeredLM, on
    `device` in `dtype` (the metrics are accumulated in fp32/fp64 whatever the model's dtype), or placed over
    several devices by `device_map` (with what the analysis reads gathered on the main device)."""
    from depthlab.analysis.layers import from_depthlab, from_hf
    from depthlab.loading import load_model
    from depthlab.paths import Kind

    if device_map is not None and task_of(path) == IMAGE_CLASSIFICATION:  # before the model loads
        raise UserError(f"{path} is a ViT: a device map places language models (a ViT is analysed on one device)")
    loaded = load_model(path, device, dtype, trust_remote_code=trust_remote_code, device_map=device_map,
                        max_memory=max_memory, offload_folder=offload_folder)
    if loaded.kind is Kind.HF:
        info = {"model_type": loaded.model.config.model_type, "context": loaded.context}
        lm, tok, cfg, meta = from_hf(loaded.model, loaded.path.name), loaded.tokenizer, None, None
    else:
        info = {"scheme": loaded.cfg.model.norm_scheme, "step": loaded.meta.step, "checkpoint": str(loaded.path),
                "context": loaded.context}
        lm = from_depthlab(loaded.model, Path(path).name or str(path))
        if lm.classifier:
            info = {**info, "family": "vit", "pool": loaded.cfg.model.pool}
        tok, cfg, meta = None if lm.classifier else loaded.fast_tokenizer(), loaded.cfg, loaded.meta
    if loaded.device_map is not None:
        lm.gather_on(loaded.device)
    return LayeredModel(lm, tok, loaded.seq_len, info, cfg, meta, str(loaded.device), loaded.device_map)


def index_at_init(cfg, batches: list, opts: Options, device: str, device_map: dict | None = None,
                  offload_folder: str | None = None, layerwise: bool = False) -> dict:
    """The curse index of a depthlab model rebuilt from its config at initialisation (the run's seed), on the same
    batches: what the trained model's index is to be read against; placed by the trained model's device map when
    that one was, or (layerwise) drawn into files and read block by block as layer-by-layer mode reads a model."""
    import tempfile

    import torch

    from depthlab.analysis.layers import from_depthlab
    from depthlab.loading import place
    from depthlab.model import build_model

    torch.manual_seed(cfg.train.seed)
    # block removal alone: the index kept here has no contiguous runs
    index_only = dataclasses.replace(opts, sublayers=False, linear=False, drop_lowest=0, duplicate=0, runs=False)
    if layerwise:
        from depthlab.analysis.layerwise import init_skeleton

        with tempfile.TemporaryDirectory() as tmp:
            idx = analyze_layerwise(init_skeleton(cfg, Path(tmp), device), batches, index_only)["curse_index"]
    else:
        model = build_model(cfg.model).eval()
        lm = from_depthlab(model if device_map is not None else model.to(device), "init")
        if device_map is not None:
            lm.gather_on(place(model, device_map, offload_folder=offload_folder)[1])
        idx = analyze(lm, batches, index_only)["curse_index"]
    return {k: v for k, v in idx.items() if k not in ("angular_rows", "contiguous")}


def _record_gguf(res: dict, path: str) -> None:
    """A model read from a GGUF file: its file and quantization in the results, and a note in the report."""
    from depthlab.gguf import note, source_of

    info = source_of(path)
    if info is not None:
        res["model"]["gguf"] = info
        res["notes"] = [*res.get("notes", []), note(info)]


def task_of(path: str) -> str:
    """What a model path (or an earlier analysis folder) holds, as a result kind (depthlab.analysis.results): image
    classification for a depthlab ViT, else language modelling. Reads configs only; checks the path as `model_path`
    does."""
    from depthlab.checkpoint import CONFIG
    from depthlab.config import Config
    from depthlab.paths import ANALYSIS_RESULTS, Kind, model_path, what_is

    if what_is(path) is Kind.ANALYSIS:
        p = Path(path) / ANALYSIS_RESULTS[0]
        return kind_of(json.loads(p.read_text())) if p.is_file() else LANGUAGE_MODELLING
    kind, ckpt = model_path(path, warn=lambda msg: None)
    if kind is Kind.HF or not Config.load(ckpt / CONFIG).model.is_vit:
        return LANGUAGE_MODELLING
    return IMAGE_CLASSIFICATION


def _vocab_size(lm) -> int:
    return lm.head.weight.shape[0]


def own_val_tokens(checkpoint: str, meta: CheckpointMeta | None):
    """A depthlab run's own held-out tokens (the validation split it kept), or None (an HF model, an older run)."""
    from depthlab.data.dataset import saved_val_tokens
    from depthlab.paths import run_of

    if meta is None or meta.data.get("task") == "finetune":
        return None
    try:
        return saved_val_tokens(run_of(Path(checkpoint)), meta.data.get("val_digest"))
    except (OSError, ValueError):
        return None


def _own_batches(req: Request, stream, seq_len: int, after: bool) -> tuple[list[Batch], list[Batch], str]:
    """Windows of a run's own held-out tokens: the first --tokens (or --windows sampled over all of them), each with
    the token after it when `after` (pack_windows)."""
    import numpy as np

    from depthlab.analysis.calibration import pack_windows, sample_windows

    if req.options.linear:
        raise UserError("--linear-replacement fits its maps on text after the evaluation windows: give that text "
                        "with --data")
    stream = np.asarray(stream)
    windows = (list(sample_windows(stream, req.windows, seq_len, req.window_seed)) if req.windows else
               pack_windows(stream, req.tokens, seq_len, after))
    batches = to_batches([np.asarray(w, dtype=np.int64) for w in windows], 0, req.batch_size)
    source = f"the run's own held-out tokens (its validation split, {len(stream):,} tokens)"
    move = lambda bs: [Batch(b.ids.to(req.device), b.mask.to(req.device)) for b in bs]  # noqa: E731
    return move(batches), [], source


def batches_for(req: Request, lm, tok, seq_len: int, context: int, own=None) -> tuple[list[Batch], list[Batch], str]:
    """(evaluation batches, the linear maps' fit batches: the windows after them, source); `own`: a run's held-out
    tokens, read when no --data is given."""
    if seq_len > context:
        raise UserError(f"--seq-len {seq_len} is beyond the model's context of {context} tokens")
    after = seq_len < context  # a packed stream's windows scored as `eval ppl` scores them, where the context allows
    if own is not None and not req.data:
        return _own_batches(req, own, seq_len, after)
    fit_tokens = req.linear_fit_tokens if req.options.removal and req.options.linear else 0
    fit_windows = -(-fit_tokens // seq_len)
    # a sample is spread over more text than it reads (the built-in corpus is read up to what is asked for)
    texts, source = read_calibration_text(req.data, (req.windows + fit_windows) * seq_len * 8 if req.windows
                                          else req.tokens + fit_tokens, req.gutenberg)
    # one window more than asked: the evaluation windows may hold up to a window more than --tokens
    windows, pad = calibration_windows(tok, texts, req.tokens + fit_tokens + (seq_len if fit_tokens else 0),
                                       seq_len, _vocab_size(lm), req.windows and req.windows + fit_windows,
                                       req.window_seed, req.options.progress, after)
    if req.windows:
        windows, fit = windows[:req.windows], windows[req.windows:]
    else:
        windows, fit = split_windows(windows, req.tokens)
        fit = split_windows(fit, fit_tokens)[0] if fit_tokens else []
    if fit_tokens and not fit:
        raise UserError(f"{source} holds no text after the {len(windows)} evaluation windows to fit the linear maps "
                        "on: give more text with --data, or fewer --tokens")
    batches = to_batches(windows, pad, req.batch_size)
    got = sum(b.n_tokens for b in batches)
    if req.windows:
        source += f"; {sum(len(b.ids) for b in batches)} windows sampled over all of it (seed {req.window_seed})"
    elif got < req.tokens:  # the metrics then rest on too little text to mean much
        warnings.warn(f"only {got} calibration tokens in {source} (asked for {req.tokens}); the metrics are noisy: "
                      "give more text with --data", stacklevel=2)
    if fit:
        source += f"; the linear maps fitted on the {len(fit)} windows after those ({sum(map(len, fit))} tokens)"
    move = lambda bs: [Batch(b.ids.to(req.device), b.mask.to(req.device)) for b in bs]  # noqa: E731
    return move(batches), move(to_batches(fit, pad, req.batch_size)), source


def questions_for(req: Request, lm) -> dict | None:
    """The task questions for this model's tokenizer, on its device."""
    if req.tasks is None or not req.options.removal:
        return None
    from depthlab.analysis.tasks import questions_to

    questions = req.tasks.for_model(req.model, req.trust_remote_code)
    top = max((int(q.ids.max()) for qs in questions.values() for q in qs), default=0)
    if top >= _vocab_size(lm):
        raise UserError(f"the tokenizer produced id {top} in the task questions, beyond the model's vocabulary of "
                        f"{_vocab_size(lm)}")
    return questions_to(questions, req.device)


def generation_for(req: Request, lm, tok) -> dict | None:
    """The generation tasks as token ids for this model's tokenizer: {task: [GenQuestion]}."""
    if not req.generate:
        return None
    if lm.kind != "hf" or lm.home is not None:
        raise UserError("--removal-generate decodes with a Hugging Face model's KV cache on one device: "
                        f"{req.model} is {'placed by a device map' if lm.kind == 'hf' else 'a depthlab model'}"
                        f"{'' if lm.kind == 'hf' else ' (export it with `depthlab export` first)'}")
    from depthlab.eval.generate import encode_pair

    encode = lambda text: tok(text)["input_ids"]  # noqa: E731
    return {t.name: [encode_pair(encode, p, a) for p, a in t.pairs] for t in req.generate}


def _image_batches(req: Request, loaded: LayeredModel) -> tuple[list[ImageBatch], dict]:
    if req.seq_len is not None:
        raise UserError("--seq-len does not apply to a ViT: each image is one sequence of patch tokens")
    if req.tokens != Request.tokens or req.windows is not None:  # else dropped without a word
        raise UserError(f"{'--windows' if req.windows is not None else '--tokens'} is a language model's calibration "
                        "size; a ViT's is --images")
    batches, source = image_batches(loaded.cfg, loaded.meta, req.data, req.images, req.batch_size, req.device)
    return batches, {"source": source, "images": sum(len(b.labels) for b in batches), "batch_size": req.batch_size}


def check_interior(n_layers: int, spec) -> None:
    """The curse index reads the interior blocks; an interior with none would drop it without a word: refused
    when --interior was chosen, said when the default leaves none of a shallow model's blocks."""
    from depthlab.analysis.curse import CurseSpec, interior

    if interior(n_layers, spec):
        return
    what = f"--interior {spec.skip_first} {spec.skip_last} leaves no interior block of this {n_layers}-block model"
    if (spec.skip_first, spec.skip_last) != (CurseSpec.skip_first, CurseSpec.skip_last):
        raise UserError(f"{what}, and the curse index reads only those: keep FIRST + LAST below {n_layers}")
    warnings.warn(f"{what} (the default), so the report has no curse index; --interior 0 0 indexes every block",
                  stacklevel=2)


def analysis_phases(req: Request, at_init: bool) -> list[str]:
    """The phases `run_request` goes through, in order, as its progress lines count them (depthlab.progress), and
    the report's writing after them (cli.cmd_analyze)."""
    o = req.options
    later = o.removal and (o.runs or o.drop_lowest)
    if req.layerwise:
        names = ["blocks, every plan's streams", "lens and distances",
                 *(["blocks, runs and the k least useful"] if later else [])]
    else:
        names = [*(["linear fit"] if o.removal and o.linear else []),
                 "metrics and removal" if o.removal else "metrics",
                 *(["removal of runs and of the k least useful"] if later else []),
                 *(["duplication scan"] if o.duplicate else []), *(["jacobians"] if o.jacobian else [])]
    return ["loading the model", *names, *(["the index at initialisation"] if at_init else []), "writing the report"]


def _inputs(req: Request, lm, tok, seq_len: int, info: dict, loaded) -> tuple[list, list, dict | None, dict]:
    """What the model is scored on: its batches, the fit windows, the multiple-choice questions and how the data
    is described in the result (`loaded`: the whole model as loaded, None layer by layer)."""
    fit, questions = [], None
    if lm.classifier:
        given = [f for f, v in (("--removal-tasks", req.tasks is not None), ("--linear-replacement",
                 req.options.linear), ("--removal-generate", req.generate)) if v]
        if given:
            raise UserError(f"{given[0]} is for language models; a ViT's removal is scored by its labels")
        batches, data = _image_batches(req, loaded)
    elif req.images is not None:
        raise UserError("--images is for a ViT; a language model's calibration size is --tokens")
    else:
        meta = None if loaded is None else loaded.meta
        batches, fit, source = batches_for(req, lm, tok, req.seq_len or seq_len, info["context"],
                                        own_val_tokens(info["checkpoint"], meta) if meta is not None else None)
        data = {"source": source, "seq_len": req.seq_len or seq_len, "batch_size": req.batch_size}
        questions = questions_for(req, lm)
    return batches, fit, questions, data


def run_request(req: Request) -> dict:
    t0 = time.perf_counter()
    plan_phases("analyze: ", analysis_phases(req, False))
    if req.layerwise and req.device_map is not None:
        raise UserError("--device-map places the whole model over devices; --layer-by-layer streams one block at a "
                        "time: drop one of them")
    if req.layerwise:
        from depthlab.analysis.layerwise import load_skeleton

        with phase("analyze: loading the model", req.options.progress, alone=True):
            skel, tok, seq_len, info = load_skeleton(req.model, req.trust_remote_code, req.dtype, req.device)
        lm = skel.lm
    else:
        with phase("analyze: loading the model", req.options.progress, alone=True):
            loaded = load_layered(req.model, req.trust_remote_code, req.dtype, req.device, req.device_map,
                                  req.max_memory, req.offload_folder)
        lm, tok, seq_len, info = loaded.lm, loaded.tokenizer, loaded.seq_len, loaded.info
        req = dataclasses.replace(req, device=loaded.device)  # a placed model's inputs go to its main device
    batches, fit, questions, data = _inputs(req, lm, tok, seq_len, info, None if req.layerwise else loaded)
    generation = generation_for(req, lm, tok)
    check_interior(skel.n_layers if req.layerwise else lm.n_layers, req.options.curse)  # the data's errors first
    if req.layerwise:
        res = analyze_layerwise(skel, batches, req.options, questions=questions, fit=fit)
    else:
        res = analyze(lm, batches, req.options, questions, fit, generation)
    cfg = skel.cfg if req.layerwise else loaded.cfg
    if req.at_init and cfg is not None:
        plan_phases("analyze: ", analysis_phases(req, True))
        with phase("analyze: the index at initialisation", req.options.progress, alone=True), unnumbered():
            res["curse_index"]["at_init"] = index_at_init(cfg, batches, req.options, req.device, None if
                                                          req.layerwise else loaded.device_map, req.offload_folder,
                                                          req.layerwise)
    res["model"] = {**lm.describe(), **info, "path": req.model}
    for p in res.get("massive", {}).get("positions", []) if tok is not None else []:
        p["token"] = tok.decode([p["token_id"]])
    _record_gguf(res, req.model)
    if (prof := removal_profiles(res)) is not None:
        res["profiles"] = prof
    if req.layerwise:
        res["model"]["blocks"] = f"{lm.blocks_path} ({skel.n_layers} x {type(lm.blocks[0]).__name__}, one at a time)"
    if questions:
        data["tasks"] = {t: len(qs) for t, qs in questions.items()}
        # the rate a blind pick gets right: the verdict's precondition for the task (depthlab.analysis.answer)
        data["chance"] = {t: sum(1 / len(q.pairs) for q in qs) / len(qs) for t, qs in questions.items()}
    if generation:
        data["generate"] = {t: len(qs) for t, qs in generation.items()}
    res["data"] = data
    res["run"] = {"device": str(req.device), "dtype": req.dtype}
    if not req.layerwise and loaded.device_map is not None:
        res["run"]["device_map"] = {k: str(d) for k, d in loaded.device_map.items()}
    res["wall_s"] = time.perf_counter() - t0
    return res
