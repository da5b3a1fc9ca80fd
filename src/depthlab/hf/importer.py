"""Start a depthlab Transformer from a Hugging Face checkpoint of a family depthlab models (depthlab.model.families:
each family names the HF model types it imports, and reads its own config fields): Llama, Qwen2 (q/k/v biases
included), OLMo-1, OLMo-2, ...

With the family's own scheme (the default: pre, or sandwich for Gemma-2) the imported model's logits match the HF
model's; then switch the scheme (scheme="lns") for continued pretraining with LayerNorm Scaling, as in the paper's
Qwen2.5-0.5B and OLMo experiments.
"""

from __future__ import annotations

import dataclasses

import torch

from depthlab import UserError
from depthlab.checkpoint import CheckpointMeta, warn
from depthlab.config import Config, DataConfig, ModelConfig
from depthlab.hf.convert import from_hf_state_dict
from depthlab.model import Transformer
from depthlab.model.families import FAMILIES
from depthlab.model.validate import validate

MODEL_TYPES = {model_type: family for family in FAMILIES.values() for model_type in family.hf_model_types}  # HF -> ours
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json")
MAX_SEQ_LEN = 4096  # default cap: our RoPE table is precomputed, and 128k positions would cost memory for nothing


def _load(src):
    if isinstance(src, torch.nn.Module):
        return src
    from depthlab.model.apply import load_pretrained

    return load_pretrained(src, dtype=torch.float32)


def model_config_from_hf(hf_cfg, max_seq_len: int | None = None, hf_state: dict | None = None,
                         **overrides) -> ModelConfig:
    """ModelConfig for an HF config of a family we model; UserError on anything our model computes differently
    (the family's refusals). hf_state: the weights, for a family that claims a model of another type as its own
    (a qwen2 run exported as a Llama: depthlab.model.families.qwen2)."""
    seq = max_seq_len or min(hf_cfg.max_position_embeddings, MAX_SEQ_LEN)
    fields = _family_of_hf(hf_cfg, hf_state or {}).from_hf(hf_cfg, seq)
    return ModelConfig(**{**fields, "max_seq_len": seq, **overrides})


def _family_of_hf(hf_cfg, hf_state: dict):
    """The family an HF model imports as: one that claims it, else the family of its model type."""
    claimed = [f for f in FAMILIES.values() if f.claims(hf_cfg, hf_state)]
    if claimed:
        return claimed[0]
    if hf_cfg.model_type not in MODEL_TYPES:
        raise UserError(f"cannot import model type {hf_cfg.model_type!r}: supported families are "
                        f"{', '.join(MODEL_TYPES)}")
    return MODEL_TYPES[hf_cfg.model_type]


def _stored_head_differs(state: dict) -> bool:
    """The loaded model has an LM head of its own, not the embedding (what transformers does when a directory
    ties them in its config but stores a different lm_head.weight)."""
    head, embed = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
    return head is not None and embed is not None and not (head is embed or torch.equal(head, embed))


def _name(src) -> str:
    return type(src).__name__ if isinstance(src, torch.nn.Module) else str(src)


def import_hf(src, scheme: str | None = None, max_seq_len: int | None = None,
              **model_overrides) -> tuple[Transformer, Config]:
    """A depthlab Transformer with the weights of an HF model (a directory, a hub-style local path, or a model).

    The family's own scheme (scheme=None: its hf_scheme, pre, or sandwich for Gemma-2) reproduces the HF model's
    logits; any other scheme that keeps the family's weight set (lns, and the ones that only add parameters:
    layerscale, skipinit, gpas, ...) starts from the same weights.
    """
    if max_seq_len is not None and max_seq_len < 1:
        raise UserError(f"--max-seq-len must be at least 1, got {max_seq_len}")
    hf = _load(src)
    state = hf.state_dict()
    if scheme is not None:
        model_overrides["norm_scheme"] = scheme
    mc = model_config_from_hf(hf.config, max_seq_len, state, **model_overrides)
    if mc.tie_embeddings and _stored_head_differs(state):
        # transformers loads such a directory untied (the stored head, not the embedding): so does the import
        warn(f"{_name(src)} sets tie_word_embeddings but stores its own lm_head.weight: imported untied, as "
             "transformers loads it")
        mc = dataclasses.replace(mc, tie_embeddings=False)
    window = _export_info(src).get("seq_len") if not isinstance(src, torch.nn.Module) else None
    window = window if isinstance(window, int) and window > 0 else DataConfig.seq_len  # an export: the run's
    cfg = validate(Config(model=mc, data=DataConfig(seq_len=min(window, mc.max_seq_len)),
                          preset=f"hf-import:{hf.config.model_type}"))
    model = Transformer(mc, init=False)
    ours = from_hf_state_dict(state, mc)
    if mc.tie_embeddings:
        ours.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(ours, strict=False)
    allowed_missing = {"lm_head.weight"} if mc.tie_embeddings else set()
    # parameters the scheme adds (LayerScale gains, GPAS gates, ...) keep the values their modules start with
    missing = [k for k in missing if k not in allowed_missing and not k.endswith(("_gain", ".gate", ".alpha"))]
    if missing or unexpected:
        raise UserError(f"scheme {mc.norm_scheme!r} does not fit {mc.family}'s weights: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    return model.float(), cfg


def save_as_checkpoint(path, model: Transformer, cfg: Config, meta: CheckpointMeta, tokenizer=None):
    """save_checkpoint for a model built outside the trainer (an existing checkpoint at `path` stays as it was
    until the new one is complete)."""
    from pathlib import Path

    from depthlab.checkpoint import save_checkpoint
    from depthlab.paths import Kind, what_is

    intact = f"the checkpoint already in {path} is as it was" if what_is(Path(path)) is Kind.CHECKPOINT else \
        "nothing was written"
    return save_checkpoint(path, model.state_dict(), cfg, meta, tokenizer=tokenizer, intact=intact)


def is_import(path) -> bool:
    """A checkpoint of its own, outside any run: what `depthlab import` writes, and may replace."""
    from depthlab.paths import Kind, run_of, what_is

    return what_is(path) is Kind.CHECKPOINT and run_of(path) is None


def import_to_checkpoint(src, out_dir, scheme: str | None = None, max_seq_len: int | None = None,
                         overwrite: bool = False, tokenizer=None):
    """import_hf, saved as a depthlab checkpoint with its tokenizer (`tokenizer`, a tokenizer.json or a
    transformers tokenizer directory, or else the HF directory's own), so that `depthlab eval`, finetune and the
    checkpoint-based tools run on it. An existing `out_dir` must be an earlier import, unless `overwrite`."""
    from pathlib import Path

    from depthlab.gguf import dequantized, gguf_file
    from depthlab.ownership import claim, locked
    from depthlab.paths import Kind, what_is

    origin = src
    if gguf_file(src) is not None:  # a GGUF file: its dequantized HF directory (depthlab.gguf)
        src = dequantized(src)
    kind = what_is(src)
    if kind in (Kind.OTHER, Kind.EMPTY) and not (Path(src) / "config.json").is_file():
        raise UserError(f"cannot import {src}: it has no config.json, so it is not a Hugging Face model directory "
                        "(save one with model.save_pretrained(DIR))")
    if kind not in (Kind.HF, Kind.MISSING):  # a missing path may still name a model in the local HF cache
        raise UserError(f"cannot import {src}: it is {kind.value}, not a Hugging Face model directory")
    family = _model_type(src)
    if family is not None and family not in MODEL_TYPES:
        raise UserError(f"cannot import model type {family!r}: supported families are {', '.join(MODEL_TYPES)}")
    exported, own = _exported_scheme(src), MODEL_TYPES[family].hf_scheme if family else "pre"
    if exported not in (None, own) and scheme == exported:
        raise UserError(f"{src} is a depthlab export of a {exported} model: its weights already carry the {exported} "
                        f"constants, and --scheme {scheme} would apply them a second time; import it with --scheme "
                        f"{own} (the same logits), or use the run it was exported from")
    vit = family == "vit"
    if vit and tokenizer is not None:
        raise UserError(f"{src} is a ViT: it reads images, and --tokenizer has no meaning for it")
    tok = None if vit else _tokenizer_for(src, tokenizer)  # before the weights: the cheap check first
    rows = _hf_config(src).get("vocab_size")
    if tok is not None and isinstance(rows, int) and tok.get_vocab_size() > rows:
        raise UserError(f"the tokenizer has {tok.get_vocab_size():,} tokens but {src}'s embedding only {rows:,} "
                        "rows: it is not this model's tokenizer")
    with locked(out_dir, "import"):
        claim(Path(out_dir), is_import, "import", overwrite, inputs=[src])
        if vit:
            model, cfg, vit_data = _import_vit(src, scheme or "pre")
            return save_as_checkpoint(out_dir, model, cfg, CheckpointMeta(step=0, imported_from=str(src),
                                                                          data=vit_data))
        model, cfg = import_hf(src, scheme=scheme, max_seq_len=max_seq_len)
        return save_as_checkpoint(out_dir, model, cfg, CheckpointMeta(step=0, imported_from=str(origin)),
                                  tokenizer=tok)


def _tokenizer_for(src, given):
    """The tokenizer an import saves: `given`, else the HF directory's (tokenizer.json, or a slow tokenizer
    transformers converts); a depthlab export's without the start-token post-processor export added, so that the
    import tokenizes exactly like the run (depthlab encodes documents without special tokens either way)."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer

    from depthlab.data.tokenizer import load_tokenizer

    if given is not None:
        return load_tokenizer(given)
    if not Path(src).is_dir():
        return _cached_tokenizer(src)
    supply = "give the model's tokenizer with --tokenizer FILE (a tokenizer.json or a transformers tokenizer directory)"
    if not any((Path(src) / f).is_file() for f in TOKENIZER_FILES):
        raise UserError(f"{src} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); {supply}")
    try:
        tok = load_tokenizer(src)
    except UserError as e:
        raise UserError(f"{src}: its tokenizer does not load ({e}); {supply}") from None
    if _exported_scheme(src) is not None:
        d = json.loads(tok.to_str())
        d["post_processor"] = None
        tok = Tokenizer.from_str(json.dumps(d))
    return tok


def _cached_tokenizer(name):
    """The tokenizer of a model in the local Hugging Face cache, named as on the hub."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(name), local_files_only=True).backend_tokenizer
    except (OSError, ValueError, AttributeError):
        raise UserError(f"cannot load Hugging Face model {name}: no such directory (and not in the local Hugging Face "
                        "cache)") from None


def _hf_config(src) -> dict:
    """The HF directory's config.json as a dict ({} where there is none)."""
    from pathlib import Path

    from depthlab.checkpoint import CONFIG
    from depthlab.paths import read_json

    d = read_json(Path(src) / CONFIG)
    return d if isinstance(d, dict) else {}


def _model_type(src) -> str | None:
    return _hf_config(src).get("model_type")


def _export_info(src) -> dict:
    """A depthlab export's provenance file ({} for any other model)."""
    from pathlib import Path

    from depthlab.paths import EXPORT_INFO, read_json

    d = read_json(Path(src) / EXPORT_INFO)
    return d if isinstance(d, dict) else {}


def _exported_scheme(src) -> str | None:
    """The scheme a depthlab export was trained with (its constants folded into the weights); None for any
    other model."""
    return _export_info(src).get("scheme")


def _import_vit(src, scheme: str) -> tuple:
    """A stock ViTForImageClassification directory as a depthlab ViT, with its class names and, when it has a
    preprocessor config, its pixel normalisation: the checkpoint's data record (as a depthlab ViT run keeps them)."""
    import json
    from pathlib import Path

    from depthlab.hf.vit import import_hf_vit

    model, mc = import_hf_vit(src, scheme=scheme)
    id2label = {int(k): v for k, v in (json.loads((Path(src) / "config.json").read_text()).get("id2label")
                                       or {}).items()}
    data = {"classes": [id2label.get(i, str(i)) for i in range(mc.num_classes)]}
    pre = Path(src) / "preprocessor_config.json"
    if pre.is_file():
        p = json.loads(pre.read_text())
        data.update(pixel_mean=p.get("image_mean"), pixel_std=p.get("image_std"))
    return model, Config(mc), data
