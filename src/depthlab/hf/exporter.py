"""Export a depthlab checkpoint as a stock Hugging Face model directory.

The directory loads with `AutoModelForCausalLM.from_pretrained(dir)`: no depthlab, no remote code; its README.md is
the model card (depthlab.card: scheme, data, steps, results). Whatever is a
constant or per-channel gain folds exactly into a stock weight, so the exported model costs nothing extra:

    lns          Norm_g(x) / sqrt(l)     = Norm_{g / sqrt(l)}(x)        (norm weight)       -> LlamaForCausalLM
                 W (x / sqrt(l)) + b     = (W / sqrt(l)) x + b          (OLMo-1: no norm weight, q/k/v, gate/up)
    layerscale   h + diag(lam) W_o y     = h + (diag(lam) W_o) y        (rows of o_proj / down_proj)  -> Llama
    skipinit     h + alpha W_o y         = h + (alpha W_o) y                                          -> Llama
    (-> Llama: the family's own class, its hf_class in depthlab.model.families: Llama, Qwen2, OLMo, ...)
    sandwich     a norm before and after each branch is Gemma-2's block                    -> Gemma2ForCausalLM

The other schemes are refused, each with its reason (REFUSED): they put a norm or a residual add where no stock
block has one; which stock class a scheme exports to (`hf_export`), or why it cannot (`hf_export_refusal`), is
declared on the scheme in depthlab.model.schemes. We chose refusal over a remote-code modeling file: a second
copy of the model package would drift from the first, and engines that run stock models (vLLM, llama.cpp,
lm-eval's `hf`) would still not run it. Such checkpoints stay depthlab checkpoints (`depthlab eval` works on them
directly).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.card import write_card
from depthlab.hf.convert import hf_config_dict, to_hf_state_dict
from depthlab.model import Transformer
from depthlab.model.families import family_of
from depthlab.model.schemes import GPAS_EXPORT_REFUSAL as GPAS_REFUSAL, SCHEMES, scheme_class

REFUSED = {name: cls.hf_export_refusal for name, cls in SCHEMES.items() if cls.hf_export is None}
# a multiplier on the stream before block l does not fold into one weight (it scales the skip path, which has none),
# and x0 reaches every block through no stock module
STREAM_SCALARS_REFUSAL = ("a stock decoder block adds its branches to the stream as it is: no stock class scales "
                          "the stream before a block or adds the embedding output to it")
_BRANCH_OUTPUTS = {"attn_gain": "attn.o_proj", "mlp_gain": "mlp.down_proj"}


def hf_weights_and_config(model: Transformer) -> tuple[dict[str, torch.Tensor], dict]:
    """Stock HF weights and config fields equivalent to `model`; UserError with the reason where none exist."""
    cfg = model.cfg
    if cfg.gpas:
        raise UserError(f"cannot export {cfg.norm_scheme} + gpas as a stock checkpoint: {GPAS_REFUSAL}")
    if cfg.resid_lambda or cfg.x0_lambda:
        option = "model.resid_lambda" if cfg.resid_lambda else "model.x0_lambda"
        raise UserError(f"cannot export {option} as a stock checkpoint: {STREAM_SCALARS_REFUSAL}")
    block = scheme_class(cfg.norm_scheme)
    if block.hf_export is None:
        raise UserError(f"cannot export scheme {cfg.norm_scheme!r} as a stock checkpoint: {block.hf_export_refusal}")
    fields = hf_config_dict(cfg)  # first: it refuses a family the stock class cannot express
    return to_hf_state_dict(_fold_branch_gains(model)), fields


@torch.no_grad()
def _fold_branch_gains(model: Transformer) -> Transformer:
    """An equivalent `pre` model with LayerScale / SkipInit gains folded into the output projections."""
    if not scheme_class(model.cfg.norm_scheme).branch_gains:
        return model
    plain = Transformer(replace(model.cfg, norm_scheme="pre"), init=False)
    state = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[-1] not in _BRANCH_OUTPUTS}
    plain.load_state_dict(state, strict=True)
    for ours, layer in zip(model.layers, plain.layers):
        for gain, proj in _BRANCH_OUTPUTS.items():
            layer.get_submodule(proj).weight.mul_(getattr(ours, gain).reshape(-1, 1))  # rows = output channels
    return plain


def hf_tokenizer(tok):
    """Our `tokenizers.Tokenizer` as a transformers tokenizer. The document separator (<|endoftext|>) is BOS and
    EOS, and a post-processor puts it in front of every encoded text, as the model saw it before every training
    document: transformers pipelines and lm-eval's `hf` backend then score the export as depthlab does."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    from depthlab.eval.multiple_choice import start_token

    sep = start_token(tok)
    if sep is None:
        return PreTrainedTokenizerFast(tokenizer_object=tok)
    tok, name = Tokenizer.from_str(tok.to_str()), tok.id_to_token(sep)  # a copy: the caller's stays as it is
    tok.post_processor = processors.TemplateProcessing(single=f"{name} $A", pair=f"{name} $A {name} $B:1",
                                                       special_tokens=[(name, sep)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=name, eos_token=name)


def export(src: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write a stock HF model directory for a depthlab model path (a checkpoint, a run: its newest checkpoint).
    The directory is written whole (depthlab.ownership.writing): an existing `out_dir` must be an earlier export or
    prune, unless `overwrite`."""
    from depthlab.checkpoint import warn
    from depthlab.loading import load_model
    from depthlab.ownership import is_depthlab_hf, refuse_own_input, writing
    from depthlab.paths import Kind, what_is

    refuse_own_input(out_dir, [src], "export")  # --overwrite or not, before anything is read or claimed
    if what_is(src) is Kind.HF:
        raise UserError(f"{src} is a Hugging Face model directory, not a depthlab checkpoint; it is exported already "
                        "(a model patched with apply_scheme exports with save_pretrained)")
    loaded = load_model(src, hf=False)
    refuse_own_input(out_dir, [loaded.path], "export")  # the checkpoint a run or its parent stands for
    if loaded.cfg.model.is_vit:  # images: a stock ViTForImageClassification (depthlab.hf.vit)
        from depthlab.hf.vit import export_vit

        return export_vit(loaded, out_dir, overwrite)
    state, fields = hf_weights_and_config(loaded.model)
    tok = hf_tokenizer(loaded.tokenizer) if loaded.tokenizer is not None else None
    family = family_of(loaded.cfg.model)
    fallback = family.hf_fallback(state, fields) if fields["model_type"] == family.hf_model_types[0] else None
    if fallback is not None and tok is not None and _stock_tokenizer_differs(tok, fields["model_type"]):
        state, fields, why = fallback  # the family's other stock form (qwen2: the Llama it equals)
        warn(why)
    with writing(out_dir, is_depthlab_hf, "export", overwrite, [src, loaded.path]) as tmp:
        _write_hf_dir(tmp, state, fields, loaded, tok)
        if tok is not None and (differs := _stock_tokenizer_differs(tok, directory=tmp)):
            raise UserError(f"cannot export {src}: AutoTokenizer would load the export's tokenizer as "
                            f"{differs}, which encodes text differently from the run's")
        write_card(tmp, out_dir, loaded)
    return Path(out_dir)


# whitespace runs, tabs and CRLF, accents composed and not (NFC), CJK, emoji, digits, contractions, code
TOKENIZER_PROBE = ("  Hello  world\n\n\tTabs,\r\nCafe\u0301 caf\u00e9 na\u00efve \u01c4 \ufb01 \u65e5\u672c\u8a9e "
                   "\U0001f389 1234567 it's I'M they'll\ndef f(x):\n    return {'a': x**2}  # ok\n\n\n")


def _stock_tokenizer_differs(tok, model_type: str | None = None, directory: Path | None = None) -> str | None:
    """The class name of the tokenizer `AutoTokenizer.from_pretrained` builds from an export with `tok` (a
    `directory` written, or a scratch one with a bare `model_type` config) where it encodes TOKENIZER_PROBE
    differently from `tok`; None where they agree. transformers 5 loads some families' tokenizers with the
    family's own normalizer and split regex, whatever tokenizer_config.json names (Qwen2)."""
    import tempfile

    from transformers import AutoConfig, AutoTokenizer

    want = tok.backend_tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False).ids
    with tempfile.TemporaryDirectory() as scratch:
        if directory is None:
            directory = Path(scratch)
            AutoConfig.for_model(model_type).save_pretrained(directory)
            _save_tokenizer(tok, directory)
        stock = AutoTokenizer.from_pretrained(str(directory))
        got = stock(TOKENIZER_PROBE, add_special_tokens=False).input_ids
    return None if got == want else type(stock).__name__


def _save_tokenizer(tok, out: Path) -> None:
    tok.save_pretrained(out)
    # transformers 5 names the class TokenizersBackend, unknown to 4.x; both know PreTrainedTokenizerFast
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tok.bos_token is not None:  # what the post-processor does, for readers of the config
        tok_cfg.update(add_bos_token=True, add_eos_token=False)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")


def _write_hf_dir(out: Path, state: dict, fields: dict, loaded, tok) -> None:
    from transformers import AutoConfig

    from depthlab.checkpoint import WEIGHTS, save_weights
    from depthlab.paths import EXPORT_INFO

    architectures = fields.pop("architectures")
    fields = {k: v for k, v in fields.items() if k != "torch_dtype"}
    hf_cfg = AutoConfig.for_model(fields.pop("model_type"), **fields, bos_token_id=getattr(tok, "bos_token_id", None),
                                  eos_token_id=getattr(tok, "eos_token_id", None), pad_token_id=None)
    hf_cfg.architectures, hf_cfg.dtype = architectures, "float32"
    hf_cfg.save_pretrained(out)
    save_weights(state, out / WEIGHTS, {"format": "pt"})
    if tok is not None:
        _save_tokenizer(tok, out)
    provenance = {"source": str(loaded.path), "scheme": loaded.cfg.model.norm_scheme, "step": loaded.meta.step,
                  "architecture": architectures[0], "seq_len": loaded.cfg.data.seq_len,  # its default eval window
                  "note": "scheme constants are folded into the weights: load as a plain HF model"}
    (out / EXPORT_INFO).write_text(json.dumps(provenance, indent=2) + "\n")
