"""`depthlab prune` and `depthlab duplicate`: which blocks to cut or repeat (depthlab.surgery.choice), done by
depthlab.hf.pruning's mechanics."""

from __future__ import annotations

from pathlib import Path

from depthlab import UserError
from depthlab.hf.cli import OVERWRITE


def cmd_prune(args) -> None:
    from depthlab.hf.pruning import layer_span, parse_span, prune_blocks
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
    from depthlab.surgery.choice import least_useful

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
    """prune --drop-lowest K --greedy: the blocks chosen one at a time, scored as `analyze` scores removal
    (depthlab.analysis.greedy, through depthlab.surgery.choice.greedy_record)."""
    from depthlab.device import resolve_device
    from depthlab.hf.pruning import prune_blocks
    from depthlab.ownership import input_paths
    from depthlab.paths import GREEDY_RECORD, Kind, what_is
    from depthlab.surgery.choice import check_drop, greedy_lines, greedy_record

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
        record.update(greedy_record(str(args.model), args.drop_lowest, by, device=device, **request))
        return [b - 1 for b in record["removed"]]

    reads = [*input_paths(args.data or []), *(args.tasks or []), *(p for p in (args.mmlu, args.commonsense) if p),
             *spec_paths(args.generate or [])]
    out, layers = prune_blocks(args.model, choose, args.out_dir, args.overwrite, f", greedily by {by}, each "
                               f"step re-scoring every remaining block ({GREEDY_RECORD})", reads=tuple(reads),
                               beside={GREEDY_RECORD: record})
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


def add_commands(sub) -> None:
    _add_prune(sub)
    _add_duplicate(sub)


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
