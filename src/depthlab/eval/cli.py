"""`depthlab eval`: a model's perplexity on text, a ViT's accuracy on images, multiple-choice tasks, MMLU, the
commonsense table, lm-evaluation-harness tasks. Models load through depthlab.loading, so this command, like the
scorers it runs, needs nothing of depthlab.train, depthlab.hf or depthlab.analysis."""

from __future__ import annotations

import sys

from depthlab import UserError

MODEL_HELP = "a checkpoint, a run directory (its newest valid checkpoint), a directory holding one run, or a " \
    "Hugging Face model directory"


def cmd_eval(args) -> None:
    from depthlab.loading import PLACEMENT, load_model, placed_device, placement

    if args.harness:
        return cmd_harness(args)
    refuse_meaningless(args)
    device = placed_device(args)
    if args.commonsense or args.mmlu:
        if args.device_map:
            raise UserError(f"--device-map places one model; --{'commonsense' if args.commonsense else 'mmlu'} "
                            "evaluates each of its models on one --device")
        return eval_commonsense(args, device)
    if len(args.checkpoint) > 1:
        raise UserError(f"several models ({len(args.checkpoint)}) are compared only with --commonsense DIR or "
                        "--mmlu DIR")
    loaded = load_model(args.checkpoint[0], device=device, **dict(zip(PLACEMENT, placement(args))))
    device = loaded.device  # a placed model's inputs go to its main device
    if args.tasks:
        from depthlab.eval.multiple_choice import evaluate_tasks, scorer_for

        scorer = scorer_for(loaded)
        for task in args.tasks:
            res = evaluate_tasks(scorer, task)
            print(f"{task}: {res['n']} questions  acc {res['acc']:.4f}  acc_norm {res['acc_norm']:.4f}")
        return
    if loaded.cfg is not None and loaded.cfg.model.is_vit:
        if args.seq_len is not None:  # else dropped without a word
            raise UserError("--seq-len does not apply to a ViT: each image is one sequence of patch tokens")
        return eval_images(loaded, args.data, args.batch_size, device)
    eval_perplexity(loaded, args.data, args.seq_len, args.batch_size, device, progress=not args.no_progress)


def refuse_meaningless(args) -> None:
    """One line for an eval option that the chosen mode ignores (it would otherwise be dropped silently)."""
    mode = "--commonsense" if args.commonsense else "--mmlu" if args.mmlu else "--tasks" if args.tasks else None
    table = [("--tasks", args.tasks), ("--data", args.data), ("--seq-len", args.seq_len)]
    ignored = {"--commonsense": table, "--mmlu": [*table, ("--max-new-tokens", args.max_new_tokens != 32)],
               "--tasks": [("--data", args.data), ("--seq-len", args.seq_len)]}.get(mode, [])
    if mode is None:  # perplexity: the table options have nothing to act on
        ignored = [("--table", args.table != "commonsense"), ("--overwrite", args.overwrite),
                   ("--max-new-tokens", args.max_new_tokens != 32), ("--mmlu-shots", args.mmlu_shots != 0)]
    given = [name for name, value in ignored if value not in (None, False, [])]
    if given:
        what = f"with {mode}" if mode else "without --commonsense or --mmlu"
        raise UserError(f"{given[0]} has no effect {what}; drop it (each evaluation is its own command)")


def eval_images(loaded, data: list[str] | None, batch_size: int, device) -> None:
    """Loss and top-1 accuracy of a ViT on the validation split of `data` (default: the run's own data)."""
    from depthlab.data.images import build_image_data
    from depthlab.eval.images import evaluate_images

    cfg = loaded.cfg
    m = cfg.model
    split = build_image_data(data if data else cfg.data.paths, m.image_size, m.channels, cfg.data.val_fraction)
    if len(split.val_y) and int(split.val_y.max()) >= m.num_classes:
        raise UserError(f"{split.source}: labels go up to {int(split.val_y.max())}, but the model has "
                        f"{m.num_classes} classes (0..{m.num_classes - 1})")
    res = evaluate_images(loaded.model, split.val_x, split.val_y, batch_size, device, cfg.train.dtype)
    print(f"{loaded.path}: ViT, scheme {m.norm_scheme}, data {split.source}")
    print(f"loss {res['val_loss']:.4f}  top-1 accuracy {res['val_acc']:.4f}  images {res['val_images']}")


def eval_commonsense(args, device) -> None:
    """The eight-task table, and with --mmlu the paper's table (docs/downstream.md), for every model given."""
    from depthlab.eval.commonsense import evaluate_models, is_table, markdown, table_paths, write_tables
    from depthlab.ownership import writing_files

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    md, js = table_paths(args.table)
    inputs = [p for p in (*args.checkpoint, args.commonsense, args.mmlu) if p]
    with writing_files([md, js], is_table, "eval --commonsense", args.overwrite, inputs) as tmps:  # before the work
        results = evaluate_models(args.checkpoint, args.commonsense, str(device), args.max_new_tokens,
                                  log=lambda msg: print(msg, file=sys.stderr), mmlu=args.mmlu, shots=args.mmlu_shots)
        write_tables(results, *tmps)
    print(markdown(results))
    print(f"wrote {md} and {js}")


def eval_perplexity(loaded, data: list[str] | None, seq_len: int | None, batch_size: int, device,
                    progress: bool = False) -> None:
    """Per-token loss and perplexity of a loaded model on `data`, or on a run's own validation split (the tokens
    the run kept when it has them, so the corpus is not read and tokenized again)."""
    import numpy as np

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
        return
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
    res = evaluate(loaded.lm(), np.asarray(tokens), seq_len, batch_size, device, cfg.train.dtype if cfg else "fp32",
                   progress=progress, desc="eval")
    what = f"scheme {cfg.model.norm_scheme}" if cfg else type(loaded.model).__name__
    print(f"{loaded.path}: {what}, data {source}")
    print(f"loss {res['val_loss']:.4f}  perplexity {res['val_ppl']:.3f}  tokens {res['val_tokens']}  "
          f"window {seq_len}")


def cmd_harness(args) -> None:
    import importlib.util

    from depthlab.loading import PLACEMENT, load_model, placed_device, placement

    given = [name for name, value in (("--tasks", args.tasks), ("--data", args.data),
                                      ("--commonsense", args.commonsense), ("--seq-len", args.seq_len)) if value]
    if given:
        raise UserError(f"--harness runs lm-evaluation-harness tasks; it does not combine with {given[0]}")
    if importlib.util.find_spec("lm_eval") is None:
        raise UserError("--harness needs lm-evaluation-harness: pip install 'depthlab[eval]' (lm-eval, accelerate)")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    from lm_eval.utils import make_table

    from depthlab.eval.harness import run_harness
    from depthlab.eval.multiple_choice import scorer_for

    if len(args.checkpoint) > 1:
        raise UserError("--harness evaluates one model at a time (several models: --commonsense DIR)")
    loaded = load_model(args.checkpoint[0], device=placed_device(args), **dict(zip(PLACEMENT, placement(args))))
    print(make_table(run_harness(scorer_for(loaded), args.harness, batch_size=args.batch_size,
                                 progress=not args.no_progress)))


def add_commonsense_options(e) -> None:
    from depthlab.flags import at_least
    from depthlab.ownership import INPUT, PREFIX

    e.add_argument("--commonsense", type=INPUT, metavar="DIR", help="the eight commonsense tasks, "
                   "DIR/<task>/test.json in "
                   "LLM-Adapters' layout (boolq, piqa, social_i_qa, hellaswag, winogrande, ARC-Easy, ARC-Challenge, "
                   "openbookqa): greedy generation with answer extraction and log-likelihood, a table of every model "
                   "(docs/downstream.md)")
    e.add_argument("--mmlu", type=INPUT, metavar="DIR", help="MMLU from local files (cais/mmlu's "
                   "SUBJECT/test-*.parquet and "
                   "dev-*.parquet, or the original test/SUBJECT_test.csv and dev/SUBJECT_dev.csv), scored as "
                   "lm-evaluation-harness's mmlu task; with --commonsense the table gets the paper's columns (MMLU, "
                   "BoolQ, ARC-e, PIQA, HellaSwag, OBQA, WinoGrande)")
    e.add_argument("--mmlu-shots", type=at_least(0), default=0, metavar="K", help="with --mmlu: examples from each "
                   "subject's dev split in front of every question (0 or 5 as in the paper's harness; default 0)")
    e.add_argument("--table", type=PREFIX, default="commonsense", metavar="PREFIX", help="with --commonsense / "
                   "--mmlu: write "
                   "PREFIX.md and PREFIX.json (default: commonsense); existing ones must be an earlier table")
    e.add_argument("--overwrite", action="store_true", help="with --commonsense: replace PREFIX.md / PREFIX.json "
                   "even if they are not an earlier table")
    e.add_argument("--max-new-tokens", type=at_least(1), default=32, help="with --commonsense: greedy decoding length")


def add_commands(sub) -> None:
    from depthlab.flags import at_least
    from depthlab.loading import add_placement_options
    from depthlab.ownership import INPUT

    e = sub.add_parser("eval", help="validation loss and perplexity of a model",
                       description="Per-token mean loss and perplexity of a model (a checkpoint, a run's newest one, "
                       "or a Hugging Face model directory), on --data or, by default, on the run's own validation "
                       "split.")
    e.add_argument("checkpoint", metavar="MODEL", nargs="+", type=INPUT, help=MODEL_HELP + " (several: with "
                   "--commonsense)")
    e.add_argument("--data", nargs="+", type=INPUT, metavar="PATH", help="text files or folders to evaluate on, or a "
                   "prepared "
                   "directory (its validation split)")
    e.add_argument("--tasks", nargs="+", type=INPUT, metavar="FILE.jsonl", help="multiple-choice task files instead "
                   "(question, choices, answer index; docs/hf.md): accuracy and length-normalised accuracy")
    add_commonsense_options(e)
    e.add_argument("--seq-len", type=at_least(1), help="window length (default: the run's; HF models: their "
                   "context, at most 512)")
    e.add_argument("--batch-size", type=at_least(1), default=16)
    e.add_argument("--device", type=str, default="auto")
    add_placement_options(e, "the evaluation gives the numbers of one device (not with --commonsense / --mmlu)")
    e.add_argument("--no-progress", action="store_true", help="no progress bars (shown on a terminal only: "
                   "tokenizing --data, the evaluation, lm-eval's with --harness)")
    e.add_argument("--harness", nargs="+", type=INPUT, metavar="TASK", help="run lm-evaluation-harness tasks on the "
                   "model through depthlab's adapter (any scheme): lm-eval task names, YAML task files or folders of "
                   "them (needs depthlab[eval]; docs/hf.md)")
    e.set_defaults(func=cmd_eval)
