"""The scalars study's design (depthlab.study.scalars): the 2 x 2 arms under Muon, depth by depth (grids, then
seeds), the budget rule that drops N = 48's scalar arms, and a plan that declares its families before any record."""

from dataclasses import replace

from depthlab.model.validate import validate
from depthlab.study import muon, own_rate as o, scalars as sc, transfer as t
from depthlab.study.records import cell_key
from depthlab.study.runner import Cell, Study


def _finish(records, cells):  # each grid's best one lattice step above its centre
    d = sc.Design()
    for c in cells:
        k = t.lattice(c.lr) - d.centre(c.variant, c.layers) - 1
        records[cell_key(c.variant, c.lr, c.seed, c.layers)] = {"status": "ok", "val_loss": abs(k) + c.seed,
                                                                "lr": c.lr}


def test_depth_by_depth_grids_then_seeds_and_every_arm_at_its_own_best():
    d, records = sc.Design(), {}
    first = o.next_cells(records, d)
    assert [c.layers for c in first] == [12] * 12 + [24] * 12 + [48] * 12 and {c.seed for c in first} == {0}
    while cells := o.next_cells(records, d):
        assert cells[0].layers == min(c.layers for c in cells)  # the shallowest depth left first
        _finish(records, cells[:1])  # one cell at a time, as --jobs 1 trains them
    for L in d.depths:
        for v in sc.ARMS:
            best = o.best(records, d, v, L)
            assert best == t.rate(d.centre(v, L) + 1)
            assert all(cell_key(v, best, s, L) in records for s in d.seeds)
    assert o.counts(records, d) == {"done": 12 * 4 + 12 * 2, "missing": 0, "waiting_at_least": 0,
                                    "planned_at_least": 72}


def test_the_budget_rule_drops_n48s_scalar_arms_only():
    d = replace(sc.Design(), deep_scalars=False)
    assert d.arms(48) == (sc.PRE, sc.LNS) and d.arms(24) == sc.ARMS
    assert {c.variant for c in o.next_cells({}, d) if c.layers == 48} == {sc.PRE, sc.LNS}
    b = sc.budget(d, {12: 6.0, 24: 12.0, 48: 24.0})
    assert b["cells_at_least"] == 50 and b["core_hours_at_least"] == round((20 * 6 + 20 * 12 + 10 * 24) / 60, 1)
    assert "dropped at N = 48" in b["deep_scalar_arms"]
    p = sc.plan(d)
    assert p["families"]["interaction"]["tests"] == [f"{sc.INTERACTION} at N = {L}" for L in (12, 24)]
    assert "lns - pre with scalars at N = 48" not in p["families"]["lns_effect"]["tests"]


def test_the_no_scalar_arms_are_the_muon_studys_cells_and_the_scalar_arms_add_only_the_scalars():
    s = Study("scalars", "/tmp/unused", sc.variants(sc.Design()), rate_keys=sc.RATE_KEYS)
    m = Study("muon", "/tmp/unused", muon.variants(muon.Design()), rate_keys=muon.RATE_KEYS)
    for scheme, arm in ((sc.PRE, sc.PRE_S), (sc.LNS, sc.LNS_S)):
        plain = validate(s.config(Cell(scheme, 0.008, 1, 12)))
        assert plain == m.config(Cell(scheme, 0.008, 1, 12))
        mixed = validate(s.config(Cell(arm, 0.008, 1, 12)))
        assert mixed.model.resid_lambda and mixed.model.x0_lambda and mixed.train.lr == mixed.train.muon_lr == 0.008
        assert replace(mixed.model, resid_lambda=False, x0_lambda=False) == plain.model and mixed.train == plain.train


def test_the_plan_declares_four_effects_their_trends_and_the_profile_rule():
    p = sc.plan(sc.Design())
    assert len(p["families"]["lns_effect"]["tests"]) == len(p["families"]["scalars_effect"]["tests"]) == 6
    assert len(p["families"]["interaction"]["tests"]) == 3 and len(p["families"]["depth_trend"]["tests"]) == 5
    assert p["margins"] == {"equivalence_nats": 0.01, "profile_slope": sc.PROFILE_MARGIN}
    assert p["min_seeds_for_a_word"] == 3 and p["arms_at_depth"]["48"] == list(sc.ARMS)


def test_what_the_scalars_learned_is_read_by_the_plans_profile_rule():
    """r_l = sqrt(l / (l - 1)) makes m_l = 1 / prod r_k = l^(-1/2) exactly: LNS's profile; r = 1 everywhere has
    none; fewer than 3 seeds, no word."""
    import math

    d, L, records = sc.Design(), 12, {}
    for k in range(5, 8):  # pre+scalars's grid at N = 12, its best at its centre, 8e-3 (lattice 6)
        records[cell_key(sc.PRE_S, t.rate(k), 0, L)] = {"status": "ok", "val_loss": abs(k - 6), "lr": t.rate(k)}
    assert sc.learned(records, d, sc.PRE_S, L) is None  # no record holds scalars yet
    lns_like = [1.0] + [math.sqrt(l / (l - 1)) for l in range(2, L + 1)]
    for s, noise in zip(d.seeds, (0.0, 1e-3, -1e-3), strict=True):
        r = [x * (1 + noise) for x in lns_like]
        scalars = {"resid_lambda": r, "x0_lambda": [0.1] * L}
        records[cell_key(sc.PRE_S, t.rate(6), s, L)] = {"status": "ok", "val_loss": 0.0,
                                                        "probes": [{"stream_scalars": scalars}]}
    got = sc.learned(records, d, sc.PRE_S, L)
    assert got["word"] == "learns LNS's profile" and abs(got["slope"]["mean"] + 0.5) < 0.01
    assert got["seeds"] == 3 and abs(got["m"][-1] / L ** -0.5 - 1) < 0.02
    for s in d.seeds:  # no damping: r = 1 (to a seed's rounding)
        records[cell_key(sc.PRE_S, t.rate(6), s, L)]["probes"][0]["stream_scalars"]["resid_lambda"] = [1 + s / 1e3] * L
    assert sc.learned(records, d, sc.PRE_S, L)["word"] == "no depth profile"
    del records[cell_key(sc.PRE_S, t.rate(6), 2, L)]
    assert sc.learned(records, d, sc.PRE_S, L)["word"] == "no verdict"
