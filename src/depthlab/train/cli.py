"""`depthlab finetune`: full or LoRA fine-tuning of a checkpoint on instruction records (depthlab.train.finetune)."""

from __future__ import annotations

from depthlab import UserError


def cmd_finetune(args) -> None:
    from depthlab.train.finetune import finetune, finetune_config

    if args.resume == "auto" and not args.run_dir:
        raise UserError("--resume auto needs --run-dir (the run directory to continue)")
    if args.seq_len is not None and args.seq_len < 1:
        raise UserError(f"--seq-len must be at least 1, got {args.seq_len}")
    from depthlab.paths import Kind, what_is

    if what_is(args.model) is Kind.HF:
        raise UserError(f"{args.model} is a Hugging Face model directory; fine-tuning starts from a depthlab "
                        f"checkpoint: import it first (`depthlab import {args.model} CKPT`) and fine-tune CKPT")
    overrides = args.set + ([f"train.out_dir={args.out}"] if args.out else [])
    cfg, ckpt = finetune_config(args.model, args.data, args.seq_len, overrides, lora_settings(args))
    if cfg.model.is_vit:
        raise UserError(f"finetune needs a language model, and {ckpt} is a ViT (an image classifier)")
    result = finetune(cfg, ckpt, run_dir=args.run_dir, resume=args.resume, progress=not args.no_progress,
                      overwrite=args.overwrite)
    print(f"run directory: {result.run_dir}")
    print(f"checkpoint:    {result.checkpoint}")
    print(f"final validation loss (response tokens) {result.val_loss:.4f} ({result.steps} steps, "
          f"{result.wall_s:.0f} s)")


def lora_settings(args):
    """The LoraConfig of --lora and its options (None without --lora); one line for an option without it."""
    from depthlab.config import LoraConfig

    given = [f"--lora-{n}" for n in ("rank", "alpha", "dropout", "targets") if getattr(args, f"lora_{n}") is not None]
    if not args.lora:
        if given:
            raise UserError(f"{given[0]} needs --lora (without it every weight trains)")
        return None
    rank = 32 if args.lora_rank is None else args.lora_rank
    if rank < 1:
        raise UserError(f"--lora-rank must be a positive integer, got {rank}")
    targets = LoraConfig().targets if args.lora_targets is None else \
        [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    return LoraConfig(rank, 2.0 * rank if args.lora_alpha is None else args.lora_alpha,
                      0.05 if args.lora_dropout is None else args.lora_dropout, targets)


def add_commands(sub) -> None:
    from depthlab.flags import SET_EPILOG, at_least, fraction, positive
    from depthlab.ownership import CONTINUED, FOLDER, INPUT, OUTPUT

    f = sub.add_parser("finetune", help="supervised fine-tuning on Commonsense170K-format instruction data",
                       epilog=SET_EPILOG, description="Full or LoRA fine-tuning of a depthlab checkpoint (a run, an "
                       "import of an HF model or of an export: `depthlab import`) on instruction / input / output "
                       "records, in LLM-Adapters' prompt template, with the loss on the response tokens only "
                       "(docs/downstream.md).")
    f.add_argument("model", type=INPUT, metavar="MODEL", help="a depthlab checkpoint or run directory")
    f.add_argument("--data", required=True, type=INPUT, metavar="FILE", help="a JSON array or JSON lines of records "
                   "with "
                   "instruction, input, output (commonsense_170k.json)")
    f.add_argument("--seq-len", type=at_least(1), help="tokens per example, longer ones truncated (default: 256, "
                   "at most the model's context)")
    f.add_argument("--out", type=FOLDER, help="parent directory for a new run directory (same as --set "
                   "train.out_dir=...)")
    f.add_argument("--run-dir", type=OUTPUT, help="use exactly this run directory (with --resume auto: continue it)")
    f.add_argument("--resume", type=CONTINUED, metavar="auto|PATH", help="auto: the newest valid checkpoint in "
                   "--run-dir")
    f.add_argument("--overwrite", action="store_true", help="replace the run directory even if it is not "
                   "this command's own kind of output (another run, other files)")
    f.add_argument("--set", action="append", type=str, default=[], metavar="KEY=VALUE", help="override a config "
                   "field, e.g. "
                   "train.lr=1e-4 train.max_steps=1000 (defaults: lr 3e-4, 200 steps)")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.add_argument("--lora", action="store_true", help="LoRA through peft: train low-rank adapters only, the "
                   "weights frozen (needs depthlab[lora]; LLM-Adapters' defaults below)")
    f.add_argument("--lora-rank", type=int, metavar="R", help="with --lora: the adapters' rank (default 32)")
    f.add_argument("--lora-alpha", type=positive, metavar="A", help="with --lora: the adapters' output is scaled by "
                   "A / R (default 2 x R: 64 at rank 32)")
    f.add_argument("--lora-dropout", type=fraction, metavar="P", help="with --lora: dropout on the adapters' input "
                   "(default 0.05)")
    f.add_argument("--lora-targets", type=str, metavar="LIST", help="with --lora: the projections to adapt, of q, k, "
                   "v, o, "
                   "gate, up, down (default q,k,v,up,down)")
    f.set_defaults(func=cmd_finetune)
