"""The one decision rule (depthlab.study.verdicts): words from t-intervals, TOST and Holm checked against the
statistics libraries on known cases."""

import math

import pytest
from scipy import stats as st

from depthlab import stats
from depthlab.study import verdicts


def test_two_seeds_that_beat_two_standard_errors_but_whose_t_interval_holds_zero_are_inconclusive():
    d = [-0.010, -0.004]  # |d1 + d2| / 2 = 0.007 > |d1 - d2| = 0.006: the old rule said "lower"
    assert abs(sum(d)) / 2 > abs(d[0] - d[1])
    c = verdicts.compare(d)
    assert c["ci"][0] < 0 < c["ci"][1] and c["verdict"] == "inconclusive"
    half = st.t.ppf(0.975, df=1) * st.tstd(d) / math.sqrt(2)  # df = n - 1
    assert c["ci"] == pytest.approx([-0.007 - half, -0.007 + half]) and c["p"] == pytest.approx(
        st.ttest_1samp(d, 0).pvalue)
    assert verdicts.claim(c, "lower") == "not reproduced"


def test_words_follow_the_interval_and_the_seed_count():
    assert verdicts.compare([-0.10, -0.11, -0.09])["verdict"] == "lower"
    assert verdicts.compare([0.10, 0.12, 0.11])["verdict"] == "higher"
    one = verdicts.compare([-0.2])
    assert one["verdict"] == "one seed: no verdict" and math.isnan(one["ci"][0])
    assert verdicts.claim(one, "lower") == "one seed: no verdict"
    assert verdicts.claim(verdicts.compare([-0.1, -0.1001, -0.0999]), "lower") == "supported"
    assert verdicts.claim(verdicts.compare([0.1, 0.1001, 0.0999]), "lower") == "contradicted"
    assert verdicts.claim(verdicts.compare([0.1, 0.1001]), "lower") == "not reproduced"  # two seeds never contradict
    assert verdicts.claim(verdicts.compare([-0.1, -0.1001, -0.0999]), "lower", "absent") == "not testable"
    assert verdicts.claim(verdicts.compare([-0.1, -0.1001, -0.0999]), "lower", "unreadable") == "not testable"
    assert verdicts.precondition(0.74, 1.2, 9) == "present" and verdicts.precondition(0.0, 0.9, 9) == "absent"
    assert verdicts.precondition(1.0, 0.1, 3) == "unreadable" and verdicts.precondition(None, None) == "unknown"


def test_pooling_concatenates_the_pairs_of_every_depth():
    p = verdicts.pooled([verdicts.compare([-0.02, -0.03]), verdicts.compare([-0.05, -0.04, -0.045])])
    assert p["n"] == 5 and p["groups"] == 2 and p["verdict"] == "lower"
    assert p["p"] == pytest.approx(st.ttest_1samp([-0.02, -0.03, -0.05, -0.04, -0.045], 0).pvalue)


def test_tost_matches_scipys_one_sided_tests():
    d = [0.002, -0.003, 0.001, 0.004, -0.001]
    t = stats.tost(d, 0.01)
    assert t["p_lower"] == pytest.approx(st.ttest_1samp(d, -0.01, alternative="greater").pvalue)
    assert t["p_upper"] == pytest.approx(st.ttest_1samp(d, 0.01, alternative="less").pvalue)
    assert t["p"] == max(t["p_lower"], t["p_upper"]) < 0.05
    ci = st.ttest_1samp(d, 0).confidence_interval(0.90)  # TOST at 5% <=> the 90% interval inside the margin
    assert t["ci"] == pytest.approx([ci.low, ci.high]) and -0.01 < t["ci"][0] < t["ci"][1] < 0.01
    assert t["mean"] == pytest.approx(sum(d) / len(d))
    assert verdicts.equivalent(d, 0.01, declared=True)["verdict"] == "equivalent"
    assert verdicts.equivalent([0.002, 0.03], 0.01, declared=True)["verdict"] == "not shown equivalent"
    assert verdicts.equivalent([0.002], 0.01)["verdict"] == "one seed: no verdict"
    assert verdicts.equivalent([], 0.01)["verdict"] == "no runs"


def test_holm_on_a_known_case_and_inside_a_family():
    # sorted p 0.01, 0.02, 0.04 times 3, 2, 1 -> 0.03, 0.04, 0.04 (monotone), in the input order
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, math.nan])[1] != stats.holm([0.5, math.nan])[1]  # nan stays out of the family
    weak = verdicts.compare([-0.1, -0.2, -0.12])  # p = 0.045 alone: "lower"; twice in a family: 0.09 each
    rows = verdicts.family([{"comparison": weak, "predicted": "lower", "condition": cond}
                            for cond in ("present", "present", "absent")])
    assert [r["word"] for r in rows] == ["not reproduced", "not reproduced", "not testable"]
    assert weak["verdict"] == "lower" and rows[1]["p_holm"] == pytest.approx(2 * weak["p"])
    assert math.isnan(rows[2]["p_holm"])


def test_divergence_is_the_papers_a_run_left_at_the_unigram_loss_where_pre_ln_trains():
    pre = {1e-3: 2.7, 4e-3: 2.45, 8e-3: 2.44, 1.6e-2: 6.2}
    r = verdicts.less_stable({1e-3: 2.71, 4e-3: 6.18, 8e-3: 6.19, 1.6e-2: math.inf}, pre, 6.21)
    assert r["rates"] == [1e-3, 4e-3, 8e-3] and r["diverged"] == [4e-3, 8e-3] and r["word"] == "supported"
    assert r["ci"] == pytest.approx(list(st.binomtest(2, 3).proportion_ci(0.95, "exact")))
    assert verdicts.less_stable({1e-3: 2.8, 4e-3: 2.9}, pre, 6.21)["word"] == "not reproduced"
    assert verdicts.less_stable({1.6e-2: 9.0}, pre, 6.21)["word"] == "not testable"  # pre diverged there too


def _scipy_ci(xs):
    ci = st.ttest_1samp(xs, 0).confidence_interval(0.95)  # df = n - 1
    return [ci.low, ci.high]


def test_the_curse_index_across_seeds_reads_its_t_intervals_against_the_thresholds():
    below, above, holding = [0.30, 0.36, 0.33], [0.90, 1.10, 1.00], [0.35, 0.70]
    for ratios in (below, above, holding):
        r = verdicts.curse_reading(ratios, [0.0] * len(ratios), interior=9)
        assert r["n"] == len(ratios) and r["ratio"]["ci"] == pytest.approx(_scipy_ci(ratios))
        assert r["ratio"]["mean"] == pytest.approx(sum(ratios) / len(ratios))
    lo, hi = _scipy_ci(below)
    assert hi < verdicts.CURSE_RATIO and verdicts.curse_reading(below, [0.0] * 3, 9)["word"] == "present"
    assert _scipy_ci(above)[0] >= verdicts.CURSE_RATIO
    assert verdicts.curse_reading(above, [0.0] * 3, 9)["word"] == "absent"
    assert verdicts.curse_reading(above, [], 9)["word"] == "absent"  # a criterion no seed measured is left out
    lo, hi = _scipy_ci(holding)
    assert lo < verdicts.CURSE_RATIO < hi and min(holding) < 0.5 < max(holding)
    assert verdicts.curse_reading(holding, [0.0, 0.0], 9)["word"] == "inconclusive"
    # the mean alone would have read "absent" (0.525 >= 0.5): the interval says the seeds do not decide
    assert verdicts.precondition(0.0, sum(holding) / 2, 9) == "absent"


def test_the_inert_fraction_reads_through_its_own_interval_and_either_criterion_makes_present():
    ratios = [0.90, 1.10, 1.00]  # the ratio alone reads absent
    inert_high, inert_holding = [0.50, 0.55, 0.45], [0.10, 0.60, 0.30]
    assert _scipy_ci(inert_high)[0] >= verdicts.PRESENT
    r = verdicts.curse_reading(ratios, inert_high, 9)
    assert r["word"] == "present" and r["by"] == ["inert"] and r["inert"]["ci"] == pytest.approx(_scipy_ci(inert_high))
    lo, hi = _scipy_ci(inert_holding)
    assert lo < verdicts.PRESENT < hi
    r = verdicts.curse_reading(ratios, inert_holding, 9)
    assert r["word"] == "inconclusive" and r["ratio"]["side"] == "absent" and r["by"] == ["inert"]
    assert verdicts.curse_reading([0.30, 0.36, 0.33], inert_holding, 9)["word"] == "present"  # the ratio decides
    # seeds that agree exactly: the interval is the point, and the cell reads as one run does (>= 1/3 is present)
    assert verdicts.curse_reading([0.6, 0.6], [1 / 3, 1 / 3], 9)["word"] == verdicts.precondition(1 / 3, 0.6, 9)


def test_one_seed_gives_its_reading_and_no_interval_and_small_interiors_stay_unreadable():
    r = verdicts.curse_reading([0.3], [0.0], 9)
    assert r["word"] == "one seed: no interval" and r["single"] == "present" and r["ratio"]["ci"] is None
    assert verdicts.curse_word(r) == "present, one seed: no interval"
    assert "no interval" in verdicts.curse_said(r) and "*present*" not in verdicts.curse_said(r)
    assert verdicts.curse_reading([0.9], [0.0], 9)["single"] == "absent"
    assert verdicts.curse_reading([0.1, 0.12], [1.0, 1.0], 3)["word"] == "unreadable"
    assert verdicts.curse_reading([], [], 9)["word"] == "unknown"
    # the claim it gates: only "present" makes it testable; one seed on both sides is no verdict
    c = verdicts.compare([-0.1, -0.1001, -0.0999])
    assert [verdicts.claim(c, "lower", w) for w in ("present", "inconclusive", "absent")] == [
        "supported", "not testable", "not testable"]
    assert verdicts.claim(verdicts.compare([-0.1]), "lower", r["word"]) == "one seed: no verdict"


def test_the_curse_said_names_the_interval_its_word_rests_on():
    r = verdicts.curse_reading([0.30, 0.36, 0.33], [0.0] * 3, 9)
    lo, hi = _scipy_ci([0.30, 0.36, 0.33])
    assert verdicts.curse_said(r) == f"deep/shallow removal ratio 0.33 [{lo:.2f}, {hi:.2f}] < 0.5, n = 3: *present*"
    assert verdicts.ci_cell(r["ratio"]) == f"0.33 [{lo:.2f}, {hi:.2f}]"
    absent = verdicts.curse_said(verdicts.curse_reading([0.90, 1.10, 1.00], [0.0] * 3, 9))
    assert "ratio 1.00 [" in absent and "≥ 0.5" in absent and "inert fraction 0.00 [0.00, 0.00] < 0.33" in absent
    assert absent.endswith("n = 3: *absent*")
