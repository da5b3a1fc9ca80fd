"""The analysis's cost made visible and chosen: every phase counts its own plans (or blocks), and the logit lens
reads a seeded subsample of positions unless the exact full lens is asked for."""

from __future__ import annotations

import torch

from depthlab import progress
from depthlab.analysis import analyze as analyze_module
from depthlab.analysis.analyze import Options, analyze, lens_positions, lens_quota
from depthlab.metrics import Accumulator
from tests.test_analysis import tiny_lm
from tests.test_analysis_support import random_batches

QUIET = dict(jacobian=False, removal=False)


@torch.no_grad()
def _old_lens(lm, batches) -> dict:
    """The lens as analyze computed it before it could subsample: every state's logits at every position."""
    acc = Accumulator(lm.n_layers)
    for b in batches:
        tr = lm.trace(b.inputs, b.mask)
        for s, h in enumerate(tr.hidden):
            acc.stream(s, h, b.mask, b.ids)
        final = lm.logits(tr.hidden[-1])
        for s, h in enumerate(tr.hidden):
            acc.lens(s, lm.logits(h), final, b.ids, b.mask)
    return acc.results()["lens"]


def test_the_full_lens_is_the_old_lens_exactly():
    lm, batches = tiny_lm(), random_batches(97, n=3, T=24)
    got = analyze(lm, batches, Options(lens_tokens=None, **QUIET))["lens"]
    assert got == _old_lens(lm, batches) and got["positions"] == 3 * 2 * 24
    # a sample as large as the text is the text: the exact lens too
    assert analyze(lm, batches, Options(lens_tokens=500, **QUIET))["lens"] == got


@torch.no_grad()
def test_the_subsampled_lens_is_the_lens_at_its_positions():
    lm, batches = tiny_lm(), random_batches(97, n=3, T=24)
    opts = Options(lens_tokens=30, **QUIET)
    got = analyze(lm, batches, opts)["lens"]
    quota = lens_quota(batches, opts)
    assert quota == 10 and got["positions"] == 30
    kl, ce, n_ce = torch.zeros(lm.n_layers + 1, dtype=torch.float64), torch.zeros(lm.n_layers + 1), 0
    for k, b in enumerate(batches):
        keep = lens_positions(b.mask, quota, k)
        assert int(keep.sum()) == quota and not (keep & ~b.mask).any()  # real tokens, as many as the quota
        tr = lm.trace(b.inputs, b.mask)
        logq = torch.log_softmax(lm.logits(tr.hidden[-1]), -1)
        scored = keep.clone()
        scored[:, -1] = False  # the last position has no next token
        n_ce += int(scored.sum())
        for s, h in enumerate(tr.hidden):
            logp = torch.log_softmax(lm.logits(h), -1)
            kl[s] += float((logq.exp() * (logq - logp)).sum(-1)[keep].sum())
            nxt = torch.cat([b.ids[:, 1:], b.ids[:, :1]], 1)
            ce[s] += float(-logp.gather(-1, nxt[..., None]).squeeze(-1)[scored].sum())
    assert torch.allclose(torch.tensor(got["kl"], dtype=torch.float64), kl / 30, rtol=1e-5, atol=1e-7)
    assert torch.allclose(torch.tensor(got["ce"]), ce / n_ce, rtol=1e-5)
    assert got["kl"] != _old_lens(lm, batches)["kl"]  # a sample, not the whole
    assert analyze(lm, batches, opts)["lens"] == got  # seeded: the same sample every run


def test_the_subsampled_lens_in_chunks_is_the_lens_at_once(monkeypatch):
    lm, batches = tiny_lm(), random_batches(97, n=3, T=24)
    opts = Options(lens_tokens=30, **QUIET)
    whole = analyze(lm, batches, opts)["lens"]
    monkeypatch.setattr(analyze_module, "LENS_CHUNK", 3)  # 10 positions a batch: 4 chunks
    chunked = analyze(lm, batches, opts)["lens"]
    assert chunked["positions"] == whole["positions"] == 30
    for k in ("kl", "ce"):
        assert torch.allclose(torch.tensor(chunked[k]), torch.tensor(whole[k]), rtol=1e-6, atol=1e-9)


def test_every_phase_counts_its_plans(monkeypatch, capsys):
    monkeypatch.setattr(progress, "START_S", 0.0)  # every phase announces itself at once
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    lm, batches = tiny_lm(), random_batches(97, n=2, T=24)
    analyze(lm, batches, Options(jacobian=False, sublayers=True, linear=True, drop_lowest=1, progress=True),
            fit=random_batches(97, n=1, T=24, seed=1))
    err = capsys.readouterr().err
    plans = 1 + 4 * 4  # the model, and each of 4 blocks removed, its attention, its MLP, its linear map
    assert "analyze: linear fit" in err and "4/4 block, done" in err
    assert "analyze: metrics and removal" in err and f"{2 * plans}/{2 * plans} plan, done" in err
    assert "analyze: removal of runs and of the k least useful" in err
