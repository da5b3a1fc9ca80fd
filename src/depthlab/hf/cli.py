"""`depthlab export`, `prune` and `import`."""

from __future__ import annotations

import json
from pathlib import Path

from depthlab import UserError
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


def cmd_prune(args) -> None:
    from depthlab.hf.pruning import layer_span, least_useful, parse_span, prune_blocks
    from depthlab.loading import quiet_transformers

    if args.greedy and args.drop_lowest is None:
        raise UserError("--greedy removes --drop-lowest K blocks one at a time: give --drop-lowest K")
    if (args.remove is None) == (args.drop_lowest is None):
        raise UserError("prune needs one of --remove START:END and --drop-lowest K")
    quiet_transformers()
    if args.remove is not None:
        if args.analysis or args.by:
            raise UserError(f"{'--analysis' if args.analysis else '--by'} goes with --drop-lowest, not --remove")
        span = parse_span(args.remove)
        out, layers = prune_blocks(args.model, lambda n: layer_span(*span, n), args.out_dir, args.overwrite)
        print(f"removed model.layers.{layers[0]}..{layers[-1]} (blocks {layers[0] + 1}-{layers[-1] + 1} counted from "
              f"1); saved to {out}")
        return
    if args.greedy:
        return prune_greedy(args)
    from depthlab.paths import model_path

    model_path(args.model)  # a missing model is named before its missing analysis
    by = args.by or "loss"
    analysis = args.analysis or str(Path("analysis") / (Path(args.model).resolve().name or "model"))
    layers, measured = least_useful(args.model, analysis, args.drop_lowest, by)
    out, _ = prune_blocks(args.model, lambda n: layers, args.out_dir, args.overwrite, f", the {len(layers)} least "
                          f"useful blocks by {by} as ranked by {analysis}", reads=(analysis,))
    print(f"removed blocks {' '.join(str(i + 1) for i in sorted(layers))} (model.layers "
          f"{', '.join(map(str, sorted(layers)))}): the {len(layers)} least useful by {by} in {analysis}; "
          f"saved to {out}")
    for line in measured:
        print(line)


GREEDY_NEEDS = {"tasks": "questions: give --tasks FILE.jsonl, --mmlu DIR or --commonsense DIR",
                "generate": "generation tasks: give --generate TASK (add, copy, brackets, continue:FILE or a jsonl "
                            "file of prompt/answer pairs)"}


def prune_greedy(args) -> None:
    """prune --drop-lowest K --greedy: the blocks chosen one at a time, scored as `analyze` scores removal (by
    depthlab.analysis.greedy, handed to this command as args.greedy_order: hf does not import analysis)."""
    from depthlab.device import resolve_device
    from depthlab.hf.pruning import check_drop, greedy_lines, prune_blocks
    from depthlab.ownership import input_paths
    from depthlab.paths import GREEDY_RECORD, Kind, what_is

    by = args.by or "loss"
    sources = [s for s, v in (("--tasks", args.tasks), ("--mmlu", args.mmlu), ("--commonsense", args.commonsense))
               if v]
    if args.analysis:
        raise UserError("--analysis holds a one-shot ranking; --greedy scores the blocks itself: drop one of them")
    given = {"loss": [], "tasks": sources, "generate": ["--generate"] if args.generate else []}
    other = [flag for b, flags in given.items() if b != by for flag in flags]
    if other:
        raise UserError(f"{other[0]} has no effect with --by {by}; drop it, or rank by what it scores")
    if by != "loss" and not given[by]:
        raise UserError(f"--greedy --by {by} needs {GREEDY_NEEDS[by]}")
    if by == "generate" and what_is(args.model) in (Kind.CHECKPOINT, Kind.RUN, Kind.RUNS):  # said before any scoring
        raise UserError(f"--generate decodes with a Hugging Face model's KV cache: {args.model} is a depthlab model "
                        "(export it with `depthlab export` first)")
    from depthlab.eval.gen_tasks import read_tasks, spec_paths
    from depthlab.eval.suite import TaskSuite

    tasks = TaskSuite.read(args.tasks or (), args.mmlu, 0, args.commonsense, args.task_limit) if sources else None
    generate = read_tasks(args.generate, "--generate") if args.generate else None
    request = dict(data=args.data, tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch_size,
                   tasks=tasks, generate=generate)
    device, record = str(resolve_device(args.device, "--device")), {}

    def choose(n: int) -> list[int]:
        check_drop(args.drop_lowest, n)
        record.update(args.greedy_order(str(args.model), args.drop_lowest, by, device=device, **request))
        return [b - 1 for b in record["removed"]]

    reads = [*input_paths(args.data or []), *(args.tasks or []), *(p for p in (args.mmlu, args.commonsense) if p),
             *spec_paths(args.generate or [])]
    out, layers = prune_blocks(args.model, choose, args.out_dir, args.overwrite, f", greedily by {by}, each "
                               f"step re-scoring every remaining block ({GREEDY_RECORD})", reads=tuple(reads),
                               record=record)
    print(f"removed blocks {' '.join(str(i + 1) for i in layers)} (model.layers {', '.join(map(str, layers))}), "
          f"one at a time by {by}; saved to {out}, the steps in {out / GREEDY_RECORD}")
    for line in greedy_lines(record):
        print(line)


def cmd_duplicate(args) -> None:
    from depthlab.hf.pruning import duplicate, parse_span
    from depthlab.loading import quiet_transformers

    quiet_transformers()
    out, layers = duplicate(args.model, *parse_span(args.span, "--span"), args.out_dir, args.overwrite)
    print(f"repeated model.layers.{layers[0]}..{layers[-1]} (blocks {layers[0] + 1}-{layers[-1] + 1} counted from 1) "
          f"once, after model.layers.{layers[-1]}; saved to {out}")


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

    _add_prune(sub)
    _add_duplicate(sub)

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


def _reworking(sub, name: str, help: str, description: str):
    """The parser of a command that reworks a model's blocks and saves a stock HF model (prune, duplicate)."""
    from depthlab.ownership import INPUT, OUTPUT

    p = sub.add_parser(name, help=help, description=description + " MODEL is an HF model directory, or a depthlab "
                       "checkpoint / run (exported first).")
    p.add_argument("model", type=INPUT, help="HF model directory, depthlab checkpoint or run directory")
    p.add_argument("out_dir", type=OUTPUT, help="output directory (written whole; an existing one must be an earlier "
                   "export, prune or duplicate)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE)
    return p


def _add_prune(sub) -> None:
    from depthlab.flags import at_least
    from depthlab.ownership import INPUT

    p = _reworking(sub, "prune", "remove layers from a model and save the smaller HF model", "Remove layers "
                   "START..END-1 (0-based, as in model.layers.N; END excluded), or the k least useful blocks as "
                   "`depthlab analyze` ranked them, and save a Hugging Face model with the layers renumbered and the "
                   "config consistent.")
    p.add_argument("--remove", type=str, metavar="START:END", help="layers to remove, as a Python slice: 20:24, "
                   "-1: (the last), :2 (the first two)")
    p.add_argument("--drop-lowest", type=at_least(1), metavar="K", help="remove the K blocks whose removal alone "
                   "costs least, as ranked by the analysis of MODEL (--analysis)")
    p.add_argument("--by", choices=("loss", "tasks", "generate"), help="with --drop-lowest: rank by the loss "
                   "increase (default) or by the task accuracy lost (an analysis with --removal-tasks / "
                   "--removal-mmlu / --removal-commonsense; with --greedy, the questions of --tasks / --mmlu / "
                   "--commonsense); with --greedy also by generation's exact match (--generate)")
    p.add_argument("--analysis", type=INPUT, metavar="DIR", help="with --drop-lowest: the `depthlab analyze` output "
                   "of MODEL "
                   "(default: analysis/<model name>, analyze's default)")
    _add_greedy(p)
    p.set_defaults(func=cmd_prune)


def _add_greedy(p) -> None:
    from depthlab.eval.gen_tasks import TASK_SPECS
    from depthlab.flags import at_least, only_with
    from depthlab.ownership import INPUT
    from depthlab.paths import GREEDY_RECORD

    p.add_argument("--greedy", action="store_true", help="with --drop-lowest K: remove one block at a time, the "
                   "one whose removal costs least, scoring every remaining block again after each (SLEB); the "
                   f"steps, beside the one-shot ranking's at each k, are printed and written to {GREEDY_RECORD} "
                   "in OUT_DIR")
    p.add_argument("--data", nargs="+", type=INPUT, metavar="PATH", help="with --greedy --by loss: text files or "
                   "folders to score on (default: the built-in corpus), read as `analyze --data` reads them")
    p.add_argument("--tokens", type=at_least(1), default=4096, help="with --greedy --by loss: tokens scored "
                   "(default 4096)")
    p.add_argument("--seq-len", type=at_least(2), help="with --greedy --by loss: window length (default: the "
                   "run's, or 512 for HF models)")
    p.add_argument("--batch-size", type=at_least(1), default=8, help="with --greedy: windows per batch (default 8)")
    p.add_argument("--tasks", nargs="+", type=INPUT, metavar="FILE.jsonl", help="with --greedy --by tasks: "
                   "multiple-choice files, scored as `eval tasks` scores them")
    p.add_argument("--mmlu", type=INPUT, metavar="DIR", help="with --greedy --by tasks: MMLU from local files, as "
                   "`eval mmlu` (zero-shot)")
    p.add_argument("--commonsense", type=INPUT, metavar="DIR", help="with --greedy --by tasks: the commonsense tasks "
                   "under DIR, in their log-likelihood form")
    p.add_argument("--task-limit", type=at_least(1), metavar="N", help="with --greedy --by tasks: at most N "
                   "questions of each task file, MMLU subject and commonsense task (default: all)")
    p.add_argument("--generate", nargs="+", type=TASK_SPECS, metavar="TASK", help="with --greedy --by generate: "
                   "generation tasks scored by exact match of greedy decoding, as `analyze --removal-generate` "
                   "takes them (add[:digits=3,n=50,...], copy, brackets, continue:FILE, or a jsonl file)")
    p.add_argument("--device", type=str, default="auto", help="with --greedy: where the blocks are scored (cpu, "
                   "cuda, ...; default: cuda if available)")
    only_with(p, "--greedy", "--data", "--tokens", "--seq-len", "--batch-size", "--tasks", "--mmlu",
              "--commonsense", "--task-limit", "--generate", "--device")


def _add_duplicate(sub) -> None:
    d = _reworking(sub, "duplicate", "repeat a span of layers and save the deeper HF model", "Run layers "
                   "START..END-1 (0-based, as in model.layers.N; END excluded) twice: save a Hugging Face model with "
                   "the layers up to END-1, a copy of the span, then the rest, renumbered and the config consistent "
                   "(`analyze --duplicate` scores every span).")
    d.add_argument("--span", type=str, required=True, metavar="START:END", help="layers to repeat, as a Python "
                   "slice: 4:8 (model.layers.4 .. 7), -2: (the last two)")
    d.set_defaults(func=cmd_duplicate)
