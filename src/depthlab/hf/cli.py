"""`depthlab export` and `depthlab prune` (the `--tasks` option of `depthlab eval` dispatches to mc_eval)."""

from __future__ import annotations

import json


def quiet_transformers() -> None:
    """The CLI prints its own one-line summaries; transformers' per-load progress bars only add noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def cmd_export(args) -> None:
    from depthlab.hf.exporter import export

    quiet_transformers()
    out = export(args.source, args.out_dir)
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    print(f"exported a stock {arch} to {out} (load with AutoModelForCausalLM.from_pretrained)")


def cmd_prune(args) -> None:
    from depthlab.hf.pruning import parse_span, prune

    quiet_transformers()
    start, end = parse_span(args.remove)
    out = prune(args.model, start, end, args.out_dir)
    print(f"removed model.layers.{start}..{end - 1} (blocks {start + 1}-{end} counted from 1); saved to {out}")


def add_commands(sub) -> None:
    e = sub.add_parser("export", help="export a checkpoint as a stock Hugging Face model directory",
                       description="Write config.json, model.safetensors and tokenizer files that "
                       "AutoModelForCausalLM.from_pretrained loads without depthlab or remote code: a Llama for pre, "
                       "lns, layerscale and skipinit (scales and gains folded into the weights), a Gemma-2 for "
                       "sandwich; the other schemes are refused with the reason (docs/hf.md).")
    e.add_argument("source", help="checkpoint directory or run directory (its newest checkpoint)")
    e.add_argument("out_dir", help="output directory")
    e.set_defaults(func=cmd_export)

    p = sub.add_parser("prune", help="remove a span of layers from a model and save the smaller HF model",
                       description="Remove layers START..END-1 (0-based, as in model.layers.N; END excluded) and save "
                       "a Hugging Face model with the layers renumbered and the config consistent. MODEL is an HF "
                       "model directory, or a depthlab checkpoint / run (exported first).")
    p.add_argument("model", help="HF model directory, depthlab checkpoint or run directory")
    p.add_argument("--remove", required=True, metavar="START:END", help="layers to remove, e.g. 20:24")
    p.add_argument("out_dir", help="output directory")
    p.set_defaults(func=cmd_prune)
