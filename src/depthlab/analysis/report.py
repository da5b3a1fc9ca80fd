"""metrics.json, CSV tables, PNG plots and one self-contained HTML report (images embedded as base64).

Every plot function takes a list of (label, results) so the same code draws one model (`analyze`) and an overlay
of several (`compare`). What differs by the result's kind (depthlab.analysis.results): a classifier's results (a
ViT's) have no logit lens, removal scored by loss and top-1 accuracy instead of perplexity, and "last token"
angular distances read at the pooled readout.
"""

from __future__ import annotations

import base64
import csv
import html
import json
from pathlib import Path

from depthlab import metrics as metrics_module
from depthlab.analysis import answer as answer_module, curse as curse_module
from depthlab.analysis.answer import pct_ppl
from depthlab.analysis.curse import index_lines
from depthlab.analysis.duplication_report import duplication_rows, plot_duplication
from depthlab.analysis.removal_report import (
    drop_rows,
    has_parts,
    part_rows,
    plot_figure_one,
    plot_profiles,
    plot_removal_cost,
    plot_sublayers,
    ppl_axis,
    profile_rows,
    task_rows,
)
from depthlab.analysis.results import blocks_text, is_classifier, span_text
from depthlab.metrics import massive_lines
from depthlab.plots import pyplot, save_figure

plt = pyplot()

Runs = list[tuple[str, dict]]


def _key_name(res: dict, key: str) -> str:
    """"last token" / "all tokens", or a classifier's readout (its "last_token" distances are read there)."""
    return res["readout"] if key == "last_token" and is_classifier(res) else key.replace("_", " ")


def removal_metrics(res: dict) -> list[tuple[str, str]]:
    """(key, title) of what a removal is scored by: the loss increase in nats (a language model's read as %
    perplexity on a second axis), and a classifier's top-1 accuracy drop."""
    if is_classifier(res):
        return [("delta_loss", "Δ loss (nats)"), ("acc_drop", "top-1 accuracy drop")]
    return [("delta_loss", "Δ loss (nats per token)")]


def _log_if_positive(ax) -> None:
    """Log scale when every plotted value is positive: the first block often dwarfs the others."""
    ys = [y for line in ax.lines for y in line.get_ydata()]
    if ys and min(ys) > 0:
        ax.set_yscale("log")


def plot_variance(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for label, res in runs:
        st = res["states"]
        L = len(st) - 1
        x = [s / L if normalise_depth else s for s in range(L + 1)]
        axes[0].plot(x, [s["variance"] for s in st], marker="o", ms=3, label=label)
        axes[0].scatter([x[-1]], [res["final_normed"]["variance"]], marker="x", s=40)
        axes[1].plot(x, [s["rms"] for s in st], marker="o", ms=3, label=label)
        if "variance_rest" in st[0]:  # the massive positions set apart (depthlab.metrics)
            for ax, k in ((axes[0], "variance_rest"), (axes[1], "rms_rest")):
                ax.plot(x, [s[k] for s in st], ls="--", lw=1, label=f"{label}, massive positions set apart")
        axes[2].plot(x, [s["max_abs"] for s in st], marker="o", ms=3, label=label)
    xl = "relative depth" if normalise_depth else "stream state (0 = embedding, L = raw last block output)"
    for ax, t in zip(axes, ["variance of h_l (x: final-normed output)", "RMS of h_l", "max |h_l|"]):
        ax.set_yscale("log")
        ax.set_title(t, fontsize=10)
        ax.set_xlabel(xl, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path, dpi=90)


def plot_angular(label: str, res: dict, path: Path) -> Path:
    """Gromov et al. 2024: d(l, l + n) over start l (x) and run length n (y), last token and all tokens."""
    L = len(res["blocks"])
    rows = res.get("curse_index", {}).get("angular_rows")
    fig, axes = plt.subplots(1, 3 if rows else 2, figsize=(16 if rows else 11, 4))
    grids = []
    for key in ("last_token", "all_tokens"):
        D = res["angular"][key]
        grids.append((f"d(l, l+n), {_key_name(res, key)}",
                      [[D[l][l + n] if l + n <= L else float("nan") for l in range(L)] for n in range(1, L + 1)]))
    if rows:  # the paper's heatmap: each row n divided by its largest entry
        grids.append(("each row / its max (the paper's)", [r + [float("nan")] * (L - len(r)) for r in rows]))
    for ax, (title, grid) in zip(axes, grids):
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis_r", vmin=0,
                       extent=(0.5, L + 0.5, 0.5, L + 0.5))
        ax.set_xlabel("first removed block l + 1")
        ax.set_ylabel("blocks removed n")
        ax.set_title(f"{label}: {title}", fontsize=10)
        fig.colorbar(im, ax=ax)
    return save_figure(fig, path, dpi=90)


# The per-block metrics drawn in block_metrics.png, one panel each: (key in res["blocks"], title); a model without
# a key (no attention / MLP halves found) leaves its panel empty.
BLOCK_PLOTS = [("update_ratio", "update ratio ||Δh||/||h||"), ("attn_ratio", "attention update ratio"),
               ("mlp_ratio", "MLP update ratio"), ("block_influence", "block influence (ShortGPT)"),
               ("attn_importance", "attention importance 1 - cos"), ("mlp_importance", "MLP importance 1 - cos")]


def panels(n: int, cols: int = 3, size: tuple[float, float] = (13 / 3, 3.25)):
    """A figure with exactly n panels, `cols` to a row: (figure, the n axes in reading order)."""
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, min(n, cols), figsize=(size[0] * min(n, cols), size[1] * rows), squeeze=False)
    for ax in axes.flat[n:]:
        fig.delaxes(ax)
    return fig, list(axes.flat[:n])


def draw_blocks(runs: Runs, normalise_depth: bool = False, metrics: list[tuple[str, str]] = BLOCK_PLOTS):
    """The per-block metrics figure: one panel per metric, each run a line."""
    fig, axes = panels(len(metrics))
    for ax, (k, t) in zip(axes, metrics, strict=True):
        for label, res in runs:
            b = res["blocks"]
            if k in b[0]:
                x = [(i + 1) / len(b) if normalise_depth else i + 1 for i in range(len(b))]
                ax.plot(x, [r[k] for r in b], marker="o", ms=3, label=label)
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("relative depth" if normalise_depth else "block")
        ax.grid(alpha=0.3)
        _log_if_positive(ax)
    axes[0].legend(fontsize=8)
    return fig


def plot_blocks(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    return save_figure(draw_blocks(runs, normalise_depth), path, dpi=90)


def plot_adjacent_angular(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, res in runs:
        L = len(res["blocks"])
        x = [(l + 1) / L if normalise_depth else l + 1 for l in range(L)]
        for key, ls in (("last_token", "-"), ("all_tokens", ":")):
            D = res["angular"][key]
            name = _key_name(res, key) if is_classifier(res) else key
            ax.plot(x, [D[l][l + 1] for l in range(L)], ls, marker="o", ms=3, label=f"{label} ({name})")
    ax.set_xlabel("relative depth" if normalise_depth else "block l")
    ax.set_title("angular distance between the input and output of block l", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=90)


def plot_removal(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    """One row per removal score (Δ loss in nats, % perplexity beside; a classifier's Δ loss and accuracy drop):
    single blocks, best runs."""
    runs = [(lab, r) for lab, r in runs if "removal" in r]
    keys = removal_metrics(runs[0][1])
    fig, grid = plt.subplots(len(keys), 2, figsize=(12, 3.8 * len(keys)), squeeze=False)
    width = 0.8 / max(len(runs), 1)
    for axes, (key, title) in zip(grid, keys):
        for k, (label, res) in enumerate(runs):
            single = res["removal"]["single"]
            L = len(single)
            if normalise_depth:
                axes[0].plot([(s["block"]) / L for s in single], [s[key] for s in single], marker="o", ms=3,
                             label=label)
            else:
                axes[0].bar([s["block"] - 0.4 + width * (k + 0.5) for s in single], [s[key] for s in single],
                            width=width, label=label)
            rr = res["removal"]["runs"]
            first = single[res["angular"]["best_block"][0]["start_block"] - 1]  # n = 1: the angular choice
            axes[1].plot([1] + [r["n"] for r in rr], [first[key]] + [r[key] for r in rr], marker="o", ms=3,
                         label=label)
        axes[0].set_title(f"{title} when one block is removed", fontsize=10)
        axes[0].set_xlabel("relative depth" if normalise_depth else "block")
        axes[1].set_title(f"{title}, best run of n blocks removed (chosen by angular distance)", fontsize=9)
        axes[1].set_xlabel("n")
        axes[1].xaxis.get_major_locator().set_params(integer=True)
        for ax in axes:
            ax.set_yscale("symlog", linthresh=0.01)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            if key == "delta_loss" and not is_classifier(runs[0][1]):
                ppl_axis(ax)
    return save_figure(fig, path, dpi=90)


def plot_lens(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    for label, res in runs:
        if "lens" not in res:
            continue
        S = len(res["lens"]["kl"])
        x = [s / (S - 1) if normalise_depth else s for s in range(S)]
        axes[0].plot(x, res["lens"]["kl"], marker="o", ms=3, label=label)
        axes[1].plot(x, res["lens"]["ce"], marker="o", ms=3, label=label)
    axes[0].set_title("logit lens: KL(final || layer)", fontsize=10)
    axes[1].set_title("logit lens: next-token cross-entropy", fontsize=10)
    for ax in axes:
        ax.set_xlabel("relative depth" if normalise_depth else "stream state")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=90)


def plot_jacobian(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for label, res in runs:
        j = res.get("jacobian")
        if not j:
            continue
        L = len(j["block_gain"])
        x = [(l + 1) / L if normalise_depth else l + 1 for l in range(L)]
        axes[0].plot(x, j["block_gain"], marker="o", ms=3, label=label)
        axes[1].plot(x, j["block_vs_identity"], marker="o", ms=3, label=label)
        if "output_gain" in j:
            xs = [s / L if normalise_depth else s for s in range(L + 1)]
            axes[2].plot(xs, j["output_gain"], marker="o", ms=3, label=label)
    for ax, t in zip(axes, ["||∂h_{l+1}/∂h_l|| (rms gain)", "||∂h_{l+1}/∂h_l - I|| (rms)",
                            "||∂y/∂h_l|| (rms gain), y = final-normed output"]):
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("relative depth" if normalise_depth else "block / stream state")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if axes[2].lines:
        axes[2].set_yscale("log")
    else:
        axes[2].text(0.5, 0.5, "not computed in layer-by-layer mode", ha="center", transform=axes[2].transAxes)
    return save_figure(fig, path, dpi=90)


def plot_jacobian_heatmaps(label: str, res: dict, path: Path) -> Path:
    hms = res["jacobian"]["heatmaps"]
    fig, axes = plt.subplots(1, len(hms), figsize=(4.2 * len(hms), 3.8), squeeze=False)
    for ax, hm in zip(axes[0], hms):
        M = hm["matrix"]
        v = max(abs(x) for row in M for x in row) or 1.0
        im = ax.imshow(M, cmap="RdBu_r", vmin=-v, vmax=v)
        ax.set_title(f"{label}: block {hm['block']}, token {hm['token_position']}\n"
                     f"{len(hm['channels'])} channels, ||J - I||/√k = {hm['identity_distance']:.3f}", fontsize=9)
        ax.set_xlabel("input channel (sampled)")
        ax.set_ylabel("output channel (sampled)")
        fig.colorbar(im, ax=ax)
    return save_figure(fig, path, dpi=90)


# --- tables --------------------------------------------------------------------------------------------------

def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def block_rows(res: dict) -> list[dict]:
    rows = [dict(b) for b in res["blocks"]]
    for i, r in enumerate(rows):
        if "removal" in res:
            s = res["removal"]["single"][i]
            if is_classifier(res):
                r.update(removal_loss=s["loss"], removal_delta_loss=s["delta_loss"], removal_acc=s["acc"],
                         removal_acc_drop=s["acc_drop"])
            else:
                r.update(removal_delta_loss=s["delta_loss"], removal_ppl_change_pct=pct_ppl(s["delta_loss"]))
        j = res.get("jacobian")
        if j:
            r.update(jac_block_gain=j["block_gain"][i], jac_block_vs_identity=j["block_vs_identity"][i])
        D = res["angular"]
        r.update(angular_adjacent_last=D["last_token"][i][i + 1], angular_adjacent_all=D["all_tokens"][i][i + 1])
        if "massive" in res:
            r["angular_adjacent_rest"] = res["massive"]["angular_adjacent_rest"][i]
    return rows


def state_rows(res: dict) -> list[dict]:
    rows = [dict(s) for s in res["states"]] + [{**res["final_normed"], "index": "final", "name": "final-normed"}]
    for i, r in enumerate(rows[:-1]):
        if "lens" in res:
            r.update(lens_kl=res["lens"]["kl"][i], lens_ce=res["lens"]["ce"][i])
        if res.get("jacobian", {}).get("output_gain"):
            r["jac_output_gain"] = res["jacobian"]["output_gain"][i]
    return rows


def write_tables(res: dict, out: Path) -> list[Path]:
    files = {"states.csv": state_rows(res), "blocks.csv": block_rows(res),
             "best_blocks.csv": res["angular"]["best_block"]}
    if "removal" in res:
        files["removal_runs.csv"] = res["removal"]["runs"]
    more = {"task_removal.csv": task_rows(res), "generate_removal.csv": task_rows(res, "generate_removal"),
            "sublayer_removal.csv": part_rows(res) if has_parts(res) else [],
            "drop_lowest.csv": drop_rows(res), "duplication.csv": duplication_rows(res)}
    files.update({name: rows for name, rows in more.items() if rows})
    for key in ("last_token", "all_tokens"):
        D = res["angular"][key]
        files[f"angular_{key}.csv"] = [{"state": i, **{str(j): v for j, v in enumerate(row)}}
                                       for i, row in enumerate(D)]
    for name, rows in files.items():
        _write_csv(out / name, rows)
    return [out / n for n in files]


# --- HTML ----------------------------------------------------------------------------------------------------

def _img(path: Path, caption: str = "") -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption or path.name)}">'
            f'<figcaption>{html.escape(caption + " " if caption else "")}({path.name})</figcaption></figure>')


def _table(rows: list[dict], keys: list[str], caption: str) -> str:
    """A table under its caption, in a box of its own that scrolls sideways when the table is wider than the page
    (the page itself never does)."""
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(k, ''))}</td>" for k in keys) + "</tr>" for r in rows)
    return (f"<div class='scroll'><table><caption>{html.escape(caption)}</caption><tr>{head}</tr>{body}</table>"
            "</div>")


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222;
overflow-wrap:anywhere}h1{font-size:1.5em;margin:.3em 0}h2{font-size:1.25em}.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:12px;margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right;overflow-wrap:normal}caption{caption-side:top;text-align:left;font-size:12px;color:#444;
padding:2px 0}th{background:#f3f3f3}img{max-width:100%;height:auto}figure{margin:.5em 0}figcaption{font-size:11px;
color:#666}pre{background:#f7f7f7;padding:1em;font-size:12px;white-space:pre-wrap}
.answer{background:#f4f8ff;border:1px solid #c9d8f0;padding:.4em 1em;margin:.5em 0}.answer p{margin:.3em 0}
.verdict{font-size:1.1em;font-weight:600}.rule{font-size:12px;color:#444}"""


def write_html(path: Path, title: str, intro: list[str], sections: list[tuple[str, str]], lead: str = "") -> Path:
    """The page: its title, `lead` (the answer, as HTML: first on the first screen), the intro lines, the sections,
    and the metrics' definitions."""
    body = lead + "".join(f"<p>{html.escape(p)}</p>" for p in intro)
    body += "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    defs = html.escape(metrics_module.__doc__ or "")
    body += f"<h2>Definitions</h2><pre>{defs}</pre>"
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'>"
                    f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}"
                    f"</title><style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")
    return path


def report_intro(res: dict, label: str) -> list[str]:
    """What was analysed, and how: after the answer."""
    m = res.get("model", {})
    unit = "images" if is_classifier(res) else "windows"
    window = f" of {res['data']['seq_len']} tokens" if res.get("data", {}).get("seq_len") else ""
    intro = [f"Model: {label} ({m.get('class', '')}); blocks {m.get('blocks', '')}; "
             f"final norm {m.get('final_norm', '')}; "
             + (f"logits {m['logits']}; " if m.get("logits", "none") != "none" else "")
             + f"mode {res.get('mode', '')}.",
             f"Calibration data: {res.get('data', {}).get('source', '')}; {res['tokens']} tokens in "
             f"{res['sequences']} {unit}{window}."]
    return intro + massive_lines(res) + [f"Note: {n}." for n in res.get("notes", [])]


def answer_html(res: dict, plots: dict) -> str:
    """The answer, first on the first screen: the verdict by the declared rule, the blocks that could go with what
    removing 1, 2, 4 of them together costs, the model's own perplexity, and the removal figure in the paper's
    Figure 1 form."""
    body = "".join(f"<p class='{'rule' if x.startswith('rule:') else 'verdict'}'>{html.escape(x)}</p>"
                   for x in answer_module.verdict_lines(res))
    rows = answer_module.removable(res)
    if rows:
        table = [{"blocks removed together": len(r["blocks"]), "which (1-based)": blocks_text(r["blocks"]),
                  "loss increase (nats per token)": r["delta_loss"],
                  **({"top-1 accuracy drop": r["acc_drop"]} if "acc_drop" in r else
                     {"perplexity change (%)": pct_ppl(r["delta_loss"])})} for r in rows]
        body += _table(table, list(table[0]), "The blocks that could go: the k blocks whose removal alone costs "
                       "least, removed together (--drop-lowest), scored on the calibration windows.")
    ppl = answer_module.perplexity_text(res)
    if ppl:
        body += f"<p>The model itself: {html.escape(ppl)}.</p>"
    if "removal_cost" in plots:
        body += _img(plots["removal_cost"], "What removing each block alone costs, against its depth (the paper's "
                     "Figure 1 form; left axis nats per token, right axis % perplexity).")
    return f"<div class='answer'><h2>The answer</h2>{body}</div>"


def index_html(res: dict) -> str:
    """The curse index: its summary lines, then the per-block interior costs and Gromov's contiguous runs."""
    idx = res["curse_index"]
    body = "".join(f"<p>{html.escape(x)}</p>" for x in index_lines(idx, idx.get("at_init")))
    adj = idx["adjacent_angular"]
    rows = [{"block": l + 1, "removal_cost_nats": c, "update_ratio": b["update_ratio"],
             "angular_last": adj["last_token"][l], "angular_all": adj["all_tokens"][l],
             **({"J_minus_I": idx["jacobian_vs_identity"][l]} if "jacobian_vs_identity" in idx else {})}
            for l, (c, b) in enumerate(zip(idx.get("removal_cost", [None] * idx["blocks"]), res["blocks"]))]
    body += _table(rows, list(rows[0]), "Per block: the loss increase when it alone is removed (nats per token), "
                   "its update ratio and the angular distance between its input and output.") if rows else ""
    runs = [{**r, "blocks": span_text(r["blocks"])} for r in idx["contiguous"]]
    body += _table(runs, ["n", "blocks", "distance", "delta_loss"], "Gromov's protocol: for each n, the run of n "
                   "blocks whose ends are closest by last-token angular distance, and the loss increase (nats per "
                   "token) when it is removed.")
    defs = html.escape(curse_module.__doc__ or "")
    return body + f"<details><summary>definition</summary><pre>{defs}</pre></details>"


def write_report(res: dict, out: Path, label: str) -> dict[str, Path]:
    """Everything for one model under `out`; returns the written files by kind."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(res, indent=1) + "\n")
    plots = write_plots(res, out, label)
    tables = write_tables(res, out)
    files = {"metrics": out / "metrics.json", **plots}
    files["report"] = write_html(out / "report.html", f"depthlab analysis: {label}", report_intro(res, label),
                                 report_sections(res, plots), answer_html(res, plots))
    files.update({t.stem: t for t in tables})
    return files


def write_plots(res: dict, out: Path, label: str) -> dict[str, Path]:
    """Every figure one model's result has, under `out`, by kind."""
    runs = [(label, res)]
    plots = {}
    if "removal" in res:
        cheapest = answer_module.removable(res)
        plots["removal_cost"] = plot_removal_cost(res, out / "removal_cost.png",
                                                  cheapest[-1]["blocks"] if cheapest else [])
    plots.update({"variance": plot_variance(runs, out / "variance.png"),
                  "angular": plot_angular(label, res, out / "angular_heatmap.png"),
                  "adjacent": plot_adjacent_angular(runs, out / "angular_adjacent.png"),
                  "block_metrics": plot_blocks(runs, out / "block_metrics.png")})
    if "lens" in res:
        plots["lens"] = plot_lens(runs, out / "logit_lens.png")
    if "removal" in res:
        plots["removal"] = plot_removal(runs, out / "removal.png")
    if "task_removal" in res:
        plots["figure_one"] = plot_figure_one(runs, out / "figure_one.png")
    if "generate_removal" in res:
        plots["generate"] = plot_figure_one(runs, out / "generate_removal.png", key="generate_removal")
    if len(res.get("profiles", {}).get("profiles", {})) > 1:
        plots["profiles"] = plot_profiles(runs, out / "removal_profiles.png")
    if has_parts(res):
        plots["sublayers"] = plot_sublayers(runs, out / "sublayers.png")
    if "duplication" in res:
        plots["duplication_heatmap"] = plot_duplication(res, out / "duplication_heatmap.png")
    if "jacobian" in res:
        plots["jacobian"] = plot_jacobian(runs, out / "jacobian.png")
        plots["jacobian_heatmaps"] = plot_jacobian_heatmaps(label, res, out / "jacobian_heatmaps.png")
    return plots


def report_sections(res: dict, plots: dict) -> list[tuple[str, str]]:
    """The report's sections after its answer, as (title, html)."""
    sec = removal_sections(res, plots)  # the paper's Figure 1 by tasks first, then the details
    sec += [("Curse index", index_html(res))] if "curse_index" in res else []
    best = [{**r, "blocks": span_text(r["blocks"])} for r in res["angular"]["best_block"]]
    sec += [("Residual stream", _img(plots["variance"]) + _table(state_rows(res), [
        "index", "name", "variance", "variance_rest", "rms", "rms_rest", "max_abs", "max_over_rms", "channel",
        "position", "token_id", "lens_kl", "lens_ce"], "Per stream state (0 = the embedding output): variance, "
        "RMS and largest entry, with the massive positions set apart, and the logit lens.")),
        ("Angular distance", _img(plots["angular"]) + _img(plots["adjacent"]) +
         _table(best, ["n", "blocks", "distance"], "For each n, the run of n blocks whose ends are closest by "
                "last-token angular distance.")),
        ("Per-block metrics", _img(plots["block_metrics"]) + _table(block_rows(res), list(block_rows(res)[0]),
                                                                    "Every per-block number, one row per block."))]
    if "lens" in plots:
        sec.append(("Logit lens", _img(plots["lens"])))
    if "removal" in plots:
        rr = [{**r, "blocks": span_text(r["blocks"]), **({} if is_classifier(res) else
                                                          {"ppl_change_pct": pct_ppl(r["delta_loss"])})}
              for r in res["removal"]["runs"]]
        cols = ["loss", "delta_loss", "acc", "acc_drop"] if is_classifier(res) else ["delta_loss", "ppl_change_pct"]
        sec.append(("Layer removal", _img(plots["removal"]) + _table(rr, ["n", "blocks", *cols], "Contiguous runs "
                    "of n blocks (chosen by angular distance) removed: the loss increase in nats per token"
                    + ("" if is_classifier(res) else " and the same as % perplexity") + ".")))
    if "duplication_heatmap" in plots:
        rows = duplication_rows(res)
        sec.append(("Layer duplication", _p(
            "Blocks i..j run twice (blocks 1..j, then i..j again, then the rest), scored on the same windows"
            + (" and questions" if "tasks" in res["duplication"] else "") + "; " + res["duplication"]["interval"]
            + ". `depthlab duplicate MODEL --span START:END OUT` writes a span as a stock HF model (span: the "
            "0-based slice, END excluded).") + _img(plots["duplication_heatmap"])
            + _table(rows, list(rows[0]), "Each span run twice: the loss change (nats per token).")))
    if "jacobian" in plots:
        sec.append(("Jacobians", _img(plots["jacobian"]) + _img(plots["jacobian_heatmaps"])))
    return sec


def removal_sections(res: dict, plots: dict) -> list[tuple[str, str]]:
    """Task-scored removal (the paper's Figure 1), sublayers and linear replacement, the least useful blocks."""
    sec = []
    if "figure_one" in plots:
        rows = task_rows(res)
        sec.append(("Layer removal scored by tasks (the paper's Figure 1)", _p(
            "Accuracy when one block (or its attention, or its MLP, or a run of n blocks) is removed, scored as "
            "`depthlab eval` scores the same questions; acc_ci: " + res["task_removal"]["interval"] + "; ll: mean "
            "log-likelihood of the correct answer.") + _img(plots["figure_one"])
            + _table(rows, list(rows[0]), "Per task and removal: accuracy, its drop with the paired 95% interval, "
                     "and the questions lost and gained.")))
    if "generate" in plots:
        rows = task_rows(res, "generate_removal")
        sec.append(("Layer removal scored by generation", _p(
            "Exact match of greedy decoding (KV cache) when one block (or its attention, or its MLP, or a run of n "
            "blocks) is removed; acc_ci: " + res["generate_removal"]["interval"] + ".") + _img(plots["generate"])
            + _table(rows, list(rows[0]), "Per task and removal: exact match and its drop with the paired 95% "
                     "interval.")))
    if "profiles" in plots:
        rows = profile_rows(res)
        sec.append(("Removal profiles side by side", _p(
            "What removing each block costs, by loss, by the right choice's log-likelihood and by exact-match "
            "generation, each divided by its largest cost; Spearman rank correlations between them, with 95% "
            f"percentile bootstrap intervals over windows and questions ({res['profiles']['bootstrap']} "
            "replicates).") + _img(plots["profiles"])
            + (_table(rows, list(rows[0]), "Spearman rank correlations between the removal profiles.") if rows
               else "")))
    if "sublayers" in plots:
        rows = part_rows(res)
        fit = res["removal"].get("linear_fit_tokens")
        note = ("Attention only / MLP only: that sublayer's output zeroed. Linear replacement: the block replaced "
                "by the least-squares affine map from its input to its output, fitted on "
                f"{fit} tokens of windows kept apart from the evaluation windows; fit_residual = the share of the "
                "block's update the map misses there." if fit else "Attention only / MLP only: that sublayer's "
                "output zeroed.")
        sec.append(("Sublayer removal and linear replacement", _p(note) + _img(plots["sublayers"]) +
                    _table(rows, list(rows[0]), "Per block: the loss increase (nats per token) for each kind of "
                           "removal.")))
    rows = drop_rows(res)
    if rows:
        sec.append(("The model without its k least useful blocks", _p(
            "Blocks ranked by what removing each alone costs (loss; tasks: correct answers lost, then the answers' "
            "log-likelihood), the k lowest removed together and scored. `depthlab prune MODEL OUT --drop-lowest k "
            "--by loss|tasks` writes that model.") + _table(rows, list(rows[0]), "The k least useful blocks "
            "removed together: which (1-based), the loss and its increase in nats per token.")))
    return sec


def _p(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def _base_score(res: dict) -> dict:
    r = res.get("removal")
    if r and is_classifier(res):
        return {"loss": r["base_loss"], "acc": r["base_acc"]}
    return {"ppl": r["base_ppl"]} if r else {}


def _index_columns(res: dict) -> dict:
    """The curse index's headline numbers for the comparison table (absent for an older analysis)."""
    idx = res.get("curse_index", {})
    keys = ("inert_fraction", "inert_fraction_ci", "removal_deep_over_shallow", "update_slope")
    return {k: (" ".join(f"{x:.3g}" for x in idx[k]) if isinstance(idx[k], list) else idx[k]) for k in keys
            if k in idx}


def write_comparison(runs: Runs, out: Path) -> dict[str, Path]:
    """Overlay several models on relative depth (0 = embedding, 1 = last block)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({lab: r for lab, r in runs}, indent=1) + "\n")
    plots = {"variance": plot_variance(runs, out / "variance.png", True),
             "adjacent": plot_adjacent_angular(runs, out / "angular_adjacent.png", True),
             "blocks": plot_blocks(runs, out / "block_metrics.png", True)}
    if any("lens" in r for _, r in runs):
        plots["lens"] = plot_lens(runs, out / "logit_lens.png", True)
    if any("removal" in r for _, r in runs):
        plots["removal"] = plot_removal(runs, out / "removal.png", True)
    if any("task_removal" in r for _, r in runs):
        plots["figure_one"] = plot_figure_one(runs, out / "figure_one.png", True)
    if any(len(r.get("profiles", {}).get("profiles", {})) > 1 for _, r in runs):
        plots["removal_profiles"] = plot_profiles(runs, out / "removal_profiles.png")
    if any("generate_removal" in r for _, r in runs):
        plots["generate_removal"] = plot_figure_one(runs, out / "generate_removal.png", True, "generate_removal")
    if any(has_parts(r) for _, r in runs):
        plots["sublayers"] = plot_sublayers(runs, out / "sublayers.png", True)
    if any("jacobian" in r for _, r in runs):
        plots["jacobian"] = plot_jacobian(runs, out / "jacobian.png", True)
    summary = [{"model": lab, "layers": len(r["blocks"]), "variance_last": r["states"][-1]["variance"],
                "variance_embedding": r["states"][0]["variance"],
                "mean_adjacent_angular": sum(r["angular"]["last_token"][l][l + 1] for l in range(len(r["blocks"])))
                / len(r["blocks"]), **_base_score(r), **_index_columns(r)} for lab, r in runs]
    _write_csv(out / "compare.csv", summary)
    sec = [("Summary", _table(summary, list(summary[0]), "One row per model."))] + [
        (k.replace("_", " ").capitalize(), _img(p)) for k, p in plots.items()]
    lead = "".join(f"<p class='verdict'>{html.escape(x)}</p>" for x in comparison_lines(runs))
    files = {**plots, "report": write_html(out / "report.html", "depthlab comparison: " + ", ".join(l for l, _ in runs),
                                           ["Curves are drawn against relative depth so models of different "
                                            "depths line up."], sec, f"<div class='answer'>{lead}</div>")}
    return files


def comparison_lines(runs: Runs) -> list[str]:
    """`compare`'s answer: one line per model, then whether they were measured alike."""
    return [answer_module.compare_line(lab, r) for lab, r in runs] + answer_module.measured_alike(runs)
