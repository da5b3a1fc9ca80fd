"""A depthlab model in lm-evaluation-harness's own command line and Python API: `--model depthlab`.

    python -m depthlab.eval.lmeval --model depthlab --model_args path=runs/exp1 --tasks TASK [--include_path DIR]

is lm-eval's command line (`lm_eval`'s arguments and subcommands, unchanged) with the `depthlab` model registered.
lm-eval knows a model once the module that registers it (`lm_eval.api.registry.register_model`) is imported, and
lm-eval 0.4 reads no plugin entry points, so the bare `lm_eval` command cannot see it. In Python:

    import depthlab.eval.lmeval  # registers "depthlab"
    lm_eval.simple_evaluate(model="depthlab", model_args="path=runs/exp1", tasks=[...])

model_args: `path` (a run directory, a checkpoint, or any model depthlab loads, a Hugging Face directory included),
`dtype` (float32, bfloat16 or float16), `max_gen_toks` (256), `trust_remote_code`; lm-eval's `--device` (default:
depthlab's auto) and `--batch_size` (a number; `auto` keeps 16). The model is `depthlab eval harness`'s
(depthlab.eval.harness.DepthlabLM): log-likelihoods, rolling log-likelihoods and greedy generation, each question
scored as `depthlab eval tasks` scores it (tests/test_lmeval_backend.py). A user's mistake is one `depthlab: error:`
line, exit status 2: the depthlab model's settings (`checked`) before lm-eval builds anything, `--limit` and an
unknown task too. Needs `pip install 'depthlab[eval]'`.
"""

from __future__ import annotations

import sys

try:
    # lm-eval fills its registry with its own models (hf, ...) only while the registry is empty: load them first,
    # or registering "depthlab" would hide every other model from the process
    import lm_eval.models  # noqa: F401
    from lm_eval.api.registry import register_model
except ImportError:
    if __name__ != "__main__":
        raise
    print("depthlab: error: lm-eval's command line needs lm-evaluation-harness: pip install 'depthlab[eval]'",
          file=sys.stderr)
    sys.exit(2)

from depthlab import UserError
from depthlab.device import resolve_device
from depthlab.eval.harness import DepthlabLM
from depthlab.eval.multiple_choice import scorer_for
from depthlab.loading import DTYPES, load_model

DEFAULT_BATCH = 16
MODEL_ARGS = ("path", "dtype", "max_gen_toks", "trust_remote_code")


@register_model("depthlab")
class DepthlabModel(DepthlabLM):
    def __init__(self, path: str | None = None, device: str | None = None, dtype: str = "float32",
                 batch_size: int | str = 1, max_batch_size: int | None = None, max_gen_toks: int | str = 256,
                 trust_remote_code: bool | str = False, **unknown):
        """lm-eval builds it from `--model_args` (strings, or values it parsed) and its own device and batch size;
        `max_batch_size` (lm-eval's cap on `auto`) has nothing to cap here. A mistake is one UserError line."""
        given = {"path": path, "dtype": dtype, "max_gen_toks": max_gen_toks,
                 "trust_remote_code": trust_remote_code, **unknown}
        path, dtype, gen, remote, batch, device = checked(given, device, batch_size)
        loaded = load_model(path, device=device, dtype=dtype, trust_remote_code=remote)
        super().__init__(scorer_for(loaded), batch, gen)


def checked(model_args: dict, device: str | None, batch_size) -> tuple:
    """(path, dtype, max_gen_toks, trust_remote_code, batch size, device) from what lm-eval was given for the
    depthlab model, each checked: a mistake is one UserError line naming the setting, before anything loads."""
    from depthlab.paths import model_path

    unknown = [k for k in model_args if k not in MODEL_ARGS]
    if "pretrained" in unknown:
        raise UserError("the depthlab model is named by path=, not pretrained= (lm-eval's hf model's): "
                        "--model_args path=MODEL")
    if unknown:
        raise UserError(f"unknown --model_args {', '.join(map(str, unknown))}: the depthlab model takes "
                        f"{', '.join(MODEL_ARGS)}")
    path = model_args.get("path")
    if path in (None, ""):
        raise UserError("--model_args needs path=MODEL: a run directory, a checkpoint, or a Hugging Face model "
                        "directory")
    model_path(str(path))  # a missing path, or one that names no model: its own line
    dtype = model_args.get("dtype", "float32")
    if dtype not in DTYPES:
        raise UserError(f"--model_args dtype={dtype}: give one of {', '.join(DTYPES)}")
    remote = str(model_args.get("trust_remote_code", False)).lower()
    if remote not in ("true", "false"):
        raise UserError(f"--model_args trust_remote_code={remote}: give true or false")
    gen = _count(model_args.get("max_gen_toks", 256), "--model_args max_gen_toks")
    batch = DEFAULT_BATCH if str(batch_size).startswith("auto") else _count(batch_size, "--batch_size", ", or auto")
    return str(path), dtype, gen, remote == "true", batch, str(resolve_device(device or "auto", "--device"))


def _count(value, what: str, other: str = "") -> int:
    """A whole number of at least 1, as given (lm-eval passes some as text)."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise UserError(f"{what} {value}: give a whole number of at least 1{other}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line, with the `depthlab` model registered. What a user can get wrong is one line and exit
    status 2: the depthlab model's settings, the device and the batch size, checked before lm-eval builds anything;
    --limit; a task lm-eval does not know."""
    from depthlab.entry import run_script

    return run_script(_evaluate, sys.argv[1:] if argv is None else argv)


def _evaluate(argv: list[str]) -> None:
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    setup_logging()
    saved, sys.argv[1:] = sys.argv[1:], argv  # lm-eval's parser reads them there
    try:
        cli = HarnessCLI()
        args = cli.parse_args()
    finally:
        sys.argv[1:] = saved
    if getattr(args, "limit", None) is not None and args.limit <= 0:
        raise UserError(f"--limit {args.limit:g}: give the examples per task (at least 1) or a fraction of each "
                        "(above 0, below 1)")
    if getattr(args, "model", None) == "depthlab":
        given = args.model_args or {}
        if isinstance(given, str):  # from a --config file
            from lm_eval.utils import simple_parse_args_string

            given = simple_parse_args_string(given)
        checked(given, args.device, getattr(args, "batch_size", 1))
        args.device = args.device or "auto"  # else lm-eval's default, cuda:0, on a machine without one too
    try:
        cli.execute(args)
    except ValueError as e:  # lm-eval's own refusal of a task name it does not know, before any model is built
        if not str(e).startswith("Tasks not found"):
            raise
        raise UserError(f"{str(e).replace('Tasks not found', 'unknown lm-eval task')}; `python -m "
                        "depthlab.eval.lmeval ls tasks` lists them (--include_path DIR adds a folder of YAML "
                        "tasks)") from None


if __name__ == "__main__":
    sys.exit(main())
