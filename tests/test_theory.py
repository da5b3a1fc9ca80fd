"""The variance recursion against the paper's bounds and the closed forms it has."""

import numpy as np
import pytest

from depthlab.theory import iterate, simulate


def test_pre_ln_between_its_bounds_and_above_lns():
    sim = simulate(1000)
    assert np.all(sim.pre >= sim.pre_lower - 1e-9)
    assert np.all(sim.pre <= sim.pre_upper)
    assert np.all(sim.lns <= sim.pre) and sim.pre[-1] > 100 * sim.lns[-1]
    assert np.all(sim.lns <= sim.lns_upper)


def test_growth_exponents_polynomial_not_exponential():
    sim = simulate(1000)
    assert sim.growth_exponent("pre") == pytest.approx(2.0, abs=0.05)  # sigma grows ~ c/2 a block: L^2 / 4
    assert sim.growth_exponent("lns") == pytest.approx(1.0, abs=0.05)
    assert sim.pre[-1] == pytest.approx(1000 ** 2 / 4, rel=0.05)


def test_closed_forms():
    # with c = sigma0 = 1, sigma_l = sqrt(l) solves the LNS recursion exactly: l + sqrt(l)/sqrt(l) = l + 1
    assert np.allclose(iterate(50, 1.0, 1.0, 0.5), np.arange(1, 51))
    # no update, no growth
    assert np.all(iterate(20, 0.0, 2.0, None) == 4.0)
    # the first step of Pre-LN: sigma0^2 (1 + c / sigma0)
    assert iterate(2, 0.5, 2.0, None)[1] == pytest.approx(4 * 1.25)
