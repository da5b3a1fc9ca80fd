"""The CPU's measured matmul peak that MFU divides by: time the process is not scheduled does not count, and a log
line never shows an MFU over 100% as fact."""

from __future__ import annotations

import time

import pytest
import torch

from depthlab.train.flops import Meter, measured_matmul_peak


@pytest.fixture
def fresh_peak():
    measured_matmul_peak.cache_clear()
    yield lambda: measured_matmul_peak("cpu", "fp32", n=256, seconds=0.1)
    measured_matmul_peak.cache_clear()


def test_descheduled_time_does_not_lower_the_measured_peak(fresh_peak, monkeypatch):
    """Each matmul followed by a sleep as long as itself (the process off the CPU half the time): the wall clock
    would halve the peak; the CPU-time clock keeps it."""
    undisturbed = fresh_peak()
    matmul = torch.Tensor.__matmul__

    def descheduled(a, b):
        start = time.perf_counter()
        out = matmul(a, b)
        time.sleep(time.perf_counter() - start)
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", descheduled)
    measured_matmul_peak.cache_clear()
    assert fresh_peak() > 0.7 * undisturbed


def test_mfu_over_100_percent_is_flagged():
    record = {"loss": 3.0, "lr": 1e-3, "tokens_per_s": 11430.0}
    assert Meter.summary({**record, "mfu": 0.312}).endswith("mfu 31.2%")
    assert Meter.summary({**record, "mfu": 12.185}).endswith("mfu 1218.5% (peak suspect)")
