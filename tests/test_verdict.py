"""The declared rule (depthlab.analysis.verdict) on made-up raw outcomes whose answer is known by construction."""

import math

import numpy as np
import pytest

from depthlab.analysis.verdict import (
    INCONCLUSIVE,
    NOT_TESTABLE,
    NOT_WASTED,
    WASTED,
    Rule,
    cheapest_blocks,
    joint_cost,
    loss_outcomes,
    ratio,
    task_outcomes,
    verdict,
    window_outcomes,
)

RULE = Rule(replicates=400)


def windows(costs, noise=0.02, w=30, tokens=100, seed=0):
    """Per-window summed losses whose per-token cost of removing block l is costs[l] (plus noise per window)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(3.0, 4.0, w) * tokens
    removed = base + np.asarray(costs)[:, None] * tokens + rng.normal(0, noise * tokens, (len(costs), w))
    return base, removed, np.full(w, tokens)


def profile(n, early, deep, rest=1.0):
    """N block costs: the early interior's and the deep interior's as given (a list or one value), the rest `rest`."""
    c = np.full(n, rest)
    e = list(range(2, n // 4 + 2))
    d = [l for l in range(1, n - 1) if l > n / 2]
    c[[l - 1 for l in e]] = early
    c[[l - 1 for l in d]] = deep
    return c


def test_cheap_deep_blocks_read_wasted_and_costly_ones_not():
    cheap = verdict(loss_outcomes(*windows(profile(16, 1.0, 0.1))), RULE)
    assert cheap["early"] == [2, 3, 4, 5] and cheap["deep"] == [9, 10, 11, 12, 13, 14]
    assert cheap["ratio"] == pytest.approx(0.1, abs=0.02) and cheap["ci"][1] < 0.5
    assert cheap["word"] == WASTED and cheap["rests_on"] == []
    costly = verdict(loss_outcomes(*windows(profile(16, 1.0, 0.9))), RULE)
    assert costly["ci"][0] > 0.5 and costly["word"] == NOT_WASTED


def test_one_costly_early_block_does_not_decide_the_median_ratio():
    # SmolLM2's shape: block 2 costs far more than the rest of the early interior; a mean ratio would read the deep
    # blocks as cheap (0.25 / 1.8), the medians read them as costly as the early interior
    r = verdict(loss_outcomes(*windows(profile(16, [6.0, 0.3, 0.3, 0.3], 0.3))), RULE)
    assert r["ratio"] == pytest.approx(1.0, abs=0.1) and r["word"] == NOT_WASTED
    assert len(r["leave_one_out"]) == 4 + 6 and r["rests_on"] == []


def test_a_word_one_block_decides_falls_to_inconclusive():
    # N = 12: E = [2, 3, 4] costs 1.0, 0.3, 0.05, D = [7 .. 10] costs 0.2. Median E 0.3: R = 0.67, not wasted. Left
    # out, block 4 makes median E 0.65 (R 0.31, wasted), block 3 makes it 0.525 (R 0.38, wasted); block 2: 0.175
    r = verdict(loss_outcomes(*windows(profile(12, [1.0, 0.3, 0.05], 0.2), noise=0.005)), RULE)
    assert r["ratio"] == pytest.approx(0.2 / 0.3, rel=0.05) and r["ci"][0] > 0.5
    loo = {x["left_out"]: x for x in r["leave_one_out"]}
    assert loo[4]["ratio"] == pytest.approx(0.2 / 0.65, rel=0.05) and loo[4]["word"] == WASTED
    assert loo[3]["word"] == WASTED and loo[2]["word"] == NOT_WASTED
    assert r["rests_on"] == [3, 4] and r["word"] == f"{INCONCLUSIVE} (rests on blocks 3, 4)"
    assert r["leave_one_out_range"]["ratio"][0] == pytest.approx(0.2 / 0.65, rel=0.05)


def test_noise_wider_than_the_gap_is_inconclusive():
    r = verdict(loss_outcomes(*windows(profile(16, 1.0, 0.5), noise=3.0, w=10)), RULE)
    assert r["ci"][0] < 0.5 < r["ci"][1] and r["word"] == INCONCLUSIVE


def test_the_interval_is_at_the_family_level_and_seeded():
    o = loss_outcomes(*windows(profile(16, 1.0, 0.5), noise=0.5))
    a, b = verdict(o, RULE), verdict(o, RULE)
    assert a["ci"] == b["ci"] and a["level"] == pytest.approx(1 - 0.05 / 3)
    narrower = verdict(o, Rule(replicates=400, family_size=1))
    assert narrower["ci"][0] >= a["ci"][0] and narrower["ci"][1] <= a["ci"][1]
    assert a["ci"][0] <= a["ratio"] <= a["ci"][1]


def tasks(n_blocks, base_acc, drop_early, drop_deep, q=300, seed=0):
    """Per-question outcomes: the model right on a share base_acc; removing an early block loses drop_early of
    the questions it got right, a deep block drop_deep of them."""
    rng = np.random.default_rng(seed)
    base = rng.random(q) < base_acc
    c = profile(n_blocks, drop_early, drop_deep, rest=drop_early)
    removed = base & (rng.random((n_blocks, q)) >= c[:, None])
    return base, removed


def test_a_task_reads_its_accuracy_drop_and_needs_the_model_above_chance():
    base, removed = tasks(16, 0.8, 0.5, 0.02)
    r = verdict(task_outcomes("choice", base, removed, chance=0.25), RULE)
    assert r["precondition"]["ok"] and r["word"] == WASTED
    assert r["cost"][1] == pytest.approx(base.mean() - removed[1].mean())
    base, removed = tasks(16, 0.25, 0.5, 0.02)  # at chance: no word, however the removals read
    r = verdict(task_outcomes("choice", base, removed, chance=0.25), RULE)
    assert not r["precondition"]["ok"] and r["word"] == NOT_TESTABLE


def test_generation_needs_thirty_percent():
    base, removed = tasks(16, 0.2, 0.5, 0.02)
    r = verdict(task_outcomes("generation", base, removed, chance=0.0), RULE)
    assert r["precondition"]["above_chance_p"] < 0.05 and r["word"] == NOT_TESTABLE
    base, removed = tasks(16, 0.4, 0.5, 0.02)
    assert verdict(task_outcomes("generation", base, removed, chance=0.0), RULE)["word"] == WASTED


def test_an_early_interior_that_costs_nothing_is_not_testable():
    r = verdict(loss_outcomes(*windows(profile(16, -0.05, 0.5), noise=0.001)), RULE)
    assert r["median_early"] < 0 and r["word"] == NOT_TESTABLE
    assert ratio(np.array([1.0, -1.0, 0.2, 0.3]), [2], [3]) == math.inf


def test_analyze_per_window_sums_read_as_the_raw_losses():
    base, removed, tokens = windows(profile(16, 1.0, 0.1))
    a = verdict(window_outcomes({"count": tokens.tolist(), "single_delta": (removed - base).tolist()}), RULE)
    b = verdict(loss_outcomes(base, removed, tokens), RULE)
    assert a["cost"] == pytest.approx(b["cost"]) and a["ci"] == pytest.approx(b["ci"]) and a["word"] == b["word"]


def test_the_blocks_that_could_go_and_their_joint_cost():
    costs = profile(12, 1.0, [0.3, 0.01, 0.2, 0.02])
    costs[5] = 0.015  # block 6, between the windows
    assert cheapest_blocks(costs, 3) == [8, 6, 10]
    base, removed, tokens = windows([0.25], noise=0.01)
    j = joint_cost(removed[0] - base, tokens, RULE)
    assert j["nats"] == pytest.approx(0.25, abs=0.01) and j["nats_ci"][0] < j["nats"] < j["nats_ci"][1]
    assert j["perplexity_change"] == pytest.approx(math.expm1(j["nats"]))
