"""depthlab command line. User mistakes end in one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from depthlab import UserError, __version__
from depthlab.entry import one_line_errors, run_script, sigterm_as_interrupt  # noqa: F401 (the study scripts' way in)
from depthlab.flags import SET_EPILOG

# Packages that add their own subcommands: each module has `add_commands(subparsers)`.
COMMAND_MODULES: tuple[str, ...] = ("depthlab.data.cli", "depthlab.hf.cli", "depthlab.surgery.cli",
                                    "depthlab.analysis.cli")
# A module named here is imported only when one of its commands runs, or the whole parser is built: until then the
# command list of `depthlab --help` gives its commands these lines, the ones its own parsers give (a test holds the
# two lists equal). So `depthlab --help`, train and eval import no analysis code, nor the scipy it brings.
LAZY_COMMANDS: dict[str, dict[str, str]] = {"depthlab.analysis.cli": {
    "analyze": "curse-of-depth diagnostics of a causal LM or a ViT, with plots and a report",
    "compare": "overlay the diagnostics of several models in one report",
    "theory": "simulate the paper's variance recursion (Pre-LN vs LNS)"}}

def base_config(args):
    """The config the flags apply to: with --resume the run's own (its checkpoint's, or a started run's), else
    the --config file or the preset."""
    from depthlab.checkpoint import CONFIG
    from depthlab.config import Config
    from depthlab.model.families import preset
    from depthlab.paths import Kind, what_is

    if args.resume == "auto" and args.run_dir and (Path(args.run_dir) / CONFIG).is_file() and \
            what_is(args.run_dir) is Kind.RUN:  # the run's own config; no rank hashes a checkpoint for it
        return saved_config(Path(args.run_dir))
    if args.resume:
        from depthlab.runfolder import resume_point

        # only the config is needed here; the trainer verifies the checkpoint and reports skipped ones, once
        run_dir, ckpt = resume_point(args.run_dir, args.resume)
        if ckpt is not None:
            return saved_config(ckpt, checkpoint=True)
        if what_is(run_dir) is Kind.RUN and (run_dir / CONFIG).is_file():
            return saved_config(run_dir)
    if args.config and args.preset:
        raise UserError("--config and --preset both give the whole starting config; pass one of them (adjust "
                        "either with --set)")
    return Config.load(args.config) if args.config else preset(args.preset or "cpu-tiny")


def saved_config(directory: Path, checkpoint: bool = False):
    """A run's or (`checkpoint`) a checkpoint's config.json, its relative data paths made absolute from the
    directory they were given in (recorded in the run's env.json or the checkpoint's meta, when it has that), so
    a run resumed from another directory reads the same files."""
    from depthlab.checkpoint import CONFIG, read_meta
    from depthlab.config import Config
    from depthlab.data.sources import resolved
    from depthlab.paths import ENV, read_json

    cfg = Config.load(directory / CONFIG)
    if checkpoint:  # unverified: the trainer verifies it and checks the rest
        meta = read_meta(directory)
        cwd = meta.cwd if meta else None
    else:
        env = read_json(directory / ENV)
        cwd = env.get("cwd") if isinstance(env, dict) else None  # an older run records none
    if cwd:
        cfg.data.paths = resolved(cfg.data.paths, cwd)
    return cfg


def build_config(args):
    from depthlab.checkpoint import CONFIG
    from depthlab.config import Config, apply_overrides
    from depthlab.model.validate import validate
    from depthlab.paths import find_checkpoint

    cfg = base_config(args)
    if getattr(args, "init_from", None):  # the architecture comes with the weights; --scheme / --set may change it
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
    if not args.resume:
        follow_family(cfg.model, overrides)
    return validate(cfg)


def follow_family(m, overrides: list[str]) -> None:
    """A family whose stock class fixes the norm's epsilon (OLMo-1) gets it, unless model.norm_eps is set too:
    otherwise the run trains with another epsilon and only export finds out."""
    from depthlab.model.families import FAMILIES

    family = FAMILIES.get(m.family)
    if family is not None and family.fixed_norm_eps is not None and \
            any(o.startswith("model.family=") for o in overrides) and \
            not any(o.startswith("model.norm_eps=") for o in overrides):
        m.norm_eps = family.fixed_norm_eps


def cmd_train(args) -> None:
    from depthlab.train.trainer import train

    if args.resume == "auto" and not args.run_dir:
        raise UserError("--resume auto needs --run-dir (the run directory to continue)")
    cfg = build_config(args)
    if args.dry_run:
        from depthlab.train.plan import check_fits, format_plan, memory_plan

        world = args.world_size or int(os.environ.get("WORLD_SIZE", 1))
        if world < 1:
            raise UserError(f"--world-size must be >= 1, got {world}")
        plan = memory_plan(cfg, world)
        if not int(os.environ.get("RANK", 0)):
            print(format_plan(plan), flush=True)  # the estimate at once, before any measurement
        check_fits(plan, args.gpu_memory)
        if args.measure:
            from depthlab.memtrack import measure_plan

            print(format_plan(measure_plan(cfg, plan, progress=not args.no_progress), layout=False))
        return
    from depthlab.checkpoint import warn
    from depthlab.model.validate import train_warnings

    for msg in train_warnings(cfg):
        warn(msg)
    result = train(cfg, run_dir=args.run_dir, resume=args.resume, progress=not args.no_progress,
                   overwrite=args.overwrite)
    if int(os.environ.get("RANK", 0)):  # under torchrun, rank 0 reports
        return
    print(f"run directory: {result.run_dir}")
    print(f"checkpoint:    {result.checkpoint}")
    metric = (f"top-1 accuracy {result.val['val_acc']:.4f}" if "val_acc" in result.val
              else f"perplexity {result.val_ppl:.2f}, window {cfg.data.seq_len}"
              + (f", {result.val['val_tokens']:,} tokens scored" if "val_tokens" in result.val else ""))
    print(f"final validation loss {result.val_loss:.4f}, {metric} ({result.steps} steps, {result.wall_s:.0f} s)")


def cmd_schemes(args) -> None:
    from depthlab.model.schemes import SCHEMES

    for name, cls in SCHEMES.items():
        print(f"{name:11s} {(cls.__doc__ or '').strip().splitlines()[0]}")


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (its own are a usage block plus a line); subcommands inherit it."""

    def error(self, message: str):
        command = self.prog.removeprefix("depthlab").strip()
        print(f"depthlab: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)",
              file=sys.stderr)
        sys.exit(2)

    def add_argument(self, *names, **kwargs):
        from depthlab.flags import finite

        if kwargs.get("type") is float:  # every float flag of every command: NaN and inf are never a setting
            kwargs["type"] = finite
        return super().add_argument(*names, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        from depthlab.flags import refusal, refuse
        from depthlab.ownership import path_refusal

        namespace, extras = super().parse_known_args(None if args is None else self._dash_values(args), namespace)
        # a value out of range, a flag without the one it acts with, an output where the command reads
        if message := refusal(self, namespace) or path_refusal(self, namespace):
            namespace.func = refuse(message)  # the command is its refusal: one line, before anything is read
        return namespace, extras

    def _dash_values(self, args) -> list[str]:
        """`--remove -1:` as `--remove=-1:`: argparse takes a value that starts with a dash for an option unless it
        is a plain number, and a minus followed by a digit (a span counted from the end) never starts one here."""
        out: list[str] = []
        for arg in args:
            action = self._option_string_actions.get(out[-1]) if out else None
            if action is not None and action.nargs is None and arg[:1] == "-" and arg[1:2].isdigit():
                out[-1] += f"={arg}"
            else:
                out.append(arg)
        return out


def scheme_help() -> str:
    from depthlab.model.schemes import SCHEMES

    return f"normalization scheme: {', '.join(SCHEMES)} (`depthlab schemes` says what each is)"


def add_plan_flags(t) -> None:
    from depthlab.flags import at_least, only_with, positive

    t.add_argument("--dry-run", action="store_true", help="print the layout and the memory plan per rank, and stop")
    t.add_argument("--world-size", type=at_least(1), metavar="N", help="with --dry-run: plan for N ranks (default: "
                   "torchrun's WORLD_SIZE, else 1)")
    t.add_argument("--gpu-memory", type=positive, metavar="GIB", help="with --dry-run: refuse a plan that needs "
                   "more than GIB per rank")
    t.add_argument("--measure", action="store_true", help="with --dry-run: also train two steps of this config on "
                   "the CPU (random tokens) under PyTorch's MemTracker and print its figure beside each estimate")
    only_with(t, "--dry-run", "--world-size", "--gpu-memory", "--measure")


def make_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; given the `command` about to run (main reads it from the arguments; "": none), the
    modules of LAZY_COMMANDS that do not hold it stay unimported, their commands only listed."""
    p = Parser(prog="depthlab", description="Train and diagnose LLMs whose every layer counts "
                                "(LayerNorm Scaling, arXiv 2502.05795, and other normalization schemes).")
    p.add_argument("--version", action="version", version=f"depthlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a LLaMA-style model (no arguments: the CPU demo)", epilog=SET_EPILOG,
                       description="Train a LLaMA-style model under a normalization scheme. With no arguments: "
                       "the cpu-tiny preset with LNS on the built-in corpus, a few minutes on 2 CPU cores.")
    from depthlab.model.families import PRESETS
    from depthlab.ownership import CONTINUED, FOLDER, INPUT, OUTPUT

    t.add_argument("--preset", type=str, help=f"{', '.join(PRESETS)} (default: cpu-tiny)")
    t.add_argument("--config", type=INPUT, help="a JSON or YAML config file (instead of --preset)")
    t.add_argument("--scheme", type=str, help=scheme_help())
    t.add_argument("--data", nargs="+", type=INPUT, metavar="PATH", help="a prepared directory (`depthlab data "
                   "prepare`), or "
                   "text / JSON lines (C4) / parquet files, folders, globs, hf:NAME datasets (default: built-in "
                   "corpus)")
    t.add_argument("--out", type=FOLDER, help="parent directory for a new, timestamped run directory (default: runs)")
    t.add_argument("--run-dir", type=OUTPUT, help="use exactly this run directory (with --resume auto: continue it "
                   "if it has a "
                   "valid checkpoint, else start it)")
    t.add_argument("--resume", type=CONTINUED, metavar="auto|PATH", help="auto: the newest valid checkpoint in "
                   "--run-dir; or a "
                   "checkpoint / run directory, continued in its own run, or with --run-dir in that directory (a "
                   "branch). The run's own config is used; --set may change only operational fields (logging, "
                   "checkpointing, device)")
    t.add_argument("--overwrite", action="store_true", help="use --run-dir even if it holds other files or another "
                   "run (whose checkpoints and metrics are then deleted)")
    t.add_argument("--max-steps", type=int, help="number of optimizer steps")
    t.add_argument("--set", action="append", type=str, metavar="KEY=VALUE", help="override a config field "
                   "(repeatable)")
    t.add_argument("--init-from", type=INPUT, metavar="CKPT", help="start from this checkpoint's weights and "
                   "architecture (e.g. "
                   "one made by `depthlab import`), with a fresh optimizer: continued pretraining, for example "
                   "with --scheme lns")
    t.add_argument("--no-progress", action="store_true", help="no progress bars (the steps' bar; and on a "
                   "terminal, the tokenization's and each validation's)")
    add_plan_flags(t)
    t.set_defaults(func=cmd_train)
    from depthlab.eval.cli import add_commands as add_eval

    add_eval(sub)
    from depthlab.train.cli import add_commands as add_finetune

    add_finetune(sub)
    s = sub.add_parser("schemes", help="list the normalization schemes")
    s.set_defaults(func=cmd_schemes)

    add_package_commands(sub, command)
    add_coord_check(sub)
    return p


def add_package_commands(sub, command: str | None) -> None:
    """Each COMMAND_MODULES module's commands; those of a lazy one that does not hold `command` only listed."""
    import importlib

    for name in COMMAND_MODULES:
        listed = LAZY_COMMANDS.get(name, {})
        if command is not None and listed and command not in listed:
            for lazy, line in listed.items():  # never parsed: running it imports its module
                sub.add_parser(lazy, help=line, add_help=False)
        else:
            importlib.import_module(name).add_commands(sub)


def add_coord_check(sub) -> None:
    from depthlab.flags import at_least
    from depthlab.ownership import INPUT, OUTPUT

    p = sub.add_parser("coord-check", help="depth coordinate check: a few steps at several depths, each block's "
                       "update and activation scale against depth (flat = the rate carries over)",
                       description="Train --steps steps of the config at each of --depths (seeds 0..--seeds-1), "
                       "record each block's update since init, its relative update and its activation RMS, and "
                       "draw them against depth. Records accumulate in OUT/coord_check.jsonl under --name, so "
                       "several parameterizations share one figure (OUT/coord_check.png).")
    p.add_argument("--preset", type=str, help="starting config (default: cpu-tiny)")
    p.add_argument("--config", type=INPUT, help="a JSON or YAML config file (instead of --preset)")
    p.add_argument("--scheme", type=str, help="model.norm_scheme")
    p.add_argument("--data", nargs="+", type=INPUT, metavar="PATH", help="text / prepared data (default: the "
                   "built-in corpus)")
    p.add_argument("--set", action="append", type=str, metavar="KEY=VALUE", help="override a config field "
                   "(repeatable), e.g. "
                   "--set model.depth_alpha=1 --set model.depth_base=2")
    p.add_argument("--depths", nargs="+", type=at_least(1), default=[2, 4, 8, 16, 32, 64])
    p.add_argument("--seeds", type=at_least(1), default=3, help="seeds per depth (default 3)")
    p.add_argument("--steps", type=at_least(1), default=5, help="Adam steps at a constant rate (default 5)")
    p.add_argument("--name", type=str, help="the parameterization's label (default: the scheme and --set overrides)")
    p.add_argument("--out", required=True, type=OUTPUT, metavar="DIR", help="directory for the records and "
                   "figures: new, "
                   "empty, or an earlier coord-check's (its records under other names are kept)")
    p.add_argument("--overwrite", action="store_true", help="write into a --out that holds other files (they are "
                   "left as they are)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_coord_check, resume=None, run_dir=None, max_steps=None, init_from=None)


def cmd_coord_check(args) -> None:
    from depthlab.ownership import claim, input_paths, locked, refuse_own_input
    from depthlab.train.coordcheck import (
        RECORDS,
        coord_check,
        depth_slope,
        diverged,
        keep_records,
        plot,
        read_records,
        slug,
    )

    depths = sorted(set(args.depths))
    if len(depths) < 2:
        raise UserError(f"--depths: give at least two depths (got {depths[0]}); the check draws each block's "
                        "update against depth")
    out = Path(args.out)
    cfg = build_config(argparse_without_out(args))
    name = args.name or " ".join([cfg.model.norm_scheme, *(args.set or [])])
    inputs = input_paths(cfg.data.paths or [])
    refuse_own_input(out, inputs, "coord-check")  # before the lock makes any folder
    with locked(out, "coord-check"):  # held while training: the records are read, added to and rewritten
        claim(out, lambda d: (d / RECORDS).is_file(), "coord-check", args.overwrite, inputs, choose="--out",
              anyway="to write its records and figures there beside the files it holds")
        earlier = read_records(out)  # a bad line is refused before any training
        records = coord_check(cfg, depths, args.seeds, args.steps, name, progress=not args.no_progress)
        kept = keep_records(out, name, records, earlier)
        mine = plot(records, out / f"coord_check_{slug(name)}.png")
        both = plot(kept, out / "coord_check.png")
    lost = diverged(records)
    print(f"{name}: slope of log update against log depth {depth_slope(records):+.3f} (0 = flat)"
          f"{f'; diverged (not finite), left out: depth {str(lost)[1:-1]}' if lost else ''}; figures {mine}, {both}")


def argparse_without_out(args):
    """build_config reads --out as train.out_dir; coord-check's --out is its own folder."""
    return argparse.Namespace(**{**vars(args), "out": None})


def main(argv: list[str] | None = None) -> int:
    from depthlab.eval.cli import new_spelling

    argv = new_spelling(sys.argv[1:] if argv is None else argv)
    parser = make_parser(next((a for a in argv if not a.startswith("-")), ""))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    warnings.formatwarning = lambda msg, cat, *a, **k: f"depthlab: warning: {msg}\n"
    return run_script(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
