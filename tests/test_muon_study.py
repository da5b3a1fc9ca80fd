"""The Muon study's design (depthlab.study.muon): its grids, seeds and rate-transfer cells in order, one rate for both
optimizers, and a plan that declares its families before any record."""

from depthlab.study import muon, own_rate as o, transfer as t
from depthlab.study.records import cell_key
from depthlab.study.runner import Cell, Study


def test_grids_then_seeds_then_the_base_depths_rate_at_every_other_depth():
    d = muon.Design()
    records: dict = {}

    def finish(cells):  # each grid's best one lattice step above its centre
        for c in cells:
            k = t.lattice(c.lr) - muon.CENTRES[(c.variant, c.layers)] - 1
            records[cell_key(c.variant, c.lr, c.seed, c.layers)] = {"status": "ok", "val_loss": abs(k) + c.seed,
                                                                    "lr": c.lr}

    first = o.next_cells(records, d)
    assert {(c.layers, c.seed) for c in first} == {(L, 0) for L in (6, 12, 24)} and len(first) == 18
    finish(first)
    later = o.next_cells(records, d)  # every grid widened once (its best at the upper edge), then nothing else
    assert len(later) == 6 and {c.seed for c in later} == {0}
    finish(later)
    while cells := o.next_cells(records, d):
        finish(cells)
    for v in d.pair:
        own6 = o.best(records, d, v, 6)
        assert own6 == t.rate(muon.CENTRES[(v, 6)] + 1)
        for L in (12, 24):  # N = 6's rate at the deeper depths, every seed, beside their own best
            assert all(cell_key(v, own6, s, L) in records for s in d.seeds)
            assert all(cell_key(v, o.best(records, d, v, L), s, L) in records for s in d.seeds)
    # each cell once: 6 widened grids, 2 seeds at each best, and 2 seeds at N = 6's rate where it is a deeper grid's
    # rate but not its best (pre at 12 is best at N = 6's rate: those are its seeds' cells)
    assert o.counts(records, d) == {"done": 6 * 4 + 6 * 2 + 3 * 2, "missing": 0, "waiting_at_least": 0,
                                    "planned_at_least": 42} == {**o.counts(records, d), "done": len(records)}


def test_a_cell_sets_one_rate_for_both_optimizers():
    s = Study("muon", "/tmp/unused", muon.variants(muon.Design()), rate_keys=muon.RATE_KEYS)
    cfg = s.config(Cell(o.LNS, 0.008, 1, 12))
    assert (cfg.train.optimizer, cfg.train.muon_adjust_lr) == ("muon", "match_rms_adamw")
    assert cfg.train.lr == cfg.train.muon_lr == 0.008 and cfg.model.norm_scheme == "lns" and cfg.train.seed == 1


def test_the_plan_names_its_families_and_the_margins_it_declares():
    p = muon.plan(muon.Design())
    assert p["families"]["primary"]["tests"] == [f"lns - pre under Muon at N = {L}" for L in (6, 12, 24)]
    assert len(p["families"]["transfer"]["tests"]) == 4 and p["margins"]["holds_its_rate_slope"] == {"6-24": 0.25}
    assert p["min_seeds_for_a_word"] == 3
