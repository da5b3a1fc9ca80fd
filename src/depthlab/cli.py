"""depthlab command line. User mistakes end in one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from depthlab import UserError, __version__

# Packages that add their own subcommands: each module has `add_commands(subparsers)`.
COMMAND_MODULES: tuple[str, ...] = ("depthlab.data.cli", "depthlab.hf.cli", "depthlab.analysis.cli")

EPILOG = "Configs are typed dataclasses; --set takes dotted paths, e.g. --set model.n_layers=24 --set train.lr=2e-3"


def build_config(args):
    from depthlab.config import Config, apply_overrides, preset
    from depthlab.model.validate import validate

    if getattr(args, "resume", None):  # continue a run with its own config; flags given override it
        from depthlab.train.checkpoint import newest_valid_checkpoint

        src = Path(args.run_dir) if args.resume == "auto" else Path(args.resume)
        is_ckpt = (src / "config.json").is_file() and (src / "meta.json").is_file()
        # only the config is needed here; the trainer verifies the checkpoint and reports skipped ones, once
        ckpt = src if is_ckpt else newest_valid_checkpoint(src, warn=lambda msg: None)
        base = (ckpt or src) / "config.json"
        cfg = Config.load(base) if base.is_file() else (Config.load(args.config) if args.config else preset(args.preset))
    else:
        cfg = Config.load(args.config) if args.config else preset(args.preset)
    if getattr(args, "init_from", None):  # the architecture comes with the weights; --scheme / --set may change it
        from depthlab.train.checkpoint import CONFIG, find_checkpoint

        cfg.model = Config.load(find_checkpoint(args.init_from) / CONFIG).model
        cfg.train.init_from = args.init_from
    overrides = list(args.set or [])
    if args.scheme:
        overrides.append(f"model.norm_scheme={args.scheme}")
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.out:
        overrides.append(f"train.out_dir={args.out}")
    cfg = apply_overrides(cfg, overrides)
    if args.data:
        cfg.data.paths = list(args.data)
    return validate(cfg)


def cmd_train(args) -> None:
    from depthlab.train.trainer import train

    if args.resume == "auto" and not args.run_dir:
        raise UserError("--resume auto needs --run-dir (the run directory to continue)")
    cfg = build_config(args)
    result = train(cfg, run_dir=args.run_dir, resume=args.resume, progress=not args.no_progress)
    if int(os.environ.get("RANK", 0)):  # under torchrun, rank 0 reports
        return
    print(f"run directory: {result.run_dir}")
    print(f"checkpoint:    {result.checkpoint}")
    print(f"final validation loss {result.val_loss:.4f}, perplexity {result.val_ppl:.2f} "
          f"({result.steps} steps, {result.wall_s:.0f} s)")


def cmd_eval(args) -> None:
    if args.tasks:
        from depthlab.hf.mc_eval import cmd_eval_tasks

        return cmd_eval_tasks(args)
    import numpy as np

    from depthlab.data.dataset import build_token_data, eval_tokens
    from depthlab.data.tokenizer import load_tokenizer
    from depthlab.train.checkpoint import TOKENIZER, find_checkpoint, load_checkpoint
    from depthlab.train.trainer import evaluate, resolve_device

    ckpt = find_checkpoint(args.checkpoint)
    device = resolve_device(args.device)
    model, cfg, _ = load_checkpoint(ckpt, device=str(device))
    tok = load_tokenizer(ckpt / TOKENIZER)
    if args.data:
        tokens, source = eval_tokens(args.data, tok, cfg.data.text_field)
    else:
        data = build_token_data(cfg, tokenizer=tok)
        tokens, source = data.val, f"the run's validation split ({data.source})"
    seq_len = args.seq_len or cfg.data.seq_len
    if len(tokens) < seq_len + 1:
        raise UserError(f"only {len(tokens)} tokens in {source}; need at least {seq_len + 1}")
    res = evaluate(model, np.asarray(tokens), seq_len, args.batch_size, device, cfg.train.dtype)
    print(f"{ckpt}: scheme {cfg.model.norm_scheme}, data {source}")
    print(f"loss {res['val_loss']:.4f}  perplexity {res['val_ppl']:.3f}  tokens {res['val_tokens']}")


def cmd_schemes(args) -> None:
    from depthlab.model.schemes import SCHEMES

    for name, cls in SCHEMES.items():
        print(f"{name:11s} {(cls.__doc__ or '').strip().splitlines()[0]}")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="depthlab", description="Train and diagnose LLMs whose every layer counts "
                                "(LayerNorm Scaling, arXiv 2502.05795, and other normalization schemes).")
    p.add_argument("--version", action="version", version=f"depthlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a LLaMA-style model (no arguments: the CPU demo)", epilog=EPILOG,
                       description="Train a LLaMA-style model under a normalization scheme. With no arguments: "
                       "the cpu-tiny preset with LNS on the built-in corpus, a few minutes on 2 CPU cores.")
    t.add_argument("--preset", default="cpu-tiny", help="cpu-tiny (default), llama-71m, llama-130m, llama-250m, "
                   "llama-350m, llama-1b")
    t.add_argument("--config", help="a JSON or YAML config file (instead of --preset)")
    t.add_argument("--scheme", help="normalization scheme (see `depthlab schemes`)")
    t.add_argument("--data", nargs="+", metavar="PATH", help="a prepared directory (`depthlab data prepare`), or "
                   "text / JSON lines (C4) / parquet files, folders, globs, hf:NAME datasets (default: built-in corpus)")
    t.add_argument("--out", help="parent directory for a new, timestamped run directory (default: runs)")
    t.add_argument("--run-dir", help="use exactly this run directory (with --resume auto: continue it if it has a "
                   "valid checkpoint, else start it)")
    t.add_argument("--resume", metavar="auto|PATH", help="auto: the newest valid checkpoint in --run-dir; or a "
                   "checkpoint / run directory. The run's own config is used; --set may change only "
                   "operational fields (logging, checkpointing, device)")
    t.add_argument("--max-steps", type=int, help="number of optimizer steps")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    t.add_argument("--init-from", metavar="CKPT", help="start from this checkpoint's weights and architecture (e.g. "
                   "one made by `depthlab import`), with a fresh optimizer: continued pretraining, for example "
                   "with --scheme lns")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="validation loss and perplexity of a checkpoint",
                       description="Per-token mean loss and perplexity of a checkpoint (or a run's newest one), on "
                       "--data or, by default, on the run's own validation split.")
    e.add_argument("checkpoint", help="checkpoint directory or run directory (with --tasks: also an HF model dir)")
    e.add_argument("--data", nargs="+", metavar="PATH", help="text files or folders to evaluate on, or a prepared "
                   "directory (its validation split)")
    e.add_argument("--tasks", nargs="+", metavar="FILE.jsonl", help="multiple-choice task files instead "
                   "(question, choices, answer index; docs/hf.md): accuracy and length-normalised accuracy")
    e.add_argument("--seq-len", type=int, help="window length (default: the run's)")
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--device", default="auto")
    e.set_defaults(func=cmd_eval)

    s = sub.add_parser("schemes", help="list the normalization schemes")
    s.set_defaults(func=cmd_schemes)

    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    warnings.formatwarning = lambda msg, cat, *a, **k: f"depthlab: warning: {msg}\n"
    try:
        args.func(args)
    except UserError as e:
        print(f"depthlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("depthlab: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
