"""The model card of an export: README.md beside the weights, the page the Hugging Face Hub shows for the model.

`depthlab export` writes it (`write_card`): the Hub's YAML metadata (library_name transformers, the base model
where the run starts from a Hub model, a license placeholder, tags naming depthlab, the scheme and the family),
the scheme's formula (the first line of its class's docstring in the scheme registry, depthlab.model.schemes, and
the constants it multiplies each block by, which the export folded into the weights), the data and tokenizer the
checkpoint records, its steps and tokens, and the validation result of the step that saved it.
`depthlab eval ... --card EXPORT_DIR` adds what it measured (`check_card` before the evaluation, `add_results`
after). Results are kept in the Hub's eval-results format (model-index), written and read through huggingface_hub's
ModelCard, never by hand.

This module sits below hf/ and eval/ (both write cards) and imports neither.
"""

from __future__ import annotations

import filecmp
import re
from dataclasses import dataclass
from pathlib import Path

from depthlab import UserError
from depthlab.checkpoint import CONFIG, TOKENIZER, WEIGHTS, CheckpointMeta, read_meta, warn
from depthlab.paths import EXPORT_INFO, METRICS, Kind, read_json, run_of, what_is

CARD = "README.md"
LICENSE = "other"  # a placeholder: the weights' license follows the data's and the base model's, which we cannot know
RESULTS = "## Evaluation"  # the card's section depthlab rewrites whenever its results change; the rest is kept
_HEADING = re.compile(r"^#{1,2} ", re.M)  # where the Evaluation section ends: the next heading of its level or above
_HUB_CACHE = re.compile(r"models--([^/]+?)--([^/]+)")  # huggingface_hub's cache folder of a model: models--OWNER--NAME
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise UserError("model cards need huggingface_hub: pip install 'depthlab[hf]'") from None
    return huggingface_hub


def result(task: str, dataset: str, metric: str, value: float, kind: str = "multiple-choice",
           split: str | None = None):
    """One number an evaluation gave, in the Hub's eval-results form (`kind`: the Hub's task type)."""
    return _hub().EvalResult(task_type=kind, task_name=task, dataset_type=dataset, dataset_name=dataset,
                             dataset_split=split, metric_type=metric, metric_name=metric, metric_value=value)


@dataclass
class Scores:
    """What one evaluation measured on one task, as `eval` prints it: metric name -> value (`kind`: the Hub's task
    type). Plain data, so that an evaluation builds it without huggingface_hub."""

    task: str
    dataset: str
    metrics: dict[str, float]
    kind: str = "multiple-choice"

    def results(self) -> list:
        return [result(self.task, self.dataset, m, v, self.kind) for m, v in self.metrics.items()]


def _key(r) -> tuple:
    return r.task_type, r.task_name, r.dataset_type, r.metric_type


def merged(old: list, new: list) -> list:
    """`old` with each result of `new` replacing the one for the same task, data and metric, or added after."""
    fresh = {_key(r): r for r in new}
    return [fresh.pop(_key(r), r) for r in old] + list(fresh.values())


def write_card(out: Path, final: str | Path, loaded) -> None:
    """README.md in `out`, an export of the checkpoint `loaded` being written for the path `final`. The results on
    the card of an earlier export at `final` are kept when the weights and tokenizer written now are the ones they
    were measured on (the same checkpoint exported again); else they go with the model they belong to."""
    hub = _hub()
    cfg, meta = loaded.cfg, loaded.meta
    name, earlier = Path(final).resolve().name, Path(final)
    architecture = read_json(out / CONFIG)["architectures"][0]
    results = _validation(cfg, meta)
    if (earlier / CARD).is_file() and (earlier / EXPORT_INFO).is_file() and _same_model(earlier, out):
        try:
            results = merged(_load(earlier / CARD).data.eval_results or [], results)
        except ValueError as e:  # a card edited by hand beyond reading: its results are not carried over
            warn(f"{earlier / CARD}: cannot read its results ({e}); the new card has the checkpoint's own")
    base = base_model(cfg, meta)
    vit = cfg.model.is_vit
    data = hub.ModelCardData(library_name="transformers", license=LICENSE, base_model=base, model_name=name,
                             pipeline_tag="image-classification" if vit else "text-generation",
                             tags=["depthlab", f"scheme-{cfg.model.norm_scheme}", cfg.model.family],
                             eval_results=results or None)
    body = "\n\n".join([_about(name, loaded, architecture, base), _scheme(cfg.model, architecture),
                        _training(loaded), _license(), _results(results)])
    hub.ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n").save(out / CARD)


def _same_model(a: Path, b: Path) -> bool:
    names = [n for n in (WEIGHTS, TOKENIZER) if (a / n).is_file() or (b / n).is_file()]
    return all((a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def _validation(cfg, meta: CheckpointMeta) -> list:
    """The checkpoint's own validation (the step that saved it evaluated): loss, perplexity, a ViT's accuracy."""
    names = {"val_loss": "loss", "val_ppl": "perplexity", "val_acc": "accuracy"}
    kind = "image-classification" if cfg.model.is_vit else "text-generation"
    data = meta.source or "the run's data"
    return [result("validation", data, names[k], v, kind, "validation") for k, v in meta.val.items()
            if k in names and isinstance(v, float)]


def hub_id(origin: str) -> str | None:
    """The Hub id behind where a model was imported from: an id as given (`depthlab import owner/name`, read from
    the local HF cache), or the cache folder of one (.../models--owner--name/snapshots/REV); None for another path."""
    if cached := _HUB_CACHE.search(origin):
        return f"{cached[1]}/{cached[2]}"
    return origin if _HUB_ID.fullmatch(origin) and not Path(origin).exists() else None


def base_model(cfg, meta: CheckpointMeta, hops: int = 8) -> str | None:
    """The Hub model this one starts from: its import's, or that of the checkpoint it was trained from
    (train.init_from: a fine-tune, continued pretraining), followed back; None when none is a Hub model."""
    for _ in range(hops):
        if meta.imported_from:
            return hub_id(meta.imported_from)
        parent = _parent(cfg, meta)
        if parent is None:
            return None
        cfg, meta = parent
    return None


def _parent(cfg, meta: CheckpointMeta):
    """(config, meta) of the checkpoint `cfg` was trained from, or None (none, or no longer there)."""
    from depthlab.config import Config
    from depthlab.paths import find_checkpoint

    if not cfg.train.init_from:
        return None
    start = Path(cfg.train.init_from)
    start = start if start.is_absolute() else Path(meta.cwd or ".") / start
    try:
        ckpt = find_checkpoint(start)
        parent = read_meta(ckpt)
        return (Config.load(ckpt / CONFIG), parent) if parent is not None else None
    except (UserError, OSError):
        return None


def _about(name: str, loaded, architecture: str, base: str | None) -> str:
    m, meta = loaded.cfg.model, loaded.meta
    auto = "AutoModelForImageClassification" if m.is_vit else "AutoModelForCausalLM"
    size = f", {meta.n_params:,} parameters" if meta.n_params else ""
    lines = [f"# {name}", "",
             f"A {m.family} model ({m.n_layers} blocks, width {m.dim}{size}) trained with depthlab under the "
             f"normalization scheme `{m.norm_scheme}`, exported as a stock "
             f"`{architecture}`: it loads with `{auto}.from_pretrained`, without depthlab and without remote code."]
    if meta.imported_from:
        lines.append(f"\nIts weights started from `{base or meta.imported_from}` (imported with `depthlab import`).")
    elif base:
        lines.append(f"\nBase model: `{base}`.")
    return "\n".join(lines)


def _scheme(m, architecture: str) -> str:
    """The scheme in words (its registry docstring's first line) and the constants it put on each block."""
    from depthlab.model.schemes import scheme_class

    cls = scheme_class(m.norm_scheme)
    lines = [f"## Scheme: `{m.norm_scheme}`", "", (cls.__doc__ or "").strip().splitlines()[0]]
    blocks = range(1, m.n_layers + 1)
    norms = [cls.norm_scales(m, layer) for layer in blocks]
    branches = [cls.branch_multiplier(m, layer) for layer in blocks]
    shown = [("attention norm", [a for a, _ in norms]), ("MLP norm", [b for _, b in norms]),
             ("branch output", branches)]
    shown = [(what, values) for what, values in shown if any(v != 1.0 for v in values)]
    if m.norm_scheme == "lns":
        root = " = 1/sqrt(l)" if m.lns_power == 0.5 else ""
        lines.append(f"\nHere p = {m.lns_power:g} (model.lns_placement={m.lns_placement}): block l's multiplier is "
                     f"l^(-{m.lns_power:g}){root}.")
    if shown:
        lines += ["", "| block l | " + " | ".join(f"{what} x" for what, _ in shown) + " |",
                  "|---|" + "---|" * len(shown)]
        lines += [f"| {layer} | " + " | ".join(f"{values[layer - 1]:.4g}" for _, values in shown) + " |"
                  for layer in blocks]
        lines.append(f"\nThese constants are folded into the weights (Norm_g(x) * s = Norm_(g * s)(x): a norm's scale "
                     "into its weight; a branch's into its output projection), so the model loads as a stock "
                     f"`{architecture}` and computes what the depthlab model did.")
    if cls.branch_gains:
        lines.append("\nThe learned branch gains are folded into the rows of `o_proj` and `down_proj`.")
    return "\n".join(lines)


def _training(loaded) -> str:
    cfg, meta = loaded.cfg, loaded.meta
    tokens = _tokens_seen(loaded.path, meta.step)
    seen = f" ({tokens:,} tokens)" if tokens else ""
    lines = ["## Training", "", f"- steps: {meta.step:,}{seen}"]
    if meta.source:
        lines.append(f"- data: {meta.source}")
    if cfg.data.paths and not meta.imported_from:
        lines.append(f"- data paths (as the run's config records them): {', '.join(f'`{p}`' for p in cfg.data.paths)}")
    counts = {k: v for k, v in meta.data.items() if k in ("train_tokens", "val_tokens") and isinstance(v, int)}
    if counts:
        lines.append("- split: " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in counts.items()))
    if meta.data.get("val_digest"):
        lines.append(f"- validation tokens' digest: `{meta.data['val_digest']}`")
    if meta.tokenizer_hash:
        lines.append(f"- tokenizer: `{TOKENIZER}` (hash `{meta.tokenizer_hash}`), shipped with the model")
    if cfg.train.init_from:
        lines.append(f"- trained from: `{cfg.train.init_from}`")
    if meta.imported_from:
        lines.append(f"- imported from: `{meta.imported_from}`")
    return "\n".join(lines)


def _tokens_seen(ckpt: Path, step: int) -> int | None:
    """Tokens trained on up to `step`, from the run's metrics (each record's `tokens` is its step times the tokens
    per step); None outside a run or without a record of them."""
    from depthlab.runfolder import read_metrics

    run = run_of(Path(ckpt))
    if run is None or not (run / METRICS).is_file():
        return None
    try:
        records = [r for r in read_metrics(run, warn=lambda msg: None) if r.get("tokens") and r["step"] > 0]
    except UserError:
        return None
    return step * (records[-1]["tokens"] // records[-1]["step"]) if records else None


def _license() -> str:
    return ("## License\n\nNot chosen by depthlab: the metadata says `license: other` as a placeholder. Set the "
            "license that the training data and any base model allow before publishing.")


def _results(results: list) -> str:
    if not results:
        return (f"{RESULTS}\n\nNone yet: `depthlab eval ... --card THIS_DIR` adds what it measures, here and in the "
                "metadata (model-index).")
    rows = [f"| {r.task_name} | {r.dataset_name}{f' ({r.dataset_split})' if r.dataset_split else ''} | "
            f"{r.metric_type} | {r.metric_value:.4f} |" for r in results]
    return "\n".join([RESULTS, "", "Also in the metadata (model-index), where the Hub reads them.", "",
                      "| task | data | metric | value |", "|---|---|---|---|", *rows])


def _load(path: Path):
    """huggingface_hub's ModelCard of the card at `path`; a ValueError of one line when its metadata cannot be read
    (YAML that does not parse gives yaml's own error, several lines long)."""
    import yaml

    try:
        return _hub().ModelCard.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)  # counted from the line after the opening ---, from 0
        where = f" at line {mark.line + 2}" if mark is not None else ""
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"its metadata (the YAML between the --- lines) does not parse{where}: {why}") from None


def card_of(directory: str | Path):
    """The model card of an export `directory`, read; one line when it is none (missing, not an export, no card, a
    card huggingface_hub cannot read)."""
    d = Path(directory)
    kind = what_is(d)
    if kind is Kind.MISSING:
        raise UserError(f"--card {d} does not exist")
    if kind is not Kind.HF or not (d / EXPORT_INFO).is_file():
        raise UserError(f"--card {d} is {kind.value}, not a `depthlab export` directory")
    if not (d / CARD).is_file():
        raise UserError(f"--card {d} has no model card ({CARD}); write one with `depthlab export`")
    try:
        return _load(d / CARD)
    except ValueError as e:
        raise UserError(f"--card {d}: cannot read its {CARD}: {e}") from None


def add_results(directory: str | Path, scores: list[Scores]) -> Path:
    """Add what `scores` measured to the card of the export `directory` (each result replaces one of the same task,
    data and metric; no two of them may share those), under its lock, the file written whole; the card's other
    sections are kept as they are (`with_results`)."""
    from depthlab.ownership import locked, write_whole

    new = [r for s in scores for r in s.results()]
    if len({_key(r) for r in new}) < len(new):  # one would hide another: the count said would not be on the card
        twice = next(r for i, r in enumerate(new) if _key(r) in map(_key, new[:i]))
        raise UserError(f"two results named {twice.task_name} {twice.metric_type} on {twice.dataset_name}; "
                        "evaluate each task once")
    with locked(directory, "eval --card"):
        card, path = card_of(directory), Path(directory) / CARD
        card.data.eval_results = merged(card.data.eval_results or [], new)
        card.data.model_name = card.data.model_name or Path(directory).resolve().name
        card.text = with_results(card.text, card.data.eval_results)
        write_whole(path, str(card))
    return path


def with_results(text: str, results: list) -> str:
    """The card's text with its Evaluation section, up to the next heading of its level or above, showing `results`
    (added at the end when it has none); every other section is kept as it was, a user's own included."""
    head, found, rest = f"\n{text}".partition(f"\n{RESULTS}\n")
    after = rest[m.start():] if found and (m := _HEADING.search(rest)) else ""
    return f"{head[1:].rstrip()}\n\n{_results(results)}\n" + (f"\n{after.rstrip()}\n" if after else "")


def check_card(directory: str | Path, models: list[str]) -> None:
    """The card `eval --card` is to add to, checked before the evaluation: `directory` must be an export with a card
    (card_of), of the one model evaluated (the export itself, or the checkpoint it was exported from, at the same
    step). One line otherwise."""
    from depthlab.paths import model_path

    card_of(directory)
    if len(models) != 1:
        raise UserError(f"--card adds the results of one model to its card; {len(models)} models are given")
    d = Path(directory).resolve()
    kind, model = model_path(models[0])
    if model.resolve() == d:
        return
    info = read_json(d / EXPORT_INFO)
    info = info if isinstance(info, dict) else {}
    meta = read_meta(model) if kind is Kind.CHECKPOINT else None
    if Path(str(info.get("source"))).resolve() != model.resolve() or meta is None or meta.step != info.get("step"):
        raise UserError(f"--card {directory} is the export of {info.get('source')} at step {info.get('step')}, not "
                        f"of {models[0]} ({model}); give the card of the model evaluated")


