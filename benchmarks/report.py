"""Write docs/results.md from the result files, so that no figure in it is typed by hand.

    python -m benchmarks.report

Reads benchmarks/results/{train_speed,lns_cost}.json, benchmarks/results/<experiment>/results.json (EXPERIMENTS)
and, where it exists, benchmarks/results/gpu_71m/summary.json; copies the plots to docs/img/. Sections whose
result file is missing say so.
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
    out = ["## 1. Training speed: depthlab against `transformers.LlamaForCausalLM`", ""]
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
                out.append(f"| {run['case']} ({run['params'] / 1e6:.1f}M) | {run['dtype']} | {run['tokens_per_step']} | "
                           f"{name} | {tok:.0f} | {run['mfu'][n]:.1%} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def lns_section(r: dict | None) -> list[str]:
    out = ["## 2. What LNS costs", ""]
    if r is None:
        return out + ["Not run yet (`python -m benchmarks.lns_cost`).", ""]
    out += [f"Command: `python -m benchmarks.{r['benchmark']} {' '.join(r['argv'])}` ({r['wall_s']:.0f} s wall). "
            f"Machine: {env_line(r['env'])}.", "",
            "Training step time, the same weights in a `pre` and an `lns` model, interleaved (target: within 1%):", "",
            "| model | dtype | step time lns / pre, median [min, max] | best | the scale's multiplies timed alone, "
            "share of a `pre` step |", "|---|---|---|---|---|"]
    for t in r["training"]:
        out.append(f"| {t['case']} | {t['dtype']} | {ratio(t['step_time_ratio_lns_over_pre'], '.4f')} |")
        out[-1] += (f" {best_ratio(t['step_s']['lns'], t['step_s']['pre']):.4f} | {t['scale_ops']['share_of_pre_step']:.2%}"
                    f" ({t['scale_ops']['multiplies_per_step']} multiplies) |")
    out += ["", "Inference after export (`hf_weights_and_config`, the exporter's mapping; LNS folded into the norm "
                "weights). The logit check here uses the initial weights (norm weights 1); "
                "`tests/test_hf_parity.py` checks the fold with random norm weights.", "",
            "| model | same HF class / config / parameter shapes as exported `pre` | max abs logit difference, exported "
            "`lns` vs depthlab `lns` | forward time lns / pre | best |", "|---|---|---|---|---|"]
    for i in r["inference"]:
        same = "/".join("yes" if i[k] else "NO" for k in ("same_class", "same_config", "same_parameter_shapes"))
        out.append(f"| {i['case']} | {same} | {i['exported_lns_max_abs_logit_diff']:.1e} | "
                   f"{ratio(i['forward_time_ratio_lns_over_pre'], '.4f')} | "
                   f"{best_ratio(i['forward_s']['lns'], i['forward_s']['pre']):.4f} |")
    return out + [""]


def gpu_section(r: dict | None) -> list[str]:
    out = ["## 3. LLaMA-71M on a GPU: `pre` against `lns`", "",
           "One command, sized to end well within 8 minutes on an H100-class GPU (two runs of 1,200 steps, batch 64 x "
           "256 tokens, bf16, the built-in corpus with a 32k BPE vocabulary, the paper's 71M dimensions; the time is "
           "an estimate from the FLOP count, not a measurement):", "", "    python -m benchmarks.gpu_71m --out benchmarks/results/gpu_71m", ""]
    if r is None:
        return out + ["**Not run: no GPU machine was available to this task.** The script was exercised on CPU "
                      "with tiny overrides only (tests/test_benchmarks.py::test_gpu_script_runs_on_cpu_tiny); its "
                      "GPU figures are still to be recorded.", ""]
    out += [f"Run: {env_line(r['env'])}, {r['wall_s']:.0f} s wall.", "",
            "| scheme | val loss | val ppl | tokens/s | MFU |", "|---|---|---|---|---|"]
    for s, x in r["runs"].items():
        out.append(f"| {s} | {x['val_loss']:.4f} | {x['val_ppl']:.2f} | {x['tokens_per_s']:.0f} | {x['mfu']:.1%} |")
    return out + ["", "![loss](img/gpu_71m_loss.png)", ""]


CLAIM_TITLES = {
    "1_lns_lower_ppl": "1. `lns` reaches lower validation perplexity than `pre`",
    "2_lns_lower_deep_variance": "2. much lower variance at the deepest layers with `lns`",
    "3_angular_distance": "3. adjacent deep layers: angular distance near 0 with `pre`, clearly above with `lns`",
    "4_layer_removal": "4. removing a deep layer costs little with `pre`; cost spread more evenly with `lns`",
    "5_post_less_stable": "5. `post` less stable at depth (same lr)",
    "5_deepnorm_less_stable": "5. `deepnorm` less stable at depth (same lr)",
    "5_mixln_less_stable": "5. `mixln` less stable at depth (same lr)",
    "6_lns_scaled_worse": "6. `lns` + `scaled` init worse than `lns`",
}


def claim_numbers(name: str, c: dict) -> str:
    if name.startswith("1_") or name.startswith("6_"):
        return f"paired Δppl {ms(c['diff'])} (per seed {', '.join(f'{x:+.2f}' for x in c['paired_diff'])})"
    if name.startswith("2_"):
        return f"var(last block) pre / lns = {ms(c['ratio'])} (per seed {', '.join(f'{x:.2f}' for x in c['ratio_pre_over_lns'])})"
    if name.startswith("3_"):
        return f"deepest-quarter angular distance: pre {ms(c['pre'], '.3f')}, lns {ms(c['lns'], '.3f')}"
    if name.startswith("4_"):
        return (f"Δloss removing a deepest-quarter block: pre {ms(c['pre_deep_cost'], '.4f')}, lns "
                f"{ms(c['lns_deep_cost'], '.4f')}; CV across blocks: pre {ms(c['pre_cv'])}, lns {ms(c['lns_cv'])}")
    return (f"diverged {c['diverged']} of the seeds; paired Δppl vs pre {ms(c['diff'])} "
            f"(per seed {', '.join(f'{x:+.2f}' for x in c['paired_diff'])})")


# The reproduction experiments: one output directory each (one set of settings), in the order shown.
EXPERIMENTS = {
    "reproduce": "4. The paper's claims at CPU scale: every scheme, short budget",
    "reproduce_long": "5. Claims 1-4 with a seven times longer budget",
    "reproduce_lr5e-4": "6. Claim 5 at a quarter of the learning rate",
}


def reproduce_section(name: str, r: dict | None) -> list[str]:
    out = [f"## {EXPERIMENTS[name]}", ""]
    if r is None:
        return out + [f"Not run yet (`python -m benchmarks.reproduce run --out benchmarks/results/{name}`).", ""]
    s = r["settings"]
    commands = s.get("commands") or [s["command"]]
    out += ["Commands (each adds runs to the same result file; a run's wall time is in the table):", ""]
    out += [f"    {c}" for c in commands]
    out += ["", f"Model: {s['layers']} layers x dim {s['dim']}, {s['heads']} heads, FFN "
            f"{s['ffn']}, BPE vocabulary {s['vocab']}, sequence {s['seq']}, batch {s['batch']}, {s['steps']} steps, "
            f"lr {s['lr']} (warmup 10%, cosine to 10%), embedding std {s['embed_std']:.3f}, fp32, one thread per run. "
            f"Validation: the first {s['val_tokens']:,} tokens of the held-out documents; the probes (variance, "
            f"angular distance, layer removal) use its first {s['probe_batches'] * 16} windows on the final model.",
            ""]
    n, seconds = training_time(r)
    out += [f"Training time: {n} runs, {seconds / 60:.0f} min of one-thread training in all, about "
            f"{seconds / 120:.0f} min wall with `--jobs 2` on 2 cores (each run's time is in the table).", ""]
    for data, d in r["datasets"].items():
        steps = _steps(d)
        out += [f"### {data}", "", "Claim 1 for every variant run, best first (mean ± std over seeds; Δppl vs pre is "
                "paired seed by seed; a diverged run counts in `diverged`, not in the means):", "",
                "| variant | seeds | diverged | val ppl | Δppl vs pre | val loss | " +
                " | ".join(f"val loss @{k}" for k in steps) + " | last-block var | max grad norm | wall s / run |",
                "|---|---|---|---|---|---|" + "---|" * len(steps) + "---|---|---|"]
        order = sorted(d["variants"].items(), key=lambda kv: (kv[1]["val_ppl"]["mean"] is None,
                                                             kv[1]["val_ppl"]["mean"] or 0))
        for v, g in order:
            by_step = g.get("val_loss_by_step", {})
            out.append(f"| {v} | {len(g['seeds'])} | {g['diverged']} | {ms(g['val_ppl'])} | "
                       f"{ms(g.get('ppl_minus_pre')) if v != 'pre' else '0'} | {ms(g['val_loss'], '.4f')} | "
                       + " | ".join(ms(by_step.get(k), ".3f") for k in steps) +
                       f" | {ms(g.get('last_layer_var'))} | {ms(g['grad_norm_max'])} | {ms(g['wall_s'], '.0f')} |")
        out += ["", "| claim | criterion | numbers | reproduces here? |", "|---|---|---|---|"]
        for claim, c in d["claims"].items():
            out.append(f"| {CLAIM_TITLES.get(claim, claim)} | {c['criterion']} | {claim_numbers(claim, c)} | "
                       f"**{'yes' if c['reproduces'] else 'no'}** |")
        out.append("")
        for kind, caption in [("val_loss", "validation loss"), ("train_loss", "training loss"),
                              ("var_by_depth", "variance after each block, final model"),
                              ("monitor_var_by_depth", "depth monitor variance, last monitor step"),
                              ("last_var_by_step", "depth monitor: last block's variance during training"),
                              ("angular_by_depth", "angular distance between each block's input and output"),
                              ("removal_by_depth", "validation-loss increase when a single block is removed")]:
            out.append(f"![{caption}](img/{name}_{data}_{kind}.png)")
        out.append("")
    return out + compare_lines(name)


COMPARE_PLOTS = [("variance.png", "variance of the residual stream by relative depth"),
                 ("angular_adjacent.png", "angular distance between adjacent layers"),
                 ("removal.png", "loss increase when one block is removed"),
                 ("logit_lens.png", "logit lens: distance of each layer's prediction from the final one")]


def compare_lines(name: str) -> list[str]:
    """The analysis report of seed 0's final pre and lns models, where the experiment made one."""
    folder = RESULTS / name / "compare"
    if not (folder / "compare.json").exists():
        return []
    out = ["Analysis report of the final `pre` and `lns` models of seed 0 (`depthlab compare`, the toolkit's own "
           "diagnostics on held-out Shakespeare text, see docs/analysis.md; the `make` target shows the command; "
           f"the full report is `benchmarks/results/{name}/compare/report.html`):", ""]
    out += [f"![{caption}](img/{name}_compare_{png})" for png, caption in COMPARE_PLOTS if (folder / png).exists()]
    return out + [""]


def training_time(r: dict) -> tuple[int, float]:
    """Number of runs and their summed wall seconds (each run is one process on one thread)."""
    groups = [g for d in r["datasets"].values() for g in d["variants"].values()]
    return (sum(g["wall_s"]["n"] for g in groups),
            sum(g["wall_s"]["mean"] * g["wall_s"]["n"] for g in groups if g["wall_s"]["n"]))


def _steps(d: dict) -> list[str]:
    steps: list[str] = []
    for g in d["variants"].values():
        steps = list(g.get("val_loss_by_step", {})) or steps
    return steps


def copy_plots() -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    for name in EXPERIMENTS:
        for png in (RESULTS / name).glob("*.png"):
            shutil.copy(png, IMG / f"{name}_{png.name}")
        for png, _ in COMPARE_PLOTS:
            if (RESULTS / name / "compare" / png).exists():
                shutil.copy(RESULTS / name / "compare" / png, IMG / f"{name}_compare_{png}")
    for png in (RESULTS / "gpu_71m").glob("*.png"):
        shutil.copy(png, IMG / f"gpu_71m_{png.name}")


def main() -> Path:
    from benchmarks.findings import INTRO, NOT_DONE, findings

    files = {"train_speed": RESULTS / "train_speed.json", "train_speed_compile": RESULTS / "train_speed_compile.json",
             "train_speed_profile": RESULTS / "train_speed_profile.json", "lns_cost": RESULTS / "lns_cost.json",
             "gpu_71m": RESULTS / "gpu_71m" / "summary.json",
             **{name: RESULTS / name / "results.json" for name in EXPERIMENTS}}
    results = {k: load(p) for k, p in files.items()}
    prose = findings(results)
    copy_plots()
    lines = INTRO + [""]
    sections = [("speed", speed_section(results["train_speed"], results["train_speed_compile"])),
                ("lns", lns_section(results["lns_cost"])), ("gpu", gpu_section(results["gpu_71m"]))]
    sections += [(name, reproduce_section(name, results[name])) for name in EXPERIMENTS]
    for key, body in sections:
        lines += body + prose.get(key, []) + [""]
    done = [results[name] for name in EXPERIMENTS if results[name]]
    if done:
        seconds = sum(training_time(r)[1] for r in done)
        lines += ["## Time budget", "", f"The reproduction in sections {4}-{3 + len(EXPERIMENTS)} trains "
                  f"{sum(training_time(r)[0] for r in done)} runs: {seconds / 3600:.1f} h of one-thread training, "
                  f"about {seconds / 7200:.1f} h wall on 2 cores with `--jobs 2` (plus tokenizer training and probing, "
                  "a few seconds per run). Each `make reproduce-*` target is one part and can be run on its own.", ""]
    lines += NOT_DONE
    path = DOCS / "results.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
