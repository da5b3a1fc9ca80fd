"""The dry-run memory plan (depthlab.train.plan) against PyTorch's MemTracker (depthlab.memtrack): the figures
`--dry-run --measure` prints, a FakeTensorMode rank against real tensors, checkpointing, the refusals, and the
benchmark's section of the results page."""

import pytest
import torch

from depthlab import UserError
from depthlab.config import Config, apply_overrides
from depthlab.memtrack import measure, measure_plan
from depthlab.model.validate import validate
from depthlab.train.plan import format_plan, memory_plan

TINY = ["model.dim=64", "model.n_layers=2", "model.n_heads=2", "model.ffn_dim=170", "model.vocab_size=512",
        "model.max_seq_len=64", "data.seq_len=64", "train.batch_size=4", "train.dtype=fp32"]


def tiny(*overrides: str) -> Config:
    return validate(apply_overrides(Config(), [*TINY, *overrides]))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _within(plan: dict, measured: dict, keys=("activations", "total"), tol=0.15) -> None:
    for k in keys:
        assert abs(plan[k] / measured[k] - 1) <= tol, (k, plan[k], measured[k])


@pytest.mark.parametrize("overrides", [(), ("train.loss_chunk=64",), ("train.dtype=bf16", "train.grad_accum=2")])
def test_measure_prints_the_tracker_beside_each_estimate(overrides):
    """--dry-run --measure on a small config: every category has its measured figure, and the activations and the
    total agree with the plan within 15% (through the full logits, by chunks, bf16 with two micro-batches)."""
    cfg = tiny(*overrides)
    plan = measure_plan(cfg, memory_plan(cfg, 1))
    measured = plan["measured"]["bytes"]
    assert set(measured) == set(plan["bytes"])
    _within(plan["bytes"], measured)
    assert measured["parameters"] == pytest.approx(plan["bytes"]["parameters"], rel=0.05)  # plus the RoPE tables
    text = format_plan(plan)
    assert "memory per rank (MiB):   estimate   measured" in text and "measured: PyTorch's MemTracker" in text
    act = next(line for line in text.splitlines() if line.strip().startswith("activations")).split()
    assert float(act[-1]) == pytest.approx(measured["activations"] / 2**20, abs=0.01)


def test_dry_run_measure_prints_the_plan_first_then_says_it_measures_with_progress(monkeypatch):
    """The measurement takes minutes for a large model (in silence before): the estimate comes
    first, then a line saying what is measured, then progress lines (here every few milliseconds), then the
    measured table; the layout once. Into a pipe, so the estimate is flushed, not held until the end."""
    import io
    import sys

    from depthlab import progress
    from depthlab.cli import main

    monkeypatch.setattr(progress, "START_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.001)
    both = io.StringIO()  # stdout and stderr in the order they were written
    monkeypatch.setattr(sys, "stdout", both)
    monkeypatch.setattr(sys, "stderr", both)
    assert main(["train", "--dry-run", "--measure", "--no-progress", *(a for o in TINY for a in ("--set", o))]) == 0
    out = both.getvalue()
    order = [out.index("memory per rank (MiB):\n"), out.index("depthlab train: measuring the plan: 2 training steps"),
             out.index("depthlab: measuring the plan: "), out.index("2/2 micro-batches, done"),
             out.index("memory per rank (MiB):   estimate   measured")]
    assert order == sorted(order), out
    assert out.count("layout: ") == 1


@pytest.mark.slow
def test_a_fake_rank_measures_what_real_tensors_do():
    """FakeTensorMode allocates nothing, yet one process under it measures byte for byte what real tensors do;
    a fake rank of 2 under FSDP holds half the parameters and its plan's activations and total."""
    cfg = tiny()
    assert measure(cfg, 1, fake=True) == measure(cfg, 1)
    fsdp = tiny("train.parallel=fsdp")
    rank = measure(fsdp, 2, fake=True)
    plan = memory_plan(fsdp, 2)["bytes"]
    assert rank["optimizer"] == pytest.approx(plan["optimizer"], rel=0.01)  # and the step counts
    assert rank["gathered blocks"] > 0
    _within(plan, rank)


@pytest.mark.slow
def test_a_fake_rank_of_a_preset():
    """The cpu-tiny preset at one rank's shard of 4 under FSDP, FakeTensorMode: the plan within 15%."""
    from depthlab.model.families import preset

    cfg = validate(apply_overrides(preset("cpu-tiny"), ["train.parallel=fsdp", "train.batch_size=8"]))
    _within(memory_plan(cfg, 4)["bytes"], measure(cfg, 4, fake=True), ("parameters", "activations", "total"))


def test_activation_checkpointing_keeps_less_and_as_planned():
    """A checkpointed block is not recomputed during the forward (it was, when the projections read their norm's
    saved tensors through the checkpoint's unpack hook): it keeps less than no checkpointing, as planned."""
    cfg = tiny("model.n_layers=4")
    ac = tiny("model.n_layers=4", "train.activation_checkpointing=true")
    assert measure(ac)["activations"] < measure(cfg)["activations"]
    _within(memory_plan(ac, 1)["bytes"], measure(ac))


def test_measure_refuses_ranks_a_vit_and_a_plan_beyond_the_host():
    with pytest.raises(UserError, match="--measure runs one process, not 2 ranks"):
        measure_plan(tiny(), memory_plan(tiny(), 2))
    vit = validate(apply_overrides(Config(), ["model.family=vit", "model.norm_scheme=pre"]))
    with pytest.raises(UserError, match="takes a language model"):
        measure(vit)
    big = tiny("model.vocab_size=2000000", "model.dim=4096", "model.n_heads=32")
    with pytest.raises(UserError, match="more than half of its"):
        measure_plan(big, memory_plan(big, 1))


def test_the_results_page_section(tmp_path):
    """memory_plan_lines: nothing before a run; after one, the table, the largest errors and the command."""
    from benchmarks import memory_plan as bench
    from depthlab.study.page.systems import memory_plan_lines
    from depthlab.study.page.text import load

    assert memory_plan_lines(load(tmp_path / "none.json")) == []
    out = tmp_path / "memory_plan.json"
    muon = next(i for i, row in enumerate(bench.LADDER) if "train.optimizer=muon" in row[3])
    bench.main(["--rows", "0", str(muon), "--out", str(out)])
    lines = memory_plan_lines(load(out))
    assert lines[0] == "## Memory: the dry-run plan against a tracker"
    assert any(line.startswith("| config | ") and line.endswith(" | Muon step | total |") for line in lines)
    adamw = next(line for line in lines if line.startswith("| 64 x 2, 4 x 64 | 1 | off | real |"))
    assert " |  | " in adamw  # no Muon step
    assert any(line.startswith("| 128 x 4, 8 x 128, Muon | 1 | off | real |") for line in lines)
    assert any("Largest |estimate / measured - 1|" in line and "`python -m benchmarks.memory_plan`" in line
               for line in lines)


def test_the_measured_step_is_the_trainers():
    """memtrack measures the trainer's own forward and backward (depthlab.train.trainer.backward_steps, which
    Trainer.train_step takes its step with), not a copy of them: no forward, backward, autocast or gradient sync
    of its own is left in memtrack."""
    import inspect

    from depthlab import memtrack

    source = inspect.getsource(memtrack)
    assert "backward_steps(" in source
    assert not any(own in source for own in (".backward()", "grad_sync", "autocast(", "loss_chunk=tc"))


def test_a_fake_rank_is_sharded_by_the_trainers_own_layout():
    """memtrack's fake rank shards the model with depthlab.train.distributed.shard_model, the function
    build_parallel shards a real run with, not a copy of its layout kept beside it."""
    import inspect

    from depthlab import memtrack
    from depthlab.train import distributed

    assert "shard_model(" in inspect.getsource(distributed.build_parallel)
    source = inspect.getsource(memtrack)
    assert "shard_model(" in source and "fully_shard(" not in source and "MixedPrecisionPolicy" not in source
