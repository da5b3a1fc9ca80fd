"""`depthlab eval KIND`: one subcommand per kind of score, each with only its own options: `ppl` (a language
model's loss and perplexity on text), `images` (a ViT's loss and accuracy), `tasks` (multiple-choice files), `mmlu`,
`commonsense` (the paper's table) and `harness` (lm-evaluation-harness tasks). Models load through
depthlab.loading, so this command, like the scorers it runs, needs nothing of depthlab.train, depthlab.hf or
depthlab.analysis.

The spelling before the subcommands (`depthlab eval MODEL [--tasks F | --mmlu DIR | --commonsense DIR |
--harness T]`) still works: `new_spelling` names its kind, and the command says the new spelling in one line."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from depthlab import UserError

MODEL_HELP = "a checkpoint, a run directory (its newest valid checkpoint), a directory holding one run, or a " \
    "Hugging Face model directory"


def cmd_ppl(args) -> list:
    from depthlab.progress import phase

    with phase("eval: loading the model", not args.no_progress, alone=True):  # a large model loads for minutes
        loaded = load(args)
    if loaded.cfg is not None and loaded.cfg.model.is_vit:
        raise UserError(f"{loaded.path} is a ViT (an image classifier): score it with `depthlab eval images`")
    return eval_perplexity(loaded, args.data, args.seq_len, args.batch_size, loaded.device,
                           progress=not args.no_progress, n_tokens=args.tokens)


def cmd_images(args) -> list:
    loaded = load(args)
    if loaded.cfg is None or not loaded.cfg.model.is_vit:
        raise UserError(f"{loaded.path} is not a depthlab ViT: score a language model with `depthlab eval ppl`")
    return eval_images(loaded, args.data, args.batch_size, loaded.device, progress=not args.no_progress)


def cmd_tasks(args) -> list:
    from depthlab.card import Scores
    from depthlab.eval.multiple_choice import evaluate_tasks, scorer_for
    from depthlab.paths import short_names

    names = short_names(args.tasks, "--tasks")  # results keyed by name: a/mc.jsonl and b/mc.jsonl stay two
    scorer, scores = scorer_for(load(args)), []
    for task, name in zip(args.tasks, names):
        res = evaluate_tasks(scorer, task, progress=not args.no_progress)
        print(f"{task}: {res['n']} questions  acc {res['acc']:.4f}  acc_norm {res['acc_norm']:.4f}")
        scores.append(Scores(name, task, {"acc": res["acc"], "acc_norm": res["acc_norm"]}))
    return scores


def cmd_harness(args) -> None:
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        raise UserError("eval harness needs lm-evaluation-harness: pip install 'depthlab[eval]' (lm-eval, "
                        "accelerate)")
    from lm_eval.utils import make_table

    from depthlab.eval.harness import run_harness
    from depthlab.eval.multiple_choice import scorer_for

    print(make_table(run_harness(scorer_for(load(args)), args.harness, batch_size=args.batch_size,
                                 progress=not args.no_progress)))


def load(args):
    """The one model of a subcommand, on --device or placed by --device-map."""
    from depthlab.loading import PLACEMENT, load_model, placed_device, placement

    return load_model(args.model, device=placed_device(args), **dict(zip(PLACEMENT, placement(args))))


def carded(score):
    """The subcommand `score` (it returns its depthlab.card.Scores) with --card EXPORT_DIR: the card is checked
    before the evaluation runs and given its results after."""

    def cmd(args) -> None:
        from depthlab.card import add_results, check_card

        if args.card:
            check_card(args.card, getattr(args, "models", None) or [args.model])
        scores = score(args)
        if args.card:
            print(f"added {sum(len(s.metrics) for s in scores)} results to {add_results(args.card, scores)}")

    return cmd


def cmd_table(args) -> list:
    """`eval commonsense` and `eval mmlu`: the eight-task table, and with MMLU the paper's table
    (docs/downstream.md), for every model given."""
    from depthlab.card import Scores
    from depthlab.device import resolve_device
    from depthlab.eval.commonsense import TASKS, evaluate_models, is_table, markdown, table_paths, write_tables
    from depthlab.ownership import writing_files

    device = resolve_device(args.device, "--device")
    md, js = table_paths(args.table)
    inputs = [p for p in (*args.models, args.commonsense, args.mmlu) if p]
    with writing_files([md, js], is_table, f"eval {args.eval_command}", args.overwrite, inputs) as tmps:  # first
        results = evaluate_models(args.models, args.commonsense, str(device), args.max_new_tokens,
                                  log=lambda msg: print(msg, file=sys.stderr), mmlu=args.mmlu, shots=args.mmlu_shots,
                                  progress=not args.no_progress)
        write_tables(results, *tmps)
    print(markdown(results))
    print(f"wrote {md} and {js}")
    return [Scores(TASKS[task][0], task, {"acc_generation": r["generation"], "acc_loglik": r["loglik"]})
            if task in TASKS else Scores("MMLU", f"mmlu, {args.mmlu_shots}-shot", {"acc": r["micro"],
                                                                                   "acc_macro": r["macro"]})
            for task, r in results[args.models[0]].items()]


def eval_images(loaded, data: list[str] | None, batch_size: int, device, progress: bool = False) -> list:
    """Loss and top-1 accuracy of a ViT on the validation split of `data` (default: the run's own data)."""
    from depthlab.card import Scores
    from depthlab.data.images import build_image_data
    from depthlab.eval.images import evaluate_images

    cfg = loaded.cfg
    m = cfg.model
    split = build_image_data(data if data else cfg.data.paths, m.image_size, m.channels, cfg.data.val_fraction)
    if len(split.val_y) and int(split.val_y.max()) >= m.num_classes:
        raise UserError(f"{split.source}: labels go up to {int(split.val_y.max())}, but the model has "
                        f"{m.num_classes} classes (0..{m.num_classes - 1})")
    res = evaluate_images(loaded.model, split.val_x, split.val_y, batch_size, device, cfg.train.dtype, progress)
    print(f"{loaded.path}: ViT, scheme {m.norm_scheme}, data {split.source}")
    print(f"loss {res['val_loss']:.4f}  top-1 accuracy {res['val_acc']:.4f}  images {res['val_images']}")
    return [Scores("images", split.source, {"loss": res["val_loss"], "accuracy": res["val_acc"]},
                   "image-classification")]


def eval_perplexity(loaded, data: list[str] | None, seq_len: int | None, batch_size: int, device,
                    progress: bool = False, n_tokens: int | None = None) -> list:
    """Per-token loss and perplexity of a loaded model on `data`, or on a run's own validation split (the tokens
    the run kept when it has them, so the corpus is not read and tokenized again)."""
    import numpy as np

    from depthlab.card import Scores
    from depthlab.data.dataset import build_token_data, eval_tokens, saved_val_tokens
    from depthlab.eval.perplexity import evaluate
    from depthlab.paths import VAL_TOKENS, run_of

    seq_len = seq_len or loaded.seq_len
    if seq_len > loaded.context:
        raise UserError(f"--seq-len {seq_len} is beyond the model's context of {loaded.context} tokens")
    cfg, tok = loaded.cfg, loaded.fast_tokenizer()
    if not data and loaded.meta is not None and loaded.meta.data.get("task") == "finetune":
        from depthlab.eval.perplexity import finetune_validation

        res = finetune_validation(loaded, batch_size, device)
        print(f"{loaded.path}: scheme {cfg.model.norm_scheme}, fine-tuned on {cfg.data.paths[0]} (held-out records)")
        print(f"response loss {res['val_loss']:.4f}  perplexity {res['val_ppl']:.3f}  tokens {res['val_tokens']}")
        return [Scores("response loss", f"{cfg.data.paths[0]} (held-out records)",
                       {"loss": res["val_loss"], "perplexity": res["val_ppl"]}, "text-generation")]
    if data:
        tokens, source = eval_tokens(data, tok, cfg.data.text_field if cfg else "text", progress)
    elif cfg is None:
        raise UserError(f"{loaded.path} is a Hugging Face model directory with no validation split of its own; "
                        "give the text to evaluate on with --data")
    elif (tokens := saved_val_tokens(run_of(loaded.path), loaded.meta.data.get("val_digest"))) is not None:
        source = f"the run's validation split ({loaded.meta.source}; the tokens it kept in {VAL_TOKENS})"
    else:
        split = build_token_data(cfg, tokenizer=tok, progress=progress)
        tokens, source = split.val, f"the run's validation split ({split.source})"
    if len(tokens) < seq_len + 1:
        raise UserError(f"only {len(tokens)} tokens in {source}; need at least {seq_len + 1}")
    from depthlab.eval.perplexity import first_tokens

    text_tokens = len(tokens)
    tokens = first_tokens(tokens, n_tokens, seq_len)
    res = evaluate(loaded.lm(), np.asarray(tokens), seq_len, batch_size, device, cfg.train.dtype if cfg else "fp32",
                   progress=progress, desc="eval")
    what = f"scheme {cfg.model.norm_scheme}" if cfg else type(loaded.model).__name__
    print(f"{loaded.path}: {what}, data {source}")
    print(f"loss {res['val_loss']:.4f}  perplexity {res['val_ppl']:.3f}  tokens {res['val_tokens']}  "
          f"window {seq_len}  ({res['val_tokens']:,} of the text's {text_tokens - 1:,} next tokens scored, in "
          f"{res['val_tokens'] // seq_len} windows)")
    return [Scores("perplexity", source, {"loss": res["val_loss"], "perplexity": res["val_ppl"]}, "text-generation")]

KINDS = {  # the old spelling's flag that chose each kind, first the one that won when several were given
    "harness": "--harness", "commonsense": "--commonsense", "mmlu": "--mmlu", "tasks": "--tasks"}


def new_spelling(argv: list[str]) -> list[str]:
    """`eval MODEL ...` as the spelling before the subcommands chose its kind (by --harness, --commonsense, --mmlu
    or --tasks; without them a ViT's images, else perplexity): `eval KIND MODEL ...`, said in one line on stderr.
    Any other command line stays as it is (a word that names no path is a kind mistyped: argparse says so)."""
    if len(argv) < 2 or argv[0] != "eval" or argv[1] in (*KINDS, "ppl", "images") or argv[1].startswith("-"):
        return argv
    given = {a.split("=")[0] for a in argv[1:]}
    kind = next((k for k, flag in KINDS.items() if flag in given), None)
    if kind is None and "/" not in argv[1] and not Path(argv[1]).exists():  # a kind mistyped, not a model
        return argv
    kind = kind or ("images" if is_vit(argv[1]) else "ppl")
    new = ["eval", kind, *argv[1:]]
    if kind == "mmlu" and "--table" not in given:  # its table's name then, `eval mmlu`'s is mmlu
        new += ["--table", "commonsense"]
    print(f"depthlab: deprecated: eval takes the kind of score first: `depthlab {shlex.join(new)}`",
          file=sys.stderr)
    return new


def is_vit(path: str) -> bool:
    """Whether `path` names a depthlab ViT (its config says so); anything unreadable is left to the command."""
    from depthlab.checkpoint import CONFIG
    from depthlab.config import Config
    from depthlab.paths import Kind, model_path

    try:
        kind, p = model_path(path, warn=lambda msg: None)
        return kind is Kind.CHECKPOINT and Config.load(p / CONFIG).model.is_vit
    except (UserError, OSError, ValueError):
        return False


def add_commands(sub) -> None:
    e = sub.add_parser("eval", help="score a model: perplexity, images, multiple choice, MMLU, the commonsense "
                       "table, lm-evaluation-harness", description="Score a model (a checkpoint, a run's newest one, "
                       "or a Hugging Face model directory); one subcommand per kind of score. `depthlab eval MODEL "
                       "...` without a kind still works: it says the spelling it stands for.")
    kinds = e.add_subparsers(dest="eval_command", metavar="KIND", required=True)
    _add_ppl(kinds)
    _add_images(kinds)
    _add_tasks(kinds)
    _add_harness(kinds)
    _add_table(kinds, "mmlu")
    _add_table(kinds, "commonsense")


def _kind(kinds, name: str, func, help: str, description: str, several: bool = False, card: bool = True):
    """The subcommand `eval NAME` running func, with its MODEL (several: a table's, one row each) and, for a kind
    whose numbers go on a model card, --card."""
    from depthlab.ownership import INPUT, UPDATED

    p = kinds.add_parser(name, help=help, description=description)
    if several:
        p.add_argument("models", metavar="MODEL", nargs="+", type=INPUT, help=MODEL_HELP + " (several: one row "
                       "each)")
    else:
        p.add_argument("model", metavar="MODEL", type=INPUT, help=MODEL_HELP)
    if card:
        p.add_argument("--card", type=UPDATED, metavar="EXPORT_DIR", help="add the results to the model card "
                       "(README.md) of this `depthlab export` of the model evaluated, in the Hub's eval-results "
                       "format (docs/hf.md)")
    p.set_defaults(func=carded(func) if card else func)
    return p


def _device(p, batch: bool = True, placed: bool = True) -> None:
    from depthlab.flags import at_least
    from depthlab.loading import add_placement_options

    if batch:
        p.add_argument("--batch-size", type=at_least(1), default=16)
    p.add_argument("--device", type=str, default="auto")
    if placed:
        add_placement_options(p, "the evaluation gives the numbers of one device")


def _data(p, what: str) -> None:
    from depthlab.ownership import INPUT

    p.add_argument("--data", nargs="+", type=INPUT, metavar="PATH", help=what)


def _no_progress(p, what: str) -> None:
    p.add_argument("--no-progress", action="store_true", help=f"no progress bars (shown on a terminal only: {what})")


def _add_ppl(kinds) -> None:
    from depthlab.flags import at_least

    p = _kind(kinds, "ppl", cmd_ppl, "validation loss and perplexity of a language model", "Per-token mean loss "
              "and perplexity of a language model, on --data or, by default, on the run's own validation split (a "
              "fine-tune's: its held-out records' response tokens).")
    _data(p, "text files or folders to evaluate on, or a prepared directory (its validation split)")
    p.add_argument("--seq-len", type=at_least(1), help="window length (default: the run's; HF models: their "
                   "context, at most 512)")
    p.add_argument("--tokens", type=at_least(1), metavar="N", help="score the first N next tokens, in whole windows "
                   "(default: every window of the text)")
    _device(p)
    _no_progress(p, "tokenizing --data, the evaluation")


def _add_images(kinds) -> None:
    p = _kind(kinds, "images", cmd_images, "loss and top-1 accuracy of a ViT", "Mean loss and top-1 accuracy of a "
              "depthlab ViT on the validation split of --data, by default of the run's own images.")
    _data(p, "images to evaluate on (what `train --data` takes for a ViT: an ImageFolder tree, a .npz, CIFAR-10)")
    _device(p)
    _no_progress(p, "the evaluation's batches")


def _add_tasks(kinds) -> None:
    from depthlab.ownership import INPUT

    p = _kind(kinds, "tasks", cmd_tasks, "zero-shot multiple choice from JSONL task files", "Accuracy and "
              "length-normalised accuracy on multiple-choice task files, scored by log-likelihood with "
              "lm-evaluation-harness's semantics (docs/hf.md).")
    p.add_argument("--tasks", nargs="+", required=True, type=INPUT, metavar="FILE.jsonl", help="multiple-choice "
                   "task files (question, choices, answer index)")
    _device(p, batch=False)
    _no_progress(p, "each file's questions")


def _add_harness(kinds) -> None:
    from depthlab.ownership import INPUT

    p = _kind(kinds, "harness", cmd_harness, "lm-evaluation-harness tasks through depthlab's adapter (any scheme)",
              "Run lm-evaluation-harness tasks on the model through depthlab's adapter (any scheme; needs "
              "depthlab[eval]; docs/hf.md).", card=False)
    p.add_argument("--harness", nargs="+", required=True, type=INPUT, metavar="TASK", help="lm-eval task names, "
                   "YAML task files or folders of them")
    _device(p)
    _no_progress(p, "lm-eval's")


def _add_table(kinds, kind: str) -> None:
    """`eval mmlu` and `eval commonsense`: a table of every model given, written as PREFIX.md and PREFIX.json."""
    from depthlab.flags import at_least
    from depthlab.ownership import INPUT, PREFIX

    mmlu_help = ("MMLU from local files (cais/mmlu's SUBJECT/test-*.parquet and dev-*.parquet, or the original "
                 "test/SUBJECT_test.csv and dev/SUBJECT_dev.csv), scored as lm-evaluation-harness's mmlu task")
    if kind == "mmlu":
        p = _kind(kinds, "mmlu", cmd_table, "MMLU from local files, a table of every model", mmlu_help + "; a table "
                  "of every model (docs/downstream.md).", several=True)
        p.add_argument("--mmlu", required=True, type=INPUT, metavar="DIR", help="the MMLU directory")
        p.set_defaults(commonsense=None, max_new_tokens=32)  # the table without the commonsense columns
    else:
        p = _kind(kinds, "commonsense", cmd_table, "the paper's eight commonsense tasks, a table of every model",
                  "The eight commonsense tasks, DIR/<task>/test.json in LLM-Adapters' layout (boolq, piqa, "
                  "social_i_qa, hellaswag, winogrande, ARC-Easy, ARC-Challenge, openbookqa): greedy generation with "
                  "answer extraction and log-likelihood, a table of every model (docs/downstream.md).", several=True)
        p.add_argument("--commonsense", required=True, type=INPUT, metavar="DIR", help="the tasks' directory")
        p.add_argument("--mmlu", type=INPUT, metavar="DIR", help=mmlu_help + ": the table gets the paper's columns "
                       "(MMLU, BoolQ, ARC-e, PIQA, HellaSwag, OBQA, WinoGrande)")
        p.add_argument("--max-new-tokens", type=at_least(1), default=32, help="greedy decoding length")
    p.add_argument("--mmlu-shots", type=at_least(0), default=0, metavar="K", help="examples from each MMLU "
                   "subject's dev split in front of every question (0 or 5 as in the paper's harness; default 0)")
    p.add_argument("--table", type=PREFIX, default=kind, metavar="PREFIX", help=f"write PREFIX.md and PREFIX.json "
                   f"(default: {kind}); existing ones must be an earlier table")
    p.add_argument("--overwrite", action="store_true", help="replace PREFIX.md / PREFIX.json even if they are not "
                   "an earlier table")
    _device(p, batch=False, placed=False)
    _no_progress(p, "each model's tasks")
