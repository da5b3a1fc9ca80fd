"""benchmarks/gpu_day_one.py on the CPU at toy sizes (--tiny): every part runs and records its result, and a part
that fails is recorded while the rest go on."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_every_part_runs_on_cpu_tiny(tmp_path):
    pytest.importorskip("transformers")
    from benchmarks import gpu_day_one

    summary = gpu_day_one.main(["--tiny", "--out", str(tmp_path)])
    parts = summary["parts"]
    assert list(parts) == list(gpu_day_one.PARTS)
    assert {k: v.get("error") for k, v in parts.items() if v["status"] != "ok"} == {}
    assert json.loads((tmp_path / "summary.json").read_text())["parts"].keys() == parts.keys()
    rows = parts["throughput"]["result"]["rows"]
    assert [r["contender"] for r in rows] == ["depthlab", "hf"] and all(r["tokens_per_s"] > 0 for r in rows)
    memory = parts["memory"]["result"]
    assert memory["estimate_bytes"]["total"] > 0 and memory["measured_peak_bytes"] is None  # no CUDA allocator
    fsdp = parts["fsdp_resume"]["result"]
    assert fsdp["sharded"] and len(fsdp["resumed_losses"]) == gpu_day_one.TINY["resume_steps"]
    assert parts["golden"]["result"]["cases"] == ["lns"]
    assert {c["variant"] for c in parts["lns_study"]["result"]["cells"]} == {"pre", "lns"}


def test_a_failing_part_is_recorded_and_the_rest_go_on(tmp_path, monkeypatch):
    from benchmarks import gpu_day_one

    def broken(s, out, work):
        raise RuntimeError("no such device")

    monkeypatch.setitem(gpu_day_one.PARTS, "memory", broken)
    summary = gpu_day_one.main(["--tiny", "--out", str(tmp_path), "--parts", "memory", "golden"])
    assert summary["parts"]["memory"]["status"] == "failed"
    assert summary["parts"]["memory"]["error"] == "RuntimeError: no such device"
    assert summary["parts"]["golden"]["status"] == "ok"
