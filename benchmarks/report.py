"""Write docs/results.md from the result files, so that no figure in it is typed by hand.

    python -m benchmarks.report

Recomputes the studies' results.json from their runs files (depthlab.study.summary, rendered by
benchmarks/study_report.py), reads benchmarks/results/{train_speed,lns_cost}.json and, where it exists,
benchmarks/results/gpu_71m/summary.json; copies the plots to docs/img/. Sections whose result file is missing
say so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.common import best_ratio

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
IMG = DOCS / "img"


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def ms(d: dict | None, fmt: str = ".2f") -> str:
    """mean +- std (n) from a mean_std dict."""
    if not d or d.get("mean") is None:
        return "-"
    return f"{d['mean']:{fmt}} ± {d['std']:{fmt}}"


def ratio(r: dict, fmt: str = ".3f") -> str:
    return f"{r['median']:{fmt}} [{r['min']:{fmt}}, {r['max']:{fmt}}]"


def env_line(env: dict) -> str:
    return (f"{env['cpu']}, torch {env['torch']}, transformers {env['transformers']}, {env['threads']} thread(s), "
            f"load average {env['load_avg_1min']} at the end, {env['date']}, commit {env['git_commit']}")


def speed_section(r: dict | None, compiled: dict | None) -> list[str]:
    out = ["## 2. Training speed: depthlab against `transformers.LlamaForCausalLM`", ""]
    if r is None:
        return out + ["Not run yet (`python -m benchmarks.train_speed`).", ""]
    out += ["Each step is forward + cross-entropy + backward + clipping + AdamW with the trainer's parameter groups, "
            "identical weights and batches for both models (first losses agree to 1e-5). **depthlab** runs the step "
            "as `depthlab train` does (PyTorch's fused AdamW, `depthlab.train.optim.make_optimizer`); `hf` as the "
            "reference code trains (a plain `torch.optim.AdamW`, on CPU a per-tensor loop). `depthlab+default_adamw` "
            "and `hf+fused_adamw` swap the optimizers, so the model code alone is compared by depthlab+default_adamw "
            "against hf, or depthlab against hf+fused_adamw. `+compile`: blocks compiled with torch.compile (fused "
            "AdamW). Speed-up = HF step time (eager, default AdamW: what the reference code runs) / contender step "
            "time: the median of the per-repetition ratios [min, max], and `best` = ratio of each side's fastest "
            "repetition (load only ever adds time). Times are the process's CPU time on one thread (other people's "
            "processes barely change it; wall time would also count the time they hold the core), so tok/s are "
            "tokens per CPU-second, medians over repetitions. MFU is against a 1024³ matmul timed the same way "
            "inside every repetition.", ""]
    for res in (r, compiled):
        if res is None:
            continue
        out += [f"Command: `python -m benchmarks.{res['benchmark']} {' '.join(res['argv'])}` "
                f"({res['wall_s']:.0f} s wall). Machine: {env_line(res['env'])}.", "",
                "| model | dtype | tokens/step | contender | tok/s | MFU | speed-up over HF | best |",
                "|---|---|---|---|---|---|---|---|"]
        for run in res["runs"]:
            st = run["step_s"]
            for n, tok in run["tokens_per_s"].items():
                up = run["speedup_over_hf"].get(n)
                cells = ["1 (reference)", "1"] if up is None else [ratio(up), f"{best_ratio(st['hf'], st[n]):.3f}"]
                name = f"**{n}**" if n == "depthlab" else n
                out.append(f"| {run['case']} ({run['params'] / 1e6:.1f}M) | {run['dtype']} | "
                           f"{run['tokens_per_step']} | {name} | {tok:.0f} | {run['mfu'][n]:.1%} | "
                           + " | ".join(cells) + " |")
        out.append("")
    return out


def lns_section(r: dict | None) -> list[str]:
    out = ["## 3. What LNS costs", ""]
    if r is None:
        return out + ["Not run yet (`python -m benchmarks.lns_cost`).", ""]
    out += [f"Command: `python -m benchmarks.{r['benchmark']} {' '.join(r['argv'])}` ({r['wall_s']:.0f} s wall). "
            f"Machine: {env_line(r['env'])}.", "",
            "Training step time, the same weights in a `pre` and an `lns` model, interleaved (target: within 1%):", "",
            "| model | dtype | step time lns / pre, median [min, max] | best | the scale's multiplies timed alone, "
            "share of a `pre` step |", "|---|---|---|---|---|"]
    for t in r["training"]:
        out.append(f"| {t['case']} | {t['dtype']} | {ratio(t['step_time_ratio_lns_over_pre'], '.4f')} |")
        out[-1] += (f" {best_ratio(t['step_s']['lns'], t['step_s']['pre']):.4f} | "
                    f"{t['scale_ops']['share_of_pre_step']:.2%} ({t['scale_ops']['multiplies_per_step']} multiplies) |")
    out += ["", "Inference after export (`hf_weights_and_config`, the exporter's mapping; LNS folded into the norm "
                "weights). The logit check here uses the initial weights (norm weights 1); "
                "`tests/test_hf_parity.py` checks the fold with random norm weights.", "",
            "| model | same HF class / config / parameter shapes as exported `pre` | max abs logit difference, "
            "exported `lns` vs depthlab `lns` | forward time lns / pre | best |", "|---|---|---|---|---|"]
    for i in r["inference"]:
        same = "/".join("yes" if i[k] else "NO" for k in ("same_class", "same_config", "same_parameter_shapes"))
        out.append(f"| {i['case']} | {same} | {i['exported_lns_max_abs_logit_diff']:.1e} | "
                   f"{ratio(i['forward_time_ratio_lns_over_pre'], '.4f')} | "
                   f"{best_ratio(i['forward_s']['lns'], i['forward_s']['pre']):.4f} |")
    return out + [""]


def gpu_section(r: dict | None) -> list[str]:
    out = ["## 4. LLaMA-71M on a GPU: `pre` against `lns`", "",
           "One command, sized to end well within 8 minutes on an H100-class GPU (two runs of 1,200 steps, batch 64 x "
           "256 tokens, bf16, the built-in corpus with a 32k BPE vocabulary, the paper's 71M dimensions; the time is "
           "an estimate from the FLOP count, not a measurement):", "",
           "    python -m benchmarks.gpu_71m --out benchmarks/results/gpu_71m", "",
           "It is a throughput check (tokens/s, MFU, peak memory), not a test of claim 1: 1,200 steps of 16k tokens "
           "are 0.28 tokens per parameter (the paper trains about 20), too few for a loss difference to mean "
           "anything about depth. Claim 1's GPU question is section 9's part 5.", ""]
    if r is None:
        return out + ["**Not run: no GPU machine was available to this task.** The script was exercised on CPU "
                      "with tiny overrides only (tests/test_benchmarks.py::test_gpu_script_runs_on_cpu_tiny); its "
                      "GPU figures are still to be recorded.", ""]
    out += [f"Run: {env_line(r['env'])}, {r['wall_s']:.0f} s wall.", "",
            "| scheme | val loss | val ppl | tokens/s | MFU |", "|---|---|---|---|---|"]
    for s, x in r["runs"].items():
        out.append(f"| {s} | {x['val_loss']:.4f} | {x['val_ppl']:.2f} | {x['tokens_per_s']:.0f} | {x['mfu']:.1%} |")
    return out + ["", "![loss](img/gpu_71m_loss.png)", ""]


def memory_section(r: dict | None) -> list[str]:
    from benchmarks import memory

    return ["## 5. Memory of a training step: chunked loss against `transformers`", ""] + memory.section(r) + [""]


def scaleout_section(after: dict | None, before: dict | None) -> list[str]:
    from benchmarks import scaleout

    out = ["## 8. Scale-out memory per rank: DDP and FSDP on 2 ranks against one process", ""]
    if after is None:
        return out + ["Not run yet (`python -m benchmarks.scaleout`).", ""]
    out += ["Peak host memory per rank by phase, measured on CPU with gloo (docs/scaling.md explains the layout "
            "and what a GPU adds). After the scale-out work:", ""] + scaleout.section(after) + [""]
    if before is not None:
        out += ["The same script on the code before it (commit 3021c1b):", "", scaleout.table(before), ""]
    return out


def lns_records() -> dict:
    """The LNS study's records, with the depth study's (same settings and corpus) underneath."""
    from depthlab.study.records import load_records

    depth, lns = (load_records(RESULTS / d / "runs.jsonl") for d in ("depth_study", "lns_study"))
    return {**depth, **lns}


def lns_summary() -> dict | None:
    """lns_study() of the LNS study's records (with the depth study's underneath), or None before it ran."""
    from benchmarks import lns_study
    from depthlab.study.summary import lns_study as summary

    if not (RESULTS / "lns_study" / "runs.jsonl").exists():
        return None
    meta = (load(RESULTS / "lns_study" / "settings.json") or {}).get("meta", {})
    res = summary(lns_records(), list(lns_study.PARTS), list(lns_study.UNSTABLE), meta.get("ref_depth", 24))
    return {**res, "unigram_loss": meta.get("unigram_loss")}  # the validation loss of no context, where recorded


def lns_headline(res: dict | None) -> list[str]:
    """The bottom line of the LNS study (section 9) with the depth study's same-rate rows (section 1)."""
    from benchmarks import lns_findings
    from depthlab.study.summary import along_pairs

    if res is None:
        return []
    along = along_pairs(load_records_of("lns_study_along"))
    equal = (load(RESULTS / "depth_study" / "results.json") or {}).get("equal_rate", [])
    return lns_findings.bottom_line(res, along, equal)


def headline_limits() -> list[str]:
    from benchmarks import lns_findings

    along = [r["layers"] for r in load_records_of("lns_study_along").values()]
    return lns_findings.limits(RESULTS / "lns_study" / "settings.json", RESULTS / "lns_study_along" / "settings.json",
                               [6, 12, 24, 48], sorted(set(along)), (RESULTS / "lns_study_gpu" / "runs.jsonl").exists())


def load_records_of(name: str) -> dict:
    from depthlab.study.records import load_records

    return load_records(RESULTS / name / "runs.jsonl")


def lns_study_section(res: dict | None) -> list[str]:
    from benchmarks import lns_findings, lns_study, study_report
    from depthlab.study.records import load_records

    out = ["## 9. Why LNS wins: each depth at its own rate, LNS taken apart, the curse along training", ""]
    parts = (("Parts 1, 2 and 4: depths, parts, stability", "lns_study"),
             ("Part 3: the curse along training (CPU, 15M tokens)", "lns_study_along"),
             ("Part 5: the GPU study", "lns_study_gpu"))
    done = [(name, RESULTS / d) for name, d in parts if (RESULTS / d / "runs.jsonl").exists()]
    if not done:
        return out + ["Not run yet: `python -m benchmarks.lns_study run` (the depths, parts and stability phases), "
                      "`python -m benchmarks.lns_study run --phases along`, and on a GPU `python -m "
                      "benchmarks.lns_study run --gpu` (benchmarks/lns_study.py says what each trains).", ""]
    out += ["The cells listed are those that have finished (`make study-lns` and `make study-along` train only the "
            "cells of each phase that have no record yet); a difference on one seed reads inconclusive under "
            "section 1's rules. Selection "
            "is by final validation loss. The curse index columns are the final model's, from the whole-split "
            "probe (section 1's N = 24 grid and its 6/48-block cells at 8e-3 come from the depth study, probed "
            "with its earlier 64-window probe where this study has not re-run them).", ""]
    for name, d in done:
        command = (load(d / "settings.json") or {}).get("command", "?")
        records = load_records(d / "runs.jsonl")
        out += [f"### {name}", "", f"Made by `{command}` (the last run into it; `make study-lns` and `make "
                "study-along` run the whole of each).", ""]
        if d.name == "lns_study":
            ref = res["ref_depth"] if res else 24
            out += study_report.lns_tables(lns_records(), list(lns_study.PARTS), list(lns_study.UNSTABLE), ref)
            out += lns_findings.stability_reading(res) if res else []
            vocab = (load(d / "settings.json") or {}).get("meta", {}).get("vocab", 2048)
            if res and study_report.plot_rates(res, IMG / "lns_study_rates.png", vocab):
                out += ["![Final loss against learning rate, by depth and scheme](img/lns_study_rates.png)", "",
                        "Final validation loss against learning rate, seed 0 (the large marker: each curve's best "
                        "rate; dashed, where a run came near it: ln V, above which a run counts as diverged; "
                        "diverged runs are drawn just above it). Each panel has its own loss scale.", ""]
        elif study_report.plot_along(records, IMG / f"{d.name}_along.png"):
            out += study_report.along_table(records) + [f"![Δ and the curse index along training](img/{d.name}"
                                                        "_along.png)", ""]
            out += along_not_run(records) if d.name == "lns_study_along" else []
        out += ["Every cell:", ""] + study_report.cell_tables(d) + [""]
    from depthlab.study.summary import ALONG_RULE

    missing = {"lns_study": "Not run yet (`make study-lns`).",
               "lns_study_along": "Not finished yet (`make study-along`). Its decision rule, declared before its "
                                  f"runs finished: {ALONG_RULE}",
               "lns_study_gpu": "Not run: no GPU machine has been lent to this project yet (`make study-gpu-prepare`"
                                " here, then `make study-gpu` on the GPU)."}
    out += [f"### {name}\n\n{missing[d]}\n" for name, d in parts if (name, RESULTS / d) not in done]
    return out


def along_not_run(records: dict) -> list[str]:
    """The CPU along pairs the study plans (its defaults) that have no finished pair in the records."""
    from benchmarks.lns_study import ALONG
    from depthlab.study.summary import along_pairs

    ran = {(a["layers"], a["lr"]) for a in along_pairs(records)}
    todo = [f"N = {L}, lr {lr:g}" for L in ALONG["along_depths"] for lr in ALONG["along_lrs"] if (L, lr) not in ran]
    return [f"**Not run yet:** {', '.join(todo)} (`make study-along`; the pairs above are skipped, a killed cell "
            "resumes).", ""] if todo else []


def copy_plots() -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    for png in (RESULTS / "depth_study").glob("*.png"):
        shutil.copy(png, IMG / f"depth_study_{png.name}")
    for png in (RESULTS / "vit_study").glob("*.png"):
        shutil.copy(png, IMG / png.name)
    for png in (RESULTS / "gpu_71m").glob("*.png"):
        shutil.copy(png, IMG / f"gpu_71m_{png.name}")


SUPERSEDED = [
    "## 6. The earlier study at init std 0.02 (superseded, code removed)",
    "",
    "An earlier version of this page reported claims 1-6 on Shakespeare with a 24 x 64 model, init std 0.02, one "
    "learning rate (2e-3; 5e-4 for 300 steps) and at most 2M tokens, and concluded that LNS loses to Pre-LN. That "
    "model started outside the paper's regime: std 0.02 is a width-768 value, and at width 64 every block's update "
    "ratio at initialisation was 0.011 (LLaMA-130M's is about 0.27; measured with "
    "`depthlab.metrics.init_update_ratios`), so its blocks started almost silent and LNS damped the deep "
    "quarter further to 0.002. Its verdicts are withdrawn and its script is gone; its result files stay in "
    "`benchmarks/results/reproduce*/`, read by nothing. Its claims 5 (Post-LN, DeepNorm and Mix-LN less stable at "
    "depth) and 6 (LNS + scaled init worse than LNS) are re-run under the width-matched init in section 9 (part 4)",
]


def main() -> Path:
    from benchmarks import lns_findings, study_report
    from benchmarks.findings import INTRO, NOT_DONE, findings

    files = {"train_speed": RESULTS / "train_speed.json", "train_speed_compile": RESULTS / "train_speed_compile.json",
             "train_speed_profile": RESULTS / "train_speed_profile.json", "lns_cost": RESULTS / "lns_cost.json",
             "gpu_71m": RESULTS / "gpu_71m" / "summary.json", "memory": RESULTS / "memory.json"}
    results = {k: load(p) for k, p in files.items()}
    prose = findings(results)
    study, vit = RESULTS / "depth_study", RESULTS / "vit_study"
    study_report.write_depth(study)  # results.json and plots, recomputed from the runs with today's rules
    study_report.write_vit(vit)
    copy_plots()
    n6 = RESULTS / "depth_study_n6"
    study_report.along_section(n6)  # its results.json, read by the headline
    res = lns_summary()
    lines = INTRO + ["", "## Headline", ""] + lns_headline(res) + study_report.headline(study, n6) \
        + study_report.vit_headline(vit) + headline_limits()
    lines += ["## 1. Does LNS beat Pre-LN, by depth, and is the curse there?", ""]
    if res is not None:
        lines += lns_findings.section1_reading(res, load(study / "results.json"))
    lines += study_report.depth_section(study, "depth_study_")
    lines += study_report.along_section(n6)
    sections = [("speed", speed_section(results["train_speed"], results["train_speed_compile"])),
                ("lns", lns_section(results["lns_cost"])), ("gpu", gpu_section(results["gpu_71m"])),
                ("memory", memory_section(results["memory"]))]
    for key, body in sections:
        lines += body + prose.get(key, []) + [""]
    lines += SUPERSEDED
    lines[-1] += ("." if res and res["stability"] else ", which has not run yet.")
    lines.append("")
    lines += ["## 7. Vision Transformers: where LNS goes", ""] + lns_findings.vit_reading(load(vit / "results.json"))
    lines += study_report.vit_section(vit, "img/vit_study.png")
    lines += scaleout_section(load(RESULTS / "scaleout.json"), load(RESULTS / "scaleout_before.json"))
    lines += lns_study_section(res)
    lines += NOT_DONE
    path = DOCS / "results.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
