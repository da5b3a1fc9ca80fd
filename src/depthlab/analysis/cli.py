"""`depthlab analyze`, `depthlab compare`, `depthlab theory`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from depthlab import UserError

TOKENS, PROBES, DROP = 4096, 4, 4  # defaults of --tokens, --probes and --drop-lowest


def _add_model_args(p) -> None:
    from depthlab.flags import SEED, at_least, only_with, positive
    from depthlab.loading import add_placement_options
    from depthlab.ownership import INPUT

    p.add_argument("--data", nargs="+", type=INPUT, metavar="PATH", help="calibration text files or folders (default: "
                   "the "
                   "built-in corpus); for a ViT one image source, whose validation split is used (default: the "
                   "run's own)")
    p.add_argument("--gutenberg", action="store_true", help="each --data file is a Project Gutenberg play: read it "
                   "from the line naming its persons or its first act, its licence header left out (the docs' "
                   "real-model recipe)")
    only_with(p, "--data", "--gutenberg")
    p.add_argument("--tokens", type=at_least(1), default=TOKENS, help="calibration tokens (default 4096; language "
                   "models)")
    p.add_argument("--images", type=at_least(1), help="a ViT's calibration images (default: the whole validation "
                   "split)")
    p.add_argument("--windows", type=at_least(1), help="sample this many windows over the whole calibration text "
                   "(seeded, in text order) instead of reading its first --tokens (language models)")
    p.add_argument("--window-seed", type=SEED, default=0, help="the seed of --windows (default 0)")
    only_with(p, "--windows", "--window-seed")
    p.add_argument("--seq-len", type=at_least(2), help="window length (default: the run's, or 512 for HF models)")
    p.add_argument("--batch-size", type=at_least(1), default=8)
    p.add_argument("--layer-by-layer", action="store_true", help="keep one block's weights in memory at a time "
                   "(for models larger than memory; the same numbers as whole-model mode, no dy/dh_l)")
    p.add_argument("--activation-memory", type=at_least(0), default=1024, metavar="MB", help="with "
                   "--layer-by-layer: the removal streams' activations kept in memory up to this, the rest in a "
                   "temporary folder on disk (default 1024)")
    only_with(p, "--layer-by-layer", "--activation-memory")
    p.add_argument("--no-removal", action="store_true", help="skip the layer-removal study")
    _add_removal_args(p)
    p.add_argument("--no-jacobian", action="store_true", help="skip the Jacobians")
    p.add_argument("--no-init", action="store_true", help="skip the curse index of the same model at "
                   "initialisation (depthlab runs: rebuilt from the run's config and seed)")
    p.add_argument("--inert-delta", type=positive, default=0.005, help="curse index: a block whose removal changes "
                   "the loss by less than this many nats is inert (default 0.005)")
    p.add_argument("--interior", nargs=2, type=at_least(0), default=[1, 2], metavar=("FIRST", "LAST"),
                   help="curse index: leave out the first FIRST and the last LAST blocks (default 1 2)")
    p.add_argument("--probes", type=at_least(1), default=PROBES, help="random projections per Jacobian estimate")
    p.add_argument("--lens-tokens", type=at_least(0), default=512, metavar="N", help="the logit lens at N positions, "
                   "a seeded sample over all the windows (default 512); 0: at every position, the exact lens, whose "
                   "cost is L + 1 heads per token")
    p.add_argument("--device", type=str, default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    add_placement_options(p, "the analysis gives the numbers of one device")
    p.add_argument("--dtype", type=str, default="float32", help="model weights: float32 (default), bfloat16 or "
                   "float16; "
                   "the metrics are accumulated in fp32 either way")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run the model's own code")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (shown on a terminal only: "
                   "tokenizing the calibration text, each pass of the analysis)")


def _add_removal_args(p) -> None:
    from depthlab.eval.gen_tasks import TASK_SPECS
    from depthlab.flags import at_least, only_with
    from depthlab.ownership import INPUT

    p.add_argument("--removal-tasks", nargs="+", type=INPUT, metavar="FILE.jsonl", help="also score each removal by "
                   "these "
                   "multiple-choice files, as `eval tasks` scores them (accuracy, with its 95%% Wilson interval, "
                   "and the log-likelihood of the correct answer)")
    p.add_argument("--removal-mmlu", type=INPUT, metavar="DIR", help="also score each removal by MMLU from local "
                   "files, as "
                   "`eval mmlu` scores it (the paper's Figure 1)")
    p.add_argument("--mmlu-shots", type=at_least(0), default=0, metavar="K", help="with --removal-mmlu: examples "
                   "from each subject's dev split (default 0)")
    only_with(p, "--removal-mmlu", "--mmlu-shots")
    p.add_argument("--removal-commonsense", type=INPUT, metavar="DIR", help="also score each removal by the "
                   "commonsense tasks "
                   "under DIR (DIR/<task>/test.json), in their log-likelihood form")
    p.add_argument("--task-limit", type=at_least(1), metavar="N", help="at most N questions of each task file, MMLU "
                   "subject and commonsense task (default: all)")
    p.add_argument("--removal-generate", nargs="+", metavar="TASK", type=TASK_SPECS, help="also score each removal by "
                   "greedy generation (KV cache, exact match; Hugging Face models): "
                   "add[:digits=3,n=50,seed=0,shots=3], copy[:len=8,...], brackets[:depth=4,...], "
                   "continue:FILE[,words=32,answer=8,...], or a jsonl file of {\"prompt\", \"answer\"} pairs "
                   "(docs/analysis.md)")
    p.add_argument("--sublayers", action="store_true", help="also take out each block's attention alone and its "
                   "MLP alone (their output zeroed)")
    p.add_argument("--linear-replacement", action="store_true", help="also replace each block by the "
                   "least-squares linear map from its input to its output, fitted on calibration windows read "
                   "after the evaluation windows")
    p.add_argument("--linear-fit-tokens", type=at_least(1), default=4096, metavar="N", help="with "
                   "--linear-replacement: tokens of the fit windows (default 4096)")
    only_with(p, "--linear-replacement", "--linear-fit-tokens")
    p.add_argument("--drop-lowest", type=at_least(0), default=DROP, metavar="K", help="also score the model without "
                   "its k least useful blocks (by loss, and by tasks when given), k = 1..K (default 4: the summary's "
                   "first lines give the cost of removing 1, 2 and 4 of them together; 0: none); `depthlab prune "
                   "--drop-lowest k` writes that model")
    p.add_argument("--no-removal-runs", action="store_true", help="skip removing the contiguous runs of 2..L-1 "
                   "blocks chosen by angular distance (removal_runs.csv): one plan per run fewer on every window, "
                   "question and generation; the single blocks, --sublayers and --drop-lowest are still scored")
    p.add_argument("--duplicate", type=at_least(1), default=0, metavar="MAX_SPAN", help="also score the model with "
                   "each span of 1..MAX_SPAN blocks run twice (blocks 0..j, then i..j again, then the rest), by loss "
                   "(and by tasks when given), drawn as an (i, j) heat map; `depthlab duplicate MODEL --span "
                   "START:END OUT` writes that model")


def _removal_tasks(args):
    """The task sources, read and checked before any model loads (depthlab.eval.suite)."""
    sources = [("--removal-tasks", args.removal_tasks), ("--removal-mmlu", args.removal_mmlu),
               ("--removal-commonsense", args.removal_commonsense)]
    given = [flag for flag, value in sources if value]
    if not given:
        if args.task_limit is not None:
            raise UserError("--task-limit has no effect without --removal-tasks, --removal-mmlu or "
                            "--removal-commonsense")
        return None
    if args.no_removal:
        raise UserError(f"{given[0]} has no effect with --no-removal; drop one of them")
    from depthlab.eval.suite import TaskSuite

    return TaskSuite.read(args.removal_tasks or (), args.removal_mmlu, args.mmlu_shots, args.removal_commonsense,
                          args.task_limit, "--removal-tasks")


def _generation_tasks(args) -> list | None:
    """--removal-generate's tasks, drawn or read before any model loads."""
    if not args.removal_generate:
        return None
    for flag, why in (("--no-removal", args.no_removal), ("--layer-by-layer", args.layer_by_layer)):
        if why:
            raise UserError(f"--removal-generate has no effect with {flag}; drop one of them"
                            + (" (generation needs the whole model)" if flag == "--layer-by-layer" else ""))
    from depthlab.eval.gen_tasks import read_tasks

    return read_tasks(args.removal_generate, "--removal-generate")


def _request(args, model: str):
    from depthlab.analysis.analyze import Options
    from depthlab.analysis.curse import CurseSpec
    from depthlab.analysis.run import Request
    from depthlab.loading import placed_device, placement

    removal = not args.no_removal
    off = args.no_removal and "--no-removal"
    for flag, given, why in (("--probes", args.probes != PROBES, args.no_jacobian and "--no-jacobian"),
                             ("--tokens", args.tokens != TOKENS, args.windows and "--windows"),  # reads all the text
                             ("--inert-delta", args.inert_delta != CurseSpec.delta, off),
                             ("--sublayers", args.sublayers, off), ("--drop-lowest", args.drop_lowest != DROP, off),
                             ("--no-removal-runs", args.no_removal_runs, off),
                             ("--linear-replacement", args.linear_replacement, off),
                             ("--duplicate", args.duplicate, args.layer_by_layer and "--layer-by-layer")):
        if given and why:  # the option would be dropped without a word
            raise UserError(f"{flag} has no effect with {why}; drop one of them")
    generate = _generation_tasks(args)
    curse = CurseSpec(delta=args.inert_delta, skip_first=args.interior[0], skip_last=args.interior[1])
    opts = Options(removal=removal, sublayers=args.sublayers, linear=args.linear_replacement,
                   drop_lowest=args.drop_lowest, activation_mb=args.activation_memory, jacobian=not args.no_jacobian,
                   duplicate=args.duplicate, runs=not args.no_removal_runs,
                   probes=args.probes, curse=curse, progress=not args.no_progress,
                   lens_tokens=args.lens_tokens or None)
    return Request(model, args.data, args.tokens, args.seq_len, args.batch_size, args.layer_by_layer,
                   args.trust_remote_code, placed_device(args, args.layer_by_layer), args.dtype, opts, args.images,
                   not args.no_init, args.windows, args.window_seed, args.tasks, args.linear_fit_tokens,
                   *placement(args), generate, args.gutenberg)


def _results(args, model: str, log=lambda: None) -> dict:
    """Analyse a model, or reuse an earlier analysis when given its output folder (with metrics.json)."""
    from depthlab.analysis.run import run_request
    from depthlab.paths import ANALYSIS_RESULTS, Kind, what_is

    p = Path(model) / ANALYSIS_RESULTS[0]
    if what_is(model) is Kind.ANALYSIS and p.is_file():
        try:
            res = json.loads(p.read_text())
        except (OSError, ValueError, RecursionError) as e:
            raise UserError(f"cannot read {p}: {getattr(e, 'msg', None) or e}") from None
        if not (isinstance(res, dict) and isinstance(res.get("model"), dict) and isinstance(res.get("blocks"), list)):
            raise UserError(f"{p} is not what `depthlab analyze` writes (no model and blocks); analyze the model "
                            "again")
        return res
    log()
    return run_request(_request(args, model))


def _inputs(args, models: list[str]) -> list[str]:
    """What analyze / compare read, which their --out may not be, hold or sit inside: the models and --data."""
    from depthlab.ownership import input_paths

    return [*models, *input_paths(args.data or [])]


def _moved(files: dict[str, Path], tmp: Path, out: Path) -> dict[str, Path]:
    """The written files' paths once the temporary directory is in place as `out`."""
    return {k: out / p.relative_to(tmp) for k, p in files.items()}


def cmd_analyze(args) -> None:
    from depthlab.analysis.analyze import summary_lines
    from depthlab.analysis.report import write_report
    from depthlab.analysis.results import is_classifier
    from depthlab.ownership import is_analysis, writing
    from depthlab.progress import phase, plan_phases

    args.tasks = _removal_tasks(args)  # the task files' errors before any work
    out = Path(args.out or Path("analysis") / (Path(args.model).resolve().name or "model"))
    with writing(out, is_analysis, "analyze", args.overwrite, _inputs(args, [args.model])) as tmp:  # before the work
        res = _results(args, args.model)
        with phase("analyze: writing the report", not args.no_progress, alone=True):
            files = _moved(write_report(res, tmp, Path(args.model).resolve().name), tmp, out)
        plan_phases("", [])
    m = res["model"]
    size = f"{res['sequences']} images, {res['tokens']} tokens" if is_classifier(res) else f"{res['tokens']} tokens"
    logits = f", logits {m['logits']}" if m.get("logits", "none") != "none" else ""
    print(f"{args.model}: {m['class']}, blocks {m['blocks']}, final norm {m['final_norm']}{logits} "
          f"({size}, {res['wall_s']:.1f} s, {res['mode']})")
    for line in summary_lines(res):
        print("  " + line)
    print(f"report: {files['report']}")
    print("plots:  " + ", ".join(p.name for k, p in files.items() if p.suffix == ".png"))


def cmd_compare(args) -> None:
    from depthlab.analysis.report import comparison_lines, write_comparison
    from depthlab.analysis.run import task_of
    from depthlab.ownership import is_comparison, writing

    if len(args.models) < 2:
        raise UserError("compare needs at least two models")
    labels = args.labels or [Path(m).resolve().name for m in args.models]
    if len(labels) != len(args.models):
        raise UserError(f"{len(labels)} labels for {len(args.models)} models")
    if args.labels and len(set(labels)) != len(labels):  # the report's legend would not tell them apart
        twice = next(lab for lab in labels if labels.count(lab) > 1)
        raise UserError(f"--labels names two models {twice!r}; give each model its own label")
    if len(set(labels)) != len(labels):  # default labels: models in folders of one name
        labels = [f"{i + 1}:{lab}" for i, lab in enumerate(labels)]
    args.tasks = _removal_tasks(args)
    tasks = {m: task_of(m) for m in args.models}  # every path checked before minutes of analysis go into the first
    if len(set(tasks.values())) > 1:
        raise UserError("compare needs models of one kind: " + ", ".join(f"{m} is {t}" for m, t in tasks.items()))
    out = Path(args.out or "analysis/compare")
    with writing(out, is_comparison, "compare", args.overwrite, _inputs(args, args.models)) as tmp:
        runs = []
        for m, lab in zip(args.models, labels):
            runs.append((lab, _results(args, m, log=lambda m=m: print(f"analysing {m} ...", file=sys.stderr))))
        files = _moved(write_comparison(runs, tmp), tmp, out)
    for line in comparison_lines(runs):
        print(line)
    print(f"report: {files['report']}")
    print("plots:  " + ", ".join(p.name for p in files.values() if p.suffix == ".png"))


MAX_THEORY_DEPTH = 1_000_000  # iterated in Python and drawn point by point: 10^8 took 23.6 GB


def cmd_theory(args) -> None:

    from depthlab.ownership import writing
    from depthlab.theory import is_theory, simulate, write_theory_report

    sim = simulate(args.depth, c=args.c, sigma0=args.sigma0, power=args.power)
    out = Path(args.out)
    with writing(out, is_theory, "theory", args.overwrite) as tmp:
        files = {k: out / p.name for k, p in write_theory_report(sim, tmp).items()}
    for line in sim.summary():
        print(line)
    print(f"plot: {files['plot']}")


def add_commands(sub) -> None:
    from depthlab.ownership import INPUT, OUTPUT

    a = sub.add_parser("analyze", help="curse-of-depth diagnostics of a causal LM or a ViT, with plots and a report",
                       description="Variance, angular distance, block influence, logit lens, layer removal and "
                       "Jacobians of a depthlab run/checkpoint (language model or ViT) or any Hugging Face "
                       "causal-LM directory.")
    a.add_argument("model", type=INPUT, help="depthlab run or checkpoint directory, or an HF model directory")
    a.add_argument("--out", type=OUTPUT, help="output folder (default: analysis/<model name>); an existing one must "
                   "be an "
                   "earlier report")
    a.add_argument("--overwrite", action="store_true", help="replace --out even if it is not an analysis report")
    _add_model_args(a)
    a.set_defaults(func=cmd_analyze)

    c = sub.add_parser("compare", help="overlay the diagnostics of several models in one report",
                       description="Analyse several models (or reuse `analyze` output folders) and overlay "
                       "them against relative depth, e.g. the same model trained with pre and with lns.")
    c.add_argument("models", nargs="+", type=INPUT, help="model paths, or folders written by `depthlab analyze`")
    c.add_argument("--labels", nargs="+", type=str, help="one label per model")
    c.add_argument("--out", type=OUTPUT, help="output folder (default: analysis/compare); an existing one must be an "
                   "earlier "
                   "comparison")
    c.add_argument("--overwrite", action="store_true", help="replace --out even if it is not a comparison")
    _add_model_args(c)
    c.set_defaults(func=cmd_compare)

    from depthlab.flags import at_least, non_negative, positive

    t = sub.add_parser("theory", help="simulate the paper's variance recursion (Pre-LN vs LNS)",
                       description="Iterate the variance recursions of Lemma 3.2 (Pre-LN) and its LNS "
                       "counterpart up to --depth and plot them against the paper's bounds.")
    t.add_argument("--depth", type=at_least(2, MAX_THEORY_DEPTH), default=1000)
    t.add_argument("--c", type=positive, default=1.0, help="the constant of the Θ-recursion (default 1)")
    t.add_argument("--sigma0", type=positive, default=1.0, help="standard deviation of the embedding output")
    t.add_argument("--power", type=non_negative, default=0.5, help="LNS exponent p in l^(-p) (default 0.5)")
    t.add_argument("--out", type=OUTPUT, default="analysis/theory", help="output folder (default: analysis/theory); an "
                   "existing one must be an earlier theory plot")
    t.add_argument("--overwrite", action="store_true", help="replace --out even if it is not a theory plot")
    t.set_defaults(func=cmd_theory)
