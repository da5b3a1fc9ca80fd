"""The Muon study (issue 53): does LNS still help, and does a scheme's best rate still move with depth, when the
blocks' matrices train with Muon (train.optimizer=muon) instead of AdamW?

    N = 6, 12, 24  pre and lns under Muon: each its own 3-rate grid on the sqrt(2) lattice (seed 0), centred where
                   AdamW's best was and widened past an edge that holds the best, selected on the whole validation
                   split; then seeds 1 and 2 at each best; then each scheme at N = 6's best rate at 12 and 24,
                   every seed (the rate-transfer run)
    N = 48         the same pair, grids then seeds, as far as the cores allow (`--deep 48`)

One rate drives both optimizers: train.muon_adjust_lr=match_rms_adamw scales Muon's orthogonalized step to the RMS
of an AdamW step (0.2 sqrt(max(A, B))), so the cell's rate is both train.lr (AdamW: embeddings, head, norm gains,
scalars) and train.muon_lr (the blocks' matrices), and a grid over it compares with AdamW's grids rate for rate.
The model, data, training and probe are the own-rate study's (depthlab.study.own_rate), on its balanced held-out
splits; the order of the cells, the grids and the widening are its functions, with this Design."""

from __future__ import annotations

from dataclasses import dataclass

from depthlab.study import own_rate as o, transfer as t

MUON = ["train.optimizer=muon", "train.muon_adjust_lr=match_rms_adamw"]
VARIANTS = {v: [f"model.norm_scheme={v}", *MUON] for v in (o.PRE, o.LNS)}
RATE_KEYS = ("train.lr", "train.muon_lr")
# lattice index each grid starts around: AdamW's best at that depth (the own-rate and depth-transfer studies)
CENTRES = {(o.PRE, 6): 6, (o.LNS, 6): 6, **{k: v for k, v in o.CENTRES.items() if k[0] in (o.PRE, o.LNS)}}


@dataclass(frozen=True)
class Design(o.Design):
    depths: tuple[int, ...] = (6, 12, 24)
    seeds: tuple[int, ...] = (0, 1, 2)
    deep: int | None = None  # 48 where the cores allow
    deep_seeds: tuple[int, ...] = (0, 1, 2)
    parts: tuple[str, ...] = ()
    transfer_from: int | None = 6

    def centres(self) -> dict[tuple[str, int], int]:
        return CENTRES

    def describe(self) -> dict:
        return {**super().describe(), "centres": {f"{v}@{L}": t.rate(k) for (v, L), k in CENTRES.items()}}


def variants(d: Design) -> dict[str, list[str]]:
    return {v: VARIANTS[v] for v in d.pair}


def plan(d: Design) -> dict:
    """What decides this study's words, declared before its first cell (OUT/plan.json, committed first)."""
    depths = [*d.depths, *([d.deep] if d.deep else [])]
    shallow = [L for L in d.depths if L != d.transfer_from]
    return {
        "study": "muon",
        "question": "Under Muon, does LNS reach a lower test loss than Pre-LN, each at its own validation-selected "
                    "rate, and does each scheme's best rate move with depth?",
        "optimizer": "torch.optim.Muon (momentum 0.95, Nesterov, 5 Newton-Schulz steps) on the blocks' 2-D weights "
                     "with adjust_lr match_rms_adamw; AdamW on the rest; one rate for both (train.lr = "
                     "train.muon_lr), the cosine schedule and warm-up of the AdamW studies",
        "primary_endpoint": "paired by seed: test loss of LNS minus that of Pre-LN, each at its own rate selected on "
                            "the validation split, at each depth, under Muon",
        "selection": o.plan(d)["selection"].replace("the depth-transfer study's best",
                                                    "AdamW's best at that depth (N = 6: 8e-3)"),
        "splits": o.plan(d)["splits"],
        "depths": depths, "variants": {"pair": list(d.pair)}, "seeds": {str(L): list(d.seeds) for L in depths},
        "alpha": 0.05, "interval": "95% two-sided t-interval", "min_seeds_for_a_word": 3,
        "families": {
            "primary": {"tests": [f"lns - pre under Muon at N = {L}" for L in depths],
                        "correction": "Holm over the family (a depth without 3 paired seeds leaves it)"},
            "rate_exponent": {"tests": [f"slope of log(best rate) on log(N) under Muon, {v}" for v in d.pair],
                              "correction": "Holm over the two schemes"},
            "transfer": {"tests": [f"{v} at N = {L}: N = {d.transfer_from}'s rate minus its own best rate"
                                   for v in d.pair for L in shallow],
                         "correction": "Holm over the family; 'costs' where higher, else 'no cost shown'"},
            "against_adamw": {"tests": [f"(lns - pre under Muon) - (lns - pre under AdamW, the own-rate study) at "
                                        f"N = {L}" for L in (12, 24) if L in depths],
                              "correction": "Holm over the family; Welch's t-test on the two studies' per-seed "
                                            "differences (unpaired: different runs); read only where both have 3 "
                                            "paired seeds"},
        },
        "words": {"lower/higher": "Holm-adjusted p < 0.05 and the 95% interval excludes 0",
                  "inconclusive": "otherwise, with >= 3 paired seeds",
                  "no verdict": "fewer than 3 paired seeds"},
        "margins": {
            "holds_its_rate_slope": {f"{min(ds)}-{max(ds)}": round(t.hold_margin(ds), 4)
                                     for ds in (depths, list(d.depths)) if len(ds) > 1},
            "holds_rule": o.plan(d)["margins"]["holds_rule"],
        },
        "noise_model": o.plan(d)["noise_model"],
        "declared_before": "this file's commit precedes every record of runs.jsonl beside it",
    }
