"""The curse index's inert criterion reads the deep half of the interior: shallow inert blocks do not make a curse.
Runs are built from per-block removal costs through the library's own index (probe.index_from_costs), read the way
the study pages read them (summary.index_reading, summary.matched_rates), and checked on the committed records."""

from pathlib import Path

import pytest

from depthlab.analysis import curse
from depthlab.analysis.curse import CurseSpec, interior, removal_index, shallow_deep
from depthlab.study import summary, verdicts
from depthlab.study.probe import index_from_costs
from depthlab.study.records import final_probe, load_records, upgrade

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
ACTIVE, INERT = 0.05, 0.001  # nats: well above and well below the 0.005-nat threshold


def _record(costs: list[float], seed: int = 0, variant: str = "pre") -> dict:
    """A finished cell whose final probe has these per-block removal costs (block 1 first)."""
    L = len(costs)
    probe = {"step": 100, "tokens": 1000, "probe_loss": 3.0, "removal": costs,
             "curse": index_from_costs(costs, [0.1] * L)}
    return {"variant": variant, "layers": L, "lr": 8e-3, "seed": seed, "status": "ok", "val_loss": 2.5,
            "probes": [probe], "key": f"{variant}-L{L}-lr0.008-seed{seed}"}


def _n12(shallow: float, deep: list[float], jitter: float = 0.0) -> list[float]:
    """N = 12: interior 2..10, whose deep half is 7..10 (the middle block 6 counts as shallow)."""
    return [3.0] + [shallow + jitter] * 5 + [d + jitter for d in deep] + [0.2, 0.3]


def test_the_deep_half_is_the_upper_half_of_the_interior_and_an_odd_middle_block_stays_shallow():
    assert curse.deep_half(list(range(2, 11))) == [7, 8, 9, 10]  # 9 blocks: 4 deep, the middle one (6) shallow
    assert curse.deep_half(list(range(2, 12))) == [7, 8, 9, 10, 11]  # 10 blocks: 5 and 5
    assert curse.deep_half([2]) == [] and curse.deep_half([]) == []
    for N in range(6, 65):  # under the default interior it is the ratio's deep interior (N/2, N-2]
        assert curse.deep_half(interior(N)) == shallow_deep(N)[1]


def _n24(deep: list[float], jitter: float = 0.0) -> list[float]:
    """N = 24: interior 2..22 (21 blocks), whose deep half is 13..22 (the middle block 12 counts as shallow)."""
    return [3.0] + [ACTIVE + jitter] * 11 + [d + jitter for d in deep] + [0.2, 0.3]


def test_shallow_inert_blocks_with_active_deep_ones_do_not_read_present():
    """Five of nine interior blocks inert (the whole interior's fraction 0.56, over 1/3), all of them shallow:
    the old whole-interior criterion read this cell "present"; the deep half has no inert block. Three seeds hold
    0 inert of 12 deep blocks (pooled exact interval [0, 0.26]): absent."""
    runs = {s: _record(_n12(INERT, [ACTIVE] * 4, jitter=s * 1e-4), seed=s) for s in (0, 1, 2)}
    idx = summary.index_reading(runs)
    assert idx["curse"]["word"] == "absent" and idx["curse"]["inert"]["mean"] == 0.0
    assert idx["curse"]["inert"]["pooled"] == [0, 12] and idx["curse"]["inert"]["ci"][1] < verdicts.PRESENT
    assert idx["inert_fraction"]["mean"] == pytest.approx(5 / 9)  # still reported, as a description
    one = summary.matched_rates({r["key"]: r for r in (runs[0], _record(_n12(ACTIVE, [ACTIVE] * 4), variant="lns"))})
    assert one[0]["curse"]["single"] == "absent" and one[0]["inert_fraction_deep"] == {"pre": 0.0, "lns": 0.0}
    assert [verdicts.deep_inert_fraction(final_probe(r)) for r in runs.values()] == [0.0, 0.0, 0.0]


def test_seeds_that_agree_on_a_count_do_not_make_a_point_interval():
    """The inert fraction is a count: two seeds at 0 of 4 deep blocks give a t-interval of no spread, [0, 0], which
    read "absent" with certainty; pooled, 0 of 8 has the exact interval [0, 0.37], which holds 1/3. Likewise two
    seeds at exactly 8 of 22 (a committed depth-study cell) pool to 16 of 44, [0.22, 0.52], not [0.36, 0.36]."""
    runs = {s: _record(_n12(INERT, [ACTIVE] * 4, jitter=s * 1e-4), seed=s) for s in (0, 1)}
    c = summary.index_reading(runs)["curse"]
    assert c["inert"]["std"] == 0 and c["inert"]["pooled"] == [0, 8]
    assert c["inert"]["ci"][0] == 0 and c["inert"]["ci"][1] == pytest.approx(0.369, abs=1e-3)
    assert c["inert"]["side"] == "inconclusive" and c["word"] == "inconclusive"
    r = verdicts.curse_reading([1.2, 1.1], [8 / 22, 8 / 22], 45, [(8, 22), (8, 22)])
    assert r["inert"]["ci"] == pytest.approx([0.224, 0.522], abs=1e-3) and r["word"] == "inconclusive"
    assert verdicts.curse_reading([1.2, 1.1], [8 / 22, 8 / 22], 45)["word"] == "present"  # t alone: a point


def test_inert_deep_blocks_read_present_by_the_inert_criterion_alone():
    """Seven of ten deep-half blocks inert (0.7, over 1/3) in each of two seeds (pooled 14 of 20, exact interval
    [0.46, 0.88]) while the deep/shallow ratio is far above 0.5 (three deep blocks are costly): present, by the
    inert criterion."""
    runs = {s: _record(_n24([INERT] * 7 + [0.5] * 3, jitter=s * 1e-4), seed=s) for s in (0, 1)}
    c = summary.index_reading(runs)["curse"]
    assert c["word"] == "present" and c["by"] == ["inert"] and c["inert"]["mean"] == pytest.approx(0.7)
    assert c["inert"]["pooled"] == [14, 20] and c["ratio"]["side"] == "absent"


def test_a_deep_half_under_min_deep_blocks_leaves_the_inert_criterion_to_the_ratio():
    # N = 10: interior 2..8 (7 blocks), deep half 6..8: 3 blocks, one of which would reach 1/3 alone
    costs = [3.0] + [ACTIVE] * 4 + [INERT] + [ACTIVE] * 2 + [0.2, 0.3]
    assert len(curse.deep_half(interior(10))) == verdicts.MIN_DEEP - 1
    probe = final_probe(_record(costs))
    assert verdicts.deep_inert_fraction(probe) is None
    c = verdicts.cell_reading([probe])
    assert c["single"] == "absent" and c["inert"]["n"] == 0 and c["ratio"]["n"] == 1
    # N = 11: interior 2..9 (8 blocks), deep half 6..9: 4 blocks, one inert reads 0.25
    assert verdicts.deep_inert_fraction(final_probe(_record([3.0] + [ACTIVE] * 4 + [INERT] + [ACTIVE] * 3
                                                            + [0.2, 0.3]))) == 0.25


def test_the_committed_records_read_by_the_deep_half():
    """Two runs of the committed studies. Pre-LN, N = 24, lr 0.016 (depth study): shallow interior inert, whole
    interior 0.71; its deep half 13..22 still has blocks 13-15, 17 and 18 inert (0.50), so it reads present by the
    inert criterion (its ratio, 11.2, reads absent). LNS, N = 48, lr 0.032 (LNS study): whole interior 0.44, which
    read present; its deep half 25..46 holds 3 inert blocks of 22 (0.14) and its ratio is 4.7: absent."""
    depth = load_records(RESULTS / "depth_study" / "runs.jsonl")["pre-L24-lr0.016-seed0"]
    p = final_probe(upgrade(depth))
    assert p["curse"]["inert_fraction"] == pytest.approx(15 / 21) and p["curse"]["removal_deep_over_shallow"] > 11
    assert verdicts.deep_inert_fraction(p) == pytest.approx(5 / 10)
    c = verdicts.cell_reading([p])
    assert c["single"] == "present" and c["word"] == verdicts.ONE_SEED_INDEX
    lns = load_records(RESULTS / "lns_study" / "runs.jsonl")["lns-L48-lr0.032-seed0"]
    q = final_probe(lns)
    assert q["curse"]["inert_fraction"] == pytest.approx(20 / 45) and q["curse"]["removal_deep_over_shallow"] > 4
    assert verdicts.deep_inert_fraction(q) == pytest.approx(3 / 22)
    assert summary.index_reading({0: lns})["curse"]["single"] == "absent"


def test_analyze_reports_the_deep_half_beside_the_whole_interior():
    # N = 8: interior 2..6, deep half 5, 6; costs 0.1, 0.002, 0.1, 0.001, 0.3 over blocks 2..6 (nats per token)
    costs = [1.0, 0.1, 0.002, 0.1, 0.001, 0.3, 0.2, 0.4]
    idx = removal_index({"count": [10, 10], "single_delta": [[10 * c] * 2 for c in costs]}, 8, CurseSpec(bootstrap=50))
    assert idx["inert_blocks"] == [3, 5] and idx["inert_fraction"] == pytest.approx(2 / 5)
    assert idx["deep_half"] == [5, 6] and idx["inert_fraction_deep"] == 0.5
    assert idx["inert_fraction_deep_ci"] == [0.5, 0.5]  # every window alike: no spread
    from depthlab.analysis.curse import index_lines

    idx["update_slope"] = 0.0
    assert index_lines(idx)[1] == "deep half of the interior (blocks 5-6): inert fraction 0.50 [0.50, 0.50]"


def test_the_figure_draws_the_t_interval_the_word_reads():
    from depthlab.plots import pyplot
    from depthlab.study.figures import _criterion

    plt = pyplot()
    fig, ax = plt.subplots()
    cells = [verdicts.curse_reading([0.3, 0.4, 0.35], [0.5, 0.6, 0.4], 9)[k] for k in ("ratio", "inert")]
    cells.append(verdicts.curse_reading([0.9], [0.1], 9)["ratio"])  # one seed: a point, no bar
    _criterion(ax, [12, 24, 48], cells, "o-", "pre")
    bars = ax.collections[-1].get_segments()
    for seg, c in zip(bars, cells[:2], strict=False):
        assert sorted(y for _, y in seg) == pytest.approx(c["ci"])
    assert bars[2][0][1] == bars[2][1][1] == pytest.approx(0.9)
    plt.close(fig)
