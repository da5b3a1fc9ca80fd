"""docs/results.md: does LNS help, and why? Composed from the studies' runs files under one results folder (the LNS
study over the depth study's cells, its along pairs, the reruns, the ViT and depth studies); the figures go to
docs/img/. What a study declares (the decomposition's variants, the stability schemes, the along pairs it plans)
comes from its script as arguments."""

from __future__ import annotations

import shutil
from pathlib import Path

from depthlab.study import declared, figures
from depthlab.study.claims import LNS, PRE
from depthlab.study.page import depth, lns, muon, own, screen
from depthlab.study.page.text import composition_said, grid, load, rate, said
from depthlab.study.records import load_records
from depthlab.study.summary import along_pairs, lns_study, matched_rates, reruns
from depthlab.study.verdicts import EQUIVALENCE_MARGIN

Pairs = list[tuple[int, float]]


def records_of(results: Path, name: str) -> dict:
    return load_records(results / name / "runs.jsonl")


def lns_records(results: Path) -> dict:
    """The LNS study's records over the depth study's (same settings and corpus): one value per cell, the LNS
    study's where both trained it."""
    return {**records_of(results, "depth_study"), **records_of(results, "lns_study")}


def meta_of(results: Path, name: str) -> dict:
    return (load(results / name / "settings.json") or {}).get("meta", {})


def lns_summary(results: Path, parts: list[str], unstable: list[str]) -> dict | None:
    """lns_study() of the LNS study's records (with the depth study's underneath), or None before it ran."""
    if not (results / "lns_study" / "runs.jsonl").exists():
        return None
    meta, records = meta_of(results, "lns_study"), lns_records(results)
    res = lns_study(records, list(parts), list(unstable), meta.get("ref_depth", 24),
                    rerun_var=reruns(results)["variance"])
    margins = {"equivalence": declared.margin(results / "lns_study", "equivalence_nats", EQUIVALENCE_MARGIN, records),
               "plans": declared.plans(results)}
    return {**res, **{k: meta.get(k) for k in ("dim", "val_tokens", "corpus", "unigram_loss")}, "margins": margins}


def stability_lines(res: dict, vocab: int, img: Path) -> list[str]:
    if not res["stability"]:
        return []
    out = ["## 5. Stability at depth (claims 5 and 6)", "",
           f"Each scheme's seed-0 grid at N = {res['ref_depth']} (diverged: non-finite or above ln V), then its best "
           "rate over every seed; Δ against Pre-LN (and LNS) each at its own best rate, paired by seed. The claims "
           "table reads claim 5 from these grids against the unigram loss.", "",
           "| scheme | grid | best rate | Δ vs pre | Δ vs lns |", "|---|---|---|---|---|"]
    for v, s in res["stability"].items():
        vs = s["against"]
        out.append(f"| {v} | {grid(s)} | {rate(s['best_lr'])} | "
                   f"{said(vs.get(PRE, {}))} | {said(vs[LNS]) if LNS in vs else '-'} |")
    if figures.plot_rates(res, img / "lns_study_rates.png", vocab):
        out += ["", "![Final loss against learning rate, by depth and scheme](img/lns_study_rates.png)", "",
                "Final validation loss against learning rate, seed 0 (large marker: each curve's best rate; dotted: "
                "the unigram loss, what a model of token frequencies alone reaches; a run ending there has diverged "
                "in the paper's sense). Each panel has its own loss scale.", ""]
    return out + [""]


def along_lines(results: Path, planned: Pairs, img: Path) -> list[str]:
    records = records_of(results, "lns_study_along")
    out = ["## 6. The curse along training (one seed per pair)", ""]
    if not records:
        return out + ["Not run yet (`make study-along`).", ""]
    settings = load(results / "lns_study_along" / "settings.json") or {}
    corpus = composition_said(settings.get("meta", {}).get("corpus") or {}, "its corpus's")
    out += [f"Made by `{settings.get('command', '?')}`; {corpus}. Each pair is one seed, so no pair gives a "
            "verdict: the table gives how the gap and both indices move, for the next study to test with seeds.", ""]
    if figures.plot_along(records, img / "lns_study_along_along.png"):
        out += depth.along_table(records) + ["![Δ and the curse index along training](img/lns_study_along_along.png)",
                                             ""]
    return out + along_not_run(records, planned)


def along_not_run(records: dict, planned: Pairs) -> list[str]:
    """The planned along pairs (depth, rate) that have no finished pair in the records."""
    ran = {(a["layers"], a["lr"]) for a in along_pairs(records)}
    todo = [f"N = {L}, lr {lr:g}" for L, lr in planned if (L, lr) not in ran]
    return [f"**Not run yet:** {', '.join(todo)} (`make study-along`; the pairs above are skipped, a killed cell "
            "resumes).", ""] if todo else []


def noise_lines(results: Path, rerun: dict, settings: dict) -> list[str]:
    """Run-to-run noise (the studies' twice-trained cells, and the rerun_a / rerun_b check), and what the
    selection metric and the test split are."""
    pairs = lambda r: ", ".join(f"{p['key']} {p['diff']:.4f}" for p in r["pairs"])  # noqa: E731
    out = ["## 9. Selection, test split and run-to-run noise", "",
           f"Cells trained twice with identical settings and corpus (the depth study's and the LNS study's copies): "
           f"{rerun['n']} pairs, |Δ val loss| up to {rerun['max']:.4f} nats ({pairs(rerun)}). The page uses one value "
           "per cell (the LNS study's), so a rerun's drift enters each interval as seed-to-seed spread, never twice.",
           ""]
    again, fresh = rerun["again"], load(results / "rerun_a" / "settings.json") or {}
    if again["n"]:
        out += [f"The same cells trained twice in a row on this machine (`{fresh.get('command', '?')}`, into rerun_a "
                f"and rerun_b): {again['n']} pairs, |Δ val loss| {pairs(again)}"
                + (": bitwise equal, so the drift above is no run-to-run randomness of one machine and software "
                   "state; it came with cells trained at other times." if again["max"] == 0 else "."), ""]
    corpus = fresh.get("meta", {}).get("corpus", {})
    if corpus.get("dedup"):
        d = corpus["dedup"]
        enc = sum(n.startswith("encodings/") for n in d["removed_names"])
        out += [f"The study corpus these records were trained on (depthlab.study.corpus, MinHash threshold "
                f"{d['threshold']}, sha256 {corpus['sha256'][:8]}…) dropped {d['removed']} documents ({d['exact']} "
                f"exact, {d['near']} near copies; {enc} of them generated `encodings/` tables) and held out a test "
                f"split of {corpus['test_tokens']:,} tokens beside {corpus['val_tokens']:,} validation tokens. It was "
                "deduplicated before each near-copy candidate was checked against the threshold; today's dedup "
                "builds another corpus from the same files (docs/data.md, `depthlab data dedup`).", ""]
    old = not settings.get("corpus", {}).get("dedup")
    out += [f"Selection and the validation loss use the first {settings.get('val_tokens', 0):,} tokens of the "
            "validation split." + (" The LNS study's records were trained before the corpus dropped copies and "
                                   "held out a test split: the whole-split probe loss in section 1 is the closest "
                                   "they have to a metric nobody tuned on, and it includes the selection slice."
                                   if old else " Section 1 reports the test split."), ""]
    return out


def copy_plots(results: Path, img: Path) -> None:
    img.mkdir(parents=True, exist_ok=True)
    for folder, prefix in (("depth_study", "depth_study_"), ("vit_study", ""), ("gpu_71m", "gpu_71m_")):
        for png in (results / folder).glob("*.png"):
            shutil.copy(png, img / f"{prefix}{png.name}")


def transfer_lines(results: Path, img: Path) -> list[str]:
    """The depth-transfer study's section (depthlab.study.transfer) from its records under `results`, its figure in
    `img`; nothing where that study or its records are absent."""
    try:
        from depthlab.study import transfer
    except ImportError:
        return []
    page_lines = getattr(transfer, "page_lines", None)
    return list(page_lines(out=results / "depth_transfer", img=img / "depth_transfer.png")) if page_lines else []


def lns_lines(results: Path, res: dict, rerun: dict, planned: Pairs, img: Path,
              transfer: tuple | None = None) -> list[str]:
    """The first screen, the claims table and sections 1-6 (the LNS study)."""
    from depthlab.study.runner import tokens_per_parameter

    tpp = tokens_per_parameter(results / "lns_study" / "settings.json", [d["layers"] for d in res["depths"]])
    shared = load(results / "depth_study" / "results.json") or {}  # one rate for both schemes, at its ref depth
    equal = [{**r, "layers": shared["settings"]["ref_depth"]} for r in shared.get("equal_rate", [])]
    vocab = meta_of(results, "lns_study").get("vocab", 2048)
    return (lns.science(res, res["unigram_loss"], matched_rates(lns_records(results)), equal, rerun, tpp,
                        res["val_tokens"] or 0, img, transfer, results)
            + stability_lines(res, vocab, img) + along_lines(results, planned, img))


def write(results: Path, docs: Path, parts: list[str], unstable: list[str], planned: Pairs) -> Path:
    """docs/results.md from the runs files under `results`; the figures into docs/img."""
    img = docs / "img"
    study, vit = results / "depth_study", results / "vit_study"
    depth.write_depth(study)  # results.json and plots, recomputed from the runs with today's rules
    depth.write_vit(vit)
    copy_plots(results, img)
    lines = ["# Results: does LayerNorm Scaling help, and why?", "",
             "Generated by `python -m benchmarks.report` (`make results`) from the runs files under "
             "`benchmarks/results/`; every number and word below is computed from them. The systems benchmarks "
             "(speed, memory, scale-out) are on [their own page](benchmarks.md).", ""]
    res = lns_summary(results, parts, unstable)
    if res is None:
        lines += ["The LNS study has not been run yet (`make study-lns`): this page cannot yet say whether LNS "
                  "helps.", ""]
    else:
        from depthlab.study.transfer import study_summary

        rerun, tstudy = reruns(results), study_summary(results / "depth_transfer")
        part = lns_lines(results, res, rerun, planned, img, (tstudy[0], tstudy[2]) if tstudy else None)
        screen.write_readme(docs.parent / "README.md", part[:part.index(screen.DETAIL_HEAD)])
        lines += part
    lines += ["## 7. Vision Transformers: where LNS goes", ""] + depth.vit_section(vit, "img/vit_study.png")
    lines += ["## 8. One rate per scheme at every depth (the depth study)", ""]
    lines += depth.depth_section(study, "depth_study_") + depth.along_section(results / "depth_study_n6")
    if res is not None:
        lines += noise_lines(results, rerun, meta_of(results, "lns_study"))
    lines += transfer_lines(results, img)
    lines += own.page_lines(results / "own_rate")
    lines += muon.page_lines(results / "muon", results / "own_rate")
    if res is not None:
        lines += ["## Every cell of the LNS study", ""] + depth.cell_tables(results / "lns_study") + [""]
    path = docs / "results.md"
    docs.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {path}")
    return path
