"""Which blocks prune takes out: the k least useful as `depthlab analyze` ranked them (its metrics.json), or greedily,
one at a time, each step scored as `analyze` scores a removal (depthlab.analysis.greedy); and what either measured,
as the lines prune prints."""

from __future__ import annotations

from pathlib import Path

from depthlab import UserError


def least_useful(src: str | Path, analysis: str | Path, k: int, by: str) -> tuple[list[int], list[str]]:
    """(the 0-based indices of the k least useful blocks of `src` by `by` ("loss" or "tasks"), as `depthlab analyze`
    ranked them in `analysis`; lines saying what that analysis measured for the model without them)."""
    from depthlab.paths import ANALYSIS_RESULTS, model_path, read_json

    res = read_json(Path(analysis) / ANALYSIS_RESULTS[0])
    if not isinstance(res, dict) or not isinstance(res.get("model"), dict):
        raise UserError(f"{analysis} holds no analysis (metrics.json); run `depthlab analyze {src} --out {analysis}` "
                        "first, or name the analysis with --analysis DIR")
    if model_path(res["model"].get("path", ""), warn=lambda m: None)[1].resolve() != model_path(src)[1].resolve():
        raise UserError(f"{analysis} is the analysis of {res['model'].get('path')}, not of {src}")
    order = res.get("usefulness", {}).get(by)
    if order is None:
        how = "--removal-tasks / --removal-mmlu / --removal-commonsense" if by == "tasks" else "removal"
        raise UserError(f"{analysis} ranks no blocks by {by}: analyze {src} with {how}")
    check_drop(k, len(order))
    return [b - 1 for b in order[:k]], measured_lines(res, k, by)


def check_drop(k: int, n: int) -> None:
    """--drop-lowest K of a model of n blocks: 1..n-1."""
    if not 1 <= k < n:
        raise UserError(f"--drop-lowest {k}: the model has {n} blocks; drop 1..{n - 1}")


def measured_lines(res: dict, k: int, by: str) -> list[str]:
    """What the analysis measured for the model without its k least useful blocks (by `by`)."""
    r = res["removal"]
    drop = next((d for d in r.get("drop", {}).get(by, []) if d["k"] == k), None)
    if drop is None:
        return [f"not scored by the analysis (it scored up to k = {len(r.get('drop', {}).get(by, []))}): analyze "
                f"with --drop-lowest {k} to see what this model scores"]
    lines = [f"the analysis measured, without them: loss {drop['loss']:.4f} ({drop['delta_loss']:+.4f} against "
             f"{r['base_loss']:.4f})"]
    for name, t in res.get("task_removal", {}).get("tasks", {}).items():
        d = next(x for x in t["drop"][by] if x["k"] == k)
        lines.append(f"  {name}: accuracy {d['acc']:.4f} [{d['acc_ci'][0]:.4f}, {d['acc_ci'][1]:.4f}] (the model's "
                     f"{t['base_acc']:.4f}, {t['n']} questions), answer log-likelihood {d['ll']:.4f} "
                     f"(the model's {t['base_ll']:.4f})")
    return lines


GREEDY_METRIC = {"loss": "loss", "tasks": "acc", "generate": "acc"}  # what the table shows, by what greedy ranks by


def greedy_lines(record: dict) -> list[str]:
    """The greedy record as a table: per k, the blocks greedy removal took out and its metric, beside the one-shot
    choice's (the k blocks whose removal alone costs least)."""
    metric = GREEDY_METRIC[record["by"]]
    listed = lambda bs: " ".join(map(str, bs)) or "-"  # noqa: E731
    rows = [(0, [], record["base"], [], record["base"])]
    rows += [(s["k"], s["greedy"]["blocks"], s["greedy"], s["one_shot"]["blocks"], s["one_shot"])
             for s in record["steps"]]
    width = max(len("one-shot blocks"), *(len(listed(r[1])) for r in rows), *(len(listed(r[3])) for r in rows))
    lines = [f"{'k':>3}  {'greedy blocks':<{width}}  {'greedy ' + metric:>12}  {'one-shot blocks':<{width}}  "
             f"{'one-shot ' + metric:>14}"]
    for k, g, gm, o, om in rows:
        lines.append(f"{k:>3}  {listed(g):<{width}}  {gm[metric]:>12.4f}  {listed(o):<{width}}  {om[metric]:>14.4f}")
    return lines


def greedy_record(model: str, k: int, by: str, **request) -> dict:
    """The greedy record (depthlab.analysis.greedy.greedy_removal) of `model`, scored on the calibration windows,
    the task questions or the generation tasks `request` names (the fields of a depthlab.analysis.run.Request, read
    as `analyze` reads them), with what it was scored on."""
    from depthlab.analysis.greedy import GREEDY_BY, GenerationScorer, LossScorer, TaskScorer, greedy_removal
    from depthlab.analysis.run import Request, batches_for, generation_for, load_layered, questions_for
    from depthlab.analysis.tasks import question_mask

    if by not in GREEDY_BY:
        raise UserError(f"greedy removal ranks by {' or '.join(GREEDY_BY)}, not {by!r}")
    req = Request(model, **request)
    loaded = load_layered(req.model, req.trust_remote_code, req.dtype, req.device)
    lm = loaded.lm
    if lm.classifier:
        raise UserError(f"{req.model} is a ViT: greedy removal scores a causal language model")
    if by == "loss":
        seq_len = req.seq_len or loaded.seq_len
        batches, _, source = batches_for(req, lm, loaded.tokenizer, seq_len, loaded.info["context"])
        lm.discover(batches[0].inputs, batches[0].mask)
        scorer, data = LossScorer(lm, batches), {"source": source, "seq_len": seq_len, "tokens": sum(
            b.n_tokens for b in batches)}
    elif by == "tasks":
        questions = questions_for(req, lm)
        q = next(iter(questions.values()))[0]
        lm.discover(q.ids, question_mask(q))
        scorer, data = TaskScorer(lm, questions), {"tasks": {t: len(qs) for t, qs in questions.items()}}
    else:
        questions = generation_for(req, lm, loaded.tokenizer)
        scorer, data = GenerationScorer(lm, questions), {"generate": {t: len(qs) for t, qs in questions.items()}}
    return {"model": req.model, "data": data, **greedy_removal(scorer, k)}
