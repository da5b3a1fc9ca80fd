"""What LayerNorm Scaling costs: training step time of `lns` against `pre`, and inference after export.

Training: the same weights in a `pre` and an `lns` model (LNS adds no parameter, only a constant multiply after
each of the 2N block norms), the same batch, interleaved repetitions; figure: step-time ratio lns / pre
(target within 1%). Because a shared machine's noise is larger than 1%, the extra multiplies are also timed
alone and expressed as a share of the fastest `pre` step.

Inference after export: both models go through the exporter's weight mapping to a stock
transformers.LlamaForCausalLM. The LNS scale is folded into the norm weights, so the two exported models have
the same class, config, parameter shapes and operations; the benchmark checks that, checks the exported `lns`
model reproduces depthlab's `lns` logits, and times a forward pass of both (ratio expected 1 within noise).

    python -m benchmarks.lns_cost
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, replace

import torch

from benchmarks.common import environment, interleaved, make_train_step, paired_ratio, write_result
from benchmarks.train_speed import CASES
from depthlab.config import ModelConfig
from depthlab.hf.exporter import hf_weights_and_config
from depthlab.model import Transformer
from depthlab.study.page.systems import lns, lns_section


def pre_and_lns(case: str) -> tuple[Transformer, Transformer, torch.Tensor]:
    dims, batch, seq = CASES[case]
    torch.manual_seed(0)
    pre = Transformer(ModelConfig(**dims, max_seq_len=seq, norm_scheme="pre")).train()
    lns = Transformer(replace(pre.cfg, norm_scheme="lns"), init=False).train()
    lns.load_state_dict(pre.state_dict(), strict=True)  # same weights: LNS has no parameter of its own
    x = torch.randint(0, pre.cfg.vocab_size, (batch, seq))
    return pre, lns, x


def exported(model: Transformer):
    import transformers

    state, fields = hf_weights_and_config(model)
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "torch_dtype", "model_type")}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).eval()
    hf.load_state_dict(state, strict=False)
    return hf, fields


def training_cost(case: str, dtype: str, reps: int, steps: int) -> dict:
    pre, lns, x = pre_and_lns(case)
    y = torch.roll(x, -1, dims=1)
    times = interleaved({"pre": make_train_step(pre, x, y, dtype, hf=False, fused_adamw=True),
                         "lns": make_train_step(lns, x, y, dtype, hf=False, fused_adamw=True)}, reps, steps)
    return {"case": case, "dtype": dtype, "model": asdict(pre.cfg), "tokens_per_step": x.numel(), "step_s": times,
            "step_time_ratio_lns_over_pre": paired_ratio(times["lns"], times["pre"]),
            "scale_ops": scale_ops_cost(case, min(times["pre"]))}


def scale_ops_cost(case: str, pre_step_s: float, calls: int = 50) -> dict:
    """What LNS adds to a step, timed in isolation (a paired step-time ratio on a shared machine cannot resolve
    1%): per step, 2N multiplies of a (batch, seq, dim) norm output by a constant in forward and 2N of its
    gradient in backward."""
    dims, batch, seq = CASES[case]
    n_mul = 4 * dims["n_layers"]
    # fp32 also under bf16 autocast: RMSNorm multiplies its fp32 weight into the output, which stays fp32
    t = torch.randn(batch, seq, dims["dim"])
    t * 0.5  # warm-up
    t0 = time.process_time()
    for _ in range(calls):
        for _ in range(n_mul):
            t * 0.5
    per_step = (time.process_time() - t0) / calls
    return {"multiplies_per_step": n_mul, "seconds_per_step": per_step, "share_of_pre_step": per_step / pre_step_s}


@torch.no_grad()
def inference_cost(case: str, reps: int, steps: int) -> dict:
    pre, lns, x = pre_and_lns(case)
    lns.eval()
    hf_pre, cfg_pre = exported(pre)
    hf_lns, cfg_lns = exported(lns)
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}  # noqa: E731
    max_diff = (hf_lns(x, use_cache=False).logits - lns(x)).abs().max().item()
    times = interleaved({"pre": lambda: hf_pre(x, use_cache=False), "lns": lambda: hf_lns(x, use_cache=False)},
                        reps, steps)
    return {"case": case, "tokens_per_forward": x.numel(), "same_class": type(hf_pre) is type(hf_lns),
            "same_config": cfg_pre == cfg_lns, "same_parameter_shapes": shapes(hf_pre) == shapes(hf_lns),
            "exported_lns_max_abs_logit_diff": max_diff, "forward_s": times,
            "forward_time_ratio_lns_over_pre": paired_ratio(times["lns"], times["pre"])}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--reps", type=int, default=9, help="interleaved repetitions")
    p.add_argument("--steps", type=int, default=2, help="timed steps per repetition and model")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: PyTorch's default)")
    p.add_argument("--out", help="result file (default benchmarks/results/lns_cost.json)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    train, infer = [], []
    for case in args.case:
        for dtype in args.dtype:
            train.append(training_cost(case, dtype, args.reps, args.steps))
            print(f"{case} {dtype}: training timed ({time.time() - t0:.0f} s)", flush=True)
        infer.append(inference_cost(case, args.reps, args.steps))
    result = {"benchmark": "lns_cost", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
              "wall_s": time.time() - t0, "training": train, "inference": infer}
    path = write_result("lns_cost", result, args.out)
    print("\n".join(lns_section(result) + lns(result)) + f"\nwrote {path}")  # what docs/benchmarks.md will say


if __name__ == "__main__":
    main()
