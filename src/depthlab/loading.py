"""A depthlab checkpoint as a model: the model its config builds, holding its weights, a LoRA fine-tune's adapters
merged in (W + (alpha / r) B A, as peft's merge computes it), so that every command reading a checkpoint (eval,
export, analyze, fine-tuning from it) sees a plain model. `load_model` takes any model path, a Hugging Face
model directory included, with what every command needs around it (`Loaded`: tokenizer, windows, logits); the
LoRA adapters themselves (adding them, their live names) are depthlab.model.lora's.

A LoRA run's checkpoint stores the frozen base weights under their own names and each adapter as
`<module>.lora_A.weight` and `<module>.lora_B.weight` (see depthlab.model.lora).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.checkpoint import CONFIG, TOKENIZER, CheckpointMeta, load_verified, load_weights, warn
from depthlab.config import Config
from depthlab.model import build_model
from depthlab.model.lora import merged
from depthlab.paths import EXPORT_INFO, Kind, find_checkpoint, model_path, read_json

DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple:
    """(model, config, CheckpointMeta) from a checkpoint or a run directory; the model is rebuilt with its saved
    scheme."""
    ckpt = find_checkpoint(path)
    meta = load_verified(ckpt)
    cfg = Config.load(ckpt / CONFIG)
    model = build_model(cfg.model, init=False).to(device)
    missing, unexpected = model.load_state_dict(plain_weights(ckpt, device), strict=False)
    missing = [k for k in missing if not (cfg.model.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match its config: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    return model, cfg, meta


def plain_weights(ckpt, device: str = "cpu") -> dict:
    """A checkpoint's weights as a plain model of its config takes them: a LoRA run's adapters merged."""
    state = load_weights(ckpt, device)
    lora = Config.load(Path(ckpt) / CONFIG).train.lora
    return merged(state, lora) if lora.rank else state


@dataclass
class Loaded:
    """A model loaded from any model path, with what every command needs around it."""

    model: object  # a depthlab Transformer, or a transformers PreTrainedModel (kind HF)
    tokenizer: object | None  # tokenizers.Tokenizer (depthlab; None without tokenizer.json), transformers' (HF)
    kind: Kind  # CHECKPOINT or HF
    path: Path  # the checkpoint or HF directory that was loaded
    cfg: object | None = None  # the depthlab Config (None for HF)
    meta: CheckpointMeta | None = None  # the checkpoint's (None for HF)

    @property
    def context(self) -> int:
        """The longest window the model takes."""
        return self.cfg.model.max_seq_len if self.cfg is not None else hf_context(self.model.config)

    @property
    def seq_len(self) -> int:
        """The default window: the run's own (a depthlab export records its run's), or for other HF models their
        context up to 512."""
        if self.cfg is not None:
            return self.cfg.data.seq_len
        info = read_json(self.path / EXPORT_INFO) if self.kind is Kind.HF else None
        window = info.get("seq_len") if isinstance(info, dict) else None
        return min(window, self.context) if isinstance(window, int) and window > 0 else min(512, self.context)

    def lm(self):
        """The model as a module from token ids (B, T) to logits (B, T, V)."""
        return self.model if self.kind is Kind.CHECKPOINT else Logits(self.model)

    def fast_tokenizer(self):
        """The tokenizer as a `tokenizers.Tokenizer` (the packing and batch encoding use its batch API)."""
        if self.tokenizer is None:
            raise UserError(f"{self.path} has no {TOKENIZER}")
        return getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)


class Logits(torch.nn.Module):
    """An HF causal LM returning bare logits, like depthlab's Transformer."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, use_cache=False).logits


def load_model(path: str | Path, device: str = "cpu", dtype: str = "float32", hf: bool = True,
               trust_remote_code: bool = False, warn: Callable[[str], None] = warn) -> Loaded:
    """A model from any model path (see model_path), on `device` in `dtype`, in eval mode."""
    kind, p = model_path(path, hf=hf, warn=warn)
    if kind is Kind.HF:
        return _load_hf(p, device, dtype, trust_remote_code)
    model, cfg, meta = load_checkpoint(p, device=str(device))
    from depthlab.data.tokenizer import load_tokenizer

    tok = load_tokenizer(p / TOKENIZER) if (p / TOKENIZER).is_file() else None
    return Loaded(model.to(torch_dtype(dtype)).eval(), tok, Kind.CHECKPOINT, p, cfg, meta)


def quiet_transformers() -> None:
    """Commands print their own one-line summaries; transformers' per-load progress bars only add noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def _load_hf(p: Path, device: str, dtype: str, trust_remote_code: bool) -> Loaded:
    if importlib.util.find_spec("transformers") is None:
        raise UserError(f"{p} is a Hugging Face model directory; loading it needs `transformers` "
                        "(pip install depthlab[hf])")
    from depthlab.model.apply import load_pretrained

    quiet_transformers()
    # load_pretrained: a model saved after apply_scheme comes back with its scheme; a plain one as plain HF
    model = load_pretrained(str(p), dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code)
    return Loaded(model.to(device).eval(), load_hf_tokenizer(p, trust_remote_code), Kind.HF, p)


def load_hf_tokenizer(p: Path, trust_remote_code: bool = False):
    """The transformers tokenizer saved with an HF model."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"{p}: no usable tokenizer in the model directory ({str(e).splitlines()[0]})") from None


def hf_context(config) -> int:
    """The longest window an HF model takes, from its config."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512
