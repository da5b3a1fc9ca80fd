"""Write docs/results.md (the studies) and docs/benchmarks.md (the systems benchmarks) from the result files, so
that no figure or word in them is typed by hand.

    python -m benchmarks.report

Recomputes the studies' results from their runs files (depthlab.study.summary and depthlab.study.claims, rendered
by benchmarks/results_page.py and benchmarks/study_report.py), reads benchmarks/results/*.json for the systems
page; writes the plots to docs/img/. Sections whose result file is missing say so.
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
    """The LNS study's records over the depth study's (same settings and corpus): one value per cell, the LNS
    study's where both trained it."""
    return {**load_records_of("depth_study"), **load_records_of("lns_study")}


def lns_summary() -> dict | None:
    """lns_study() of the LNS study's records (with the depth study's underneath), or None before it ran."""
    from benchmarks import lns_study
    from depthlab.study.summary import lns_study as summary

    if not (RESULTS / "lns_study" / "runs.jsonl").exists():
        return None
    meta = (load(RESULTS / "lns_study" / "settings.json") or {}).get("meta", {})
    res = summary(lns_records(), list(lns_study.PARTS), list(lns_study.UNSTABLE), meta.get("ref_depth", 24))
    return {**res, "unigram_loss": meta.get("unigram_loss"), "val_tokens": meta.get("val_tokens")}


def load_records_of(name: str) -> dict:
    from depthlab.study.records import load_records

    return load_records(RESULTS / name / "runs.jsonl")


def _rate(lr: float | None) -> str:
    return "-" if lr is None else f"{lr:g}"


def stability_lines(res: dict) -> list[str]:
    from benchmarks.results_page import _grid, said
    from depthlab.study import figures

    if not res["stability"]:
        return []
    out = ["## 5. Stability at depth (claims 5 and 6)", "",
           f"Each scheme's seed-0 grid at N = {res['ref_depth']} (diverged: non-finite or above ln V), then its best "
           "rate over every seed; Δ against Pre-LN (and LNS) each at its own best rate, paired by seed. The claims "
           "table reads claim 5 from these grids against the unigram loss.", "",
           "| scheme | grid | best rate | Δ vs pre | Δ vs lns |", "|---|---|---|---|---|"]
    for v, s in res["stability"].items():
        vs = s["against"]
        out.append(f"| {v} | {_grid(s)} | {_rate(s['best_lr'])} | "
                   f"{said(vs.get('pre', {}))} | {said(vs['lns']) if 'lns' in vs else '-'} |")
    vocab = (load(RESULTS / "lns_study" / "settings.json") or {}).get("meta", {}).get("vocab", 2048)
    if figures.plot_rates(res, IMG / "lns_study_rates.png", vocab):
        out += ["", "![Final loss against learning rate, by depth and scheme](img/lns_study_rates.png)", "",
                "Final validation loss against learning rate, seed 0 (large marker: each curve's best rate; dotted: "
                "the unigram loss, what a model of token frequencies alone reaches; a run ending there has diverged "
                "in the paper's sense). Each panel has its own loss scale.", ""]
    return out + [""]


def along_lines() -> list[str]:
    from benchmarks import study_report
    from depthlab.study import figures

    records = load_records_of("lns_study_along")
    out = ["## 6. The curse along training (one seed per pair)", ""]
    if not records:
        return out + ["Not run yet (`make study-along`).", ""]
    command = (load(RESULTS / "lns_study_along" / "settings.json") or {}).get("command", "?")
    out += [f"Made by `{command}`. Each pair is one seed, so no pair gives a verdict: the table shows how the gap "
            "and both indices move, for the next study to test with seeds.", ""]
    if figures.plot_along(records, IMG / "lns_study_along_along.png"):
        out += study_report.along_table(records) + ["![Δ and the curse index along training](img/lns_study_along_"
                                                    "along.png)", ""]
    return out + along_not_run(records)


def along_not_run(records: dict) -> list[str]:
    """The CPU along pairs the study plans (its defaults) that have no finished pair in the records."""
    from benchmarks.lns_study import ALONG
    from depthlab.study.summary import along_pairs

    ran = {(a["layers"], a["lr"]) for a in along_pairs(records)}
    todo = [f"N = {L}, lr {lr:g}" for L in ALONG["along_depths"] for lr in ALONG["along_lrs"] if (L, lr) not in ran]
    return [f"**Not run yet:** {', '.join(todo)} (`make study-along`; the pairs above are skipped, a killed cell "
            "resumes).", ""] if todo else []


def noise_lines(rerun: dict, settings: dict) -> list[str]:
    """Run-to-run noise (the studies' twice-trained cells, and the rerun_a / rerun_b check), and what the
    selection metric and the test split are."""
    pairs = lambda r: ", ".join(f"{p['key']} {p['diff']:.4f}" for p in r["pairs"])  # noqa: E731
    out = ["## 9. Selection, test split and run-to-run noise", "",
           f"Cells trained twice with identical settings and corpus (the depth study's and the LNS study's copies): "
           f"{rerun['n']} pairs, |Δ val loss| up to {rerun['max']:.4f} nats ({pairs(rerun)}). The page uses one value "
           "per cell (the LNS study's), so a rerun's drift enters each interval as seed-to-seed spread, never twice.",
           ""]
    again = rerun["again"]
    fresh = (load(RESULTS / "rerun_a" / "settings.json") or {}).get("meta", {})
    if again["n"]:
        cmd = (load(RESULTS / "rerun_a" / "settings.json") or {}).get("command", "?")
        out += [f"The same cells trained twice in a row on this machine (`{cmd}`, into rerun_a and rerun_b): "
                f"{again['n']} pairs, |Δ val loss| {pairs(again)}"
                + (": bitwise equal, so the drift above is no run-to-run randomness of one machine and software "
                   "state; it came with cells trained at other times." if again["max"] == 0 else "."), ""]
    corpus = fresh.get("corpus", {})
    if corpus.get("dedup"):
        d = corpus["dedup"]
        enc = sum(n.startswith("encodings/") for n in d["removed_names"])
        out += [f"The study corpus as built now (depthlab.study.corpus, MinHash threshold {d['threshold']}) drops "
                f"{d['removed']} documents ({d['exact']} exact, {d['near']} near copies; {enc} of them generated "
                f"`encodings/` tables) and holds out a test split of {corpus['test_tokens']:,} tokens beside "
                f"{corpus['val_tokens']:,} validation tokens.", ""]
    old = not settings.get("corpus", {}).get("dedup")
    out += [f"Selection and the validation loss use the first {settings.get('val_tokens', 0):,} tokens of the "
            "validation split." + (" The LNS study's records were trained before the corpus dropped copies and "
                                   "held out a test split: the whole-split probe loss in section 1 is the closest "
                                   "they have to a metric nobody tuned on, and it includes the selection slice."
                                   if old else " Section 1 reports the test split."), ""]
    return out


def copy_plots() -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    for png in (RESULTS / "depth_study").glob("*.png"):
        shutil.copy(png, IMG / f"depth_study_{png.name}")
    for png in (RESULTS / "vit_study").glob("*.png"):
        shutil.copy(png, IMG / png.name)
    for png in (RESULTS / "gpu_71m").glob("*.png"):
        shutil.copy(png, IMG / f"gpu_71m_{png.name}")


def benchmarks_page() -> Path:
    from benchmarks.findings import INTRO, NOT_DONE, findings

    files = {"train_speed": RESULTS / "train_speed.json", "train_speed_compile": RESULTS / "train_speed_compile.json",
             "train_speed_profile": RESULTS / "train_speed_profile.json", "lns_cost": RESULTS / "lns_cost.json",
             "gpu_71m": RESULTS / "gpu_71m" / "summary.json", "memory": RESULTS / "memory.json"}
    results = {k: load(p) for k, p in files.items()}
    prose = findings(results)
    lines = list(INTRO) + [""]
    for key, body in (("speed", speed_section(results["train_speed"], results["train_speed_compile"])),
                      ("lns", lns_section(results["lns_cost"])), ("gpu", gpu_section(results["gpu_71m"])),
                      ("memory", memory_section(results["memory"]))):
        lines += body + prose.get(key, []) + [""]
    lines += scaleout_section(load(RESULTS / "scaleout.json"), load(RESULTS / "scaleout_before.json")) + NOT_DONE
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / "benchmarks.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {path}")
    return path


def results_page() -> Path:
    from benchmarks import results_page, study_report
    from depthlab.study.runner import tokens_per_parameter
    from depthlab.study.summary import matched_rates, rerun_spread

    study, vit, n6 = RESULTS / "depth_study", RESULTS / "vit_study", RESULTS / "depth_study_n6"
    study_report.write_depth(study)  # results.json and plots, recomputed from the runs with today's rules
    study_report.write_vit(vit)
    copy_plots()
    lines = ["# Results: does LayerNorm Scaling help, and why?", "",
             "Generated by `python -m benchmarks.report` (`make results`) from the runs files under "
             "`benchmarks/results/`; every number and word below is computed from them. The systems benchmarks "
             "(speed, memory, scale-out) are on [their own page](benchmarks.md).", ""]
    res = lns_summary()
    settings = (load(RESULTS / "lns_study" / "settings.json") or {}).get("meta", {})
    if res is None:
        lines += ["The LNS study has not been run yet (`make study-lns`): this page cannot yet say whether LNS "
                  "helps.", ""]
    else:
        rerun = {**rerun_spread(load_records_of("depth_study"), load_records_of("lns_study")),
                 "again": rerun_spread(load_records_of("rerun_a"), load_records_of("rerun_b"))}
        done = [d["layers"] for d in res["depths"]]
        tpp = tokens_per_parameter(RESULTS / "lns_study" / "settings.json", done)
        equal = (load(study / "results.json") or {}).get("equal_rate", [])
        lines += results_page.science(res, res["unigram_loss"], matched_rates(lns_records()), equal, rerun, tpp,
                                      res["val_tokens"] or 0, IMG)
        lines += stability_lines(res) + along_lines()
    lines += ["## 7. Vision Transformers: where LNS goes", ""] + study_report.vit_section(vit, "img/vit_study.png")
    lines += ["## 8. One rate per scheme at every depth (the depth study)", ""]
    lines += study_report.depth_section(study, "depth_study_") + study_report.along_section(n6)
    if res is not None:
        lines += noise_lines(rerun, settings)
        lines += ["## Every cell of the LNS study", ""] + study_report.cell_tables(RESULTS / "lns_study") + [""]
    path = DOCS / "results.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {path}")
    return path


def main() -> Path:
    benchmarks_page()
    return results_page()


if __name__ == "__main__":
    main()
