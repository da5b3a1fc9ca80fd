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
scored as `depthlab eval tasks` scores it (tests/test_lmeval_backend.py). Needs `pip install 'depthlab[eval]'`.
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
    sys.exit("depthlab: error: lm-eval's command line needs lm-evaluation-harness: pip install 'depthlab[eval]'")

from depthlab.device import resolve_device
from depthlab.eval.harness import DepthlabLM
from depthlab.eval.multiple_choice import scorer_for
from depthlab.loading import load_model

DEFAULT_BATCH = 16


@register_model("depthlab")
class DepthlabModel(DepthlabLM):
    def __init__(self, path: str, device: str | None = None, dtype: str = "float32", batch_size: int | str = 1,
                 max_batch_size: int | None = None, max_gen_toks: int | str = 256,
                 trust_remote_code: bool | str = False):
        """lm-eval builds it from `--model_args` (strings, or values it parsed) and its own device and batch size;
        `max_batch_size` (lm-eval's cap on `auto`) has nothing to cap here."""
        loaded = load_model(path, device=str(resolve_device(device or "auto")), dtype=dtype,
                            trust_remote_code=str(trust_remote_code).lower() == "true")
        batch = DEFAULT_BATCH if str(batch_size).startswith("auto") else int(batch_size)
        super().__init__(scorer_for(loaded), batch, int(max_gen_toks))


def main() -> None:
    """lm-eval's command line, with the `depthlab` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
