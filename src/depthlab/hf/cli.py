"""`depthlab export` and `import`."""

from __future__ import annotations

import json

from depthlab.checkpoint import CONFIG
from depthlab.model.families import FAMILIES

OVERWRITE = "replace OUT_DIR even if it is not this command's own kind of output (another run, other files)"


def cmd_export(args) -> None:
    from depthlab.hf.exporter import export
    from depthlab.loading import quiet_transformers
    from depthlab.ownership import refuse_own_input

    refuse_own_input(args.out_dir, [args.source], "export")  # either kind, --overwrite or not
    quiet_transformers()
    if args.adapter_only:
        from depthlab.hf.adapter import export_adapter

        out = export_adapter(args.source, args.out_dir, overwrite=args.overwrite)
        print(f"exported the LoRA adapter to {out} (load with peft.PeftModel.from_pretrained(base, {out}), base: "
              "the stock export of the run's base model)")
        return
    out = export(args.source, args.out_dir, overwrite=args.overwrite)
    hf_class = json.loads((out / CONFIG).read_text())["architectures"][0]
    auto = "AutoModelForImageClassification" if hf_class == "ViTForImageClassification" else "AutoModelForCausalLM"
    print(f"exported a stock {hf_class} to {out} (load with {auto}.from_pretrained)")


def cmd_import(args) -> None:
    from depthlab.hf.importer import import_to_checkpoint
    from depthlab.loading import quiet_transformers

    quiet_transformers()
    out = import_to_checkpoint(args.model, args.out_dir, scheme=args.scheme, max_seq_len=args.max_seq_len,
                               overwrite=args.overwrite, tokenizer=args.tokenizer)
    from depthlab.checkpoint import CONFIG
    from depthlab.config import Config

    scheme = Config.load(out / CONFIG).model.norm_scheme
    print(f"imported {args.model} as a depthlab checkpoint (scheme {scheme}): {out}")


# display names of the HF model types the families import (each family's hf_names, depthlab.model.families)
FAMILY_NAMES = {t: name for family in FAMILIES.values() for t, name in family.hf_names.items()}


def _families() -> tuple[str, str]:
    """(import's families, export's language-model classes), from the family registry."""
    names = list(FAMILY_NAMES.values())
    classes = [a.hf_class for a in FAMILIES.values() if a.causal]
    return " / ".join(names), ", ".join(classes[:-1]) + " or " + classes[-1]


def _exported_schemes() -> tuple[str, str]:
    """(the schemes exported to the run's family class, those exported to Gemma-2), from the scheme registry; a ViT
    exports the first kind too (depthlab.hf.vit)."""
    from depthlab.model.schemes import SCHEMES

    def listed(target):
        names = [n for n, cls in SCHEMES.items() if cls.hf_export == target]
        return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)

    return listed("family"), listed("gemma2")


def add_commands(sub) -> None:
    from depthlab.ownership import INPUT, OUTPUT

    families, classes = _families()
    family_schemes, gemma2_schemes = _exported_schemes()
    e = sub.add_parser("export", help="export a checkpoint as a stock Hugging Face model directory",
                       description="Write config.json, model.safetensors and tokenizer files that "
                       "AutoModelForCausalLM.from_pretrained loads without depthlab or remote code: the run's family "
                       f"({classes}) for {family_schemes} (scales and gains folded into the "
                       "weights; a qwen2 run whose tokenizer is not Qwen2's as the Llama with attention biases it "
                       f"equals), a Gemma2ForCausalLM for {gemma2_schemes}; a ViT (model.family=vit: {family_schemes}) "
                       "as a ViTForImageClassification with its image processor; the other schemes are "
                       "refused with the reason (docs/hf.md). A LoRA fine-tune exports with its adapters merged "
                       "into the weights.")
    e.add_argument("source", type=INPUT, help="checkpoint, run directory (its newest valid checkpoint) or a directory "
                   "holding "
                   "one run")
    e.add_argument("out_dir", type=OUTPUT, help="output directory (written whole; an existing one must be an "
                   "earlier export)")
    e.add_argument("--overwrite", action="store_true", help=OVERWRITE)
    e.add_argument("--adapter-only", action="store_true", help="for a LoRA fine-tune (`finetune --lora`): write "
                   "its adapters as a peft adapter directory, for the export of its base model, instead of the "
                   "merged model (docs/downstream.md)")
    e.set_defaults(func=cmd_export)

    i = sub.add_parser("import", help=f"turn an HF {families} directory into a depthlab checkpoint",
                       description=f"Copy the weights of a Hugging Face model ({families}) into a depthlab "
                       "checkpoint with its tokenizer (with scheme pre its logits equal the HF model's; with lns the "
                       "same weights under LNS). The weights are checked against config.json (every tensor present, "
                       "of its shape, finite, none left over); a model whose computation depthlab's differs from "
                       "(RoPE scaling, other activations, sliding windows) is refused with the reason.")
    i.add_argument("model", type=INPUT, help="Hugging Face model directory")
    i.add_argument("out_dir", type=OUTPUT, help="checkpoint directory to write (an existing one must be an earlier "
                   "import)")
    i.add_argument("--overwrite", action="store_true", help=OVERWRITE)
    i.add_argument("--scheme", type=str, help="scheme of the depthlab model (default: the family's own block, an "
                   "exact copy: "
                   "pre, or sandwich for gemma2)")
    i.add_argument("--max-seq-len", type=int, help="context of the depthlab model (default: the HF model's, "
                   "at most 4096)")
    i.add_argument("--tokenizer", type=INPUT, metavar="FILE", help="the model's tokenizer (a tokenizer.json or a "
                   "transformers "
                   "tokenizer directory), for a model directory that holds none (default: the directory's own)")
    i.set_defaults(func=cmd_import)
