"""The LLaMA block's memory-lean autograd Functions (depthlab.model.parts): the projections of one input
(`project`, _Project) and the SwiGLU down projection that recomputes its product (_SwiGLUDown). Their outputs are
bitwise plain autograd's, their gradients equal within 1e-5, in fp32 and under bf16 autocast; and they keep for
backward only what the docstrings say."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from depthlab.memtrack import saved_for_backward
from depthlab.model.parts import MLP, RMSNorm, _SwiGLUDown, project
from tests.conftest import tiny_model_config

DTYPES = ["fp32", "bf16"]


class _SiluMulFp32Grad(torch.autograd.Function):
    """Autograd's silu(gate) * up with its gradient formed in fp32 (as depthlab's has been since its lean SwiGLU):
    the reference that, under bf16, differs from depthlab's paths only by the order of fp32 sums."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        g, x, u = grad.float(), gate.float(), up.float()
        sig = torch.sigmoid(x)
        return (g * u * sig * (1 + x * (1 - sig))).to(gate.dtype), (g * x * sig).to(up.dtype)


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * b.float().abs().max().item())


def _forward_backward(fn, leaves, dtype, seed=0):
    """fn()'s outputs (under bf16 autocast for dtype bf16) and the gradients of the leaves for random output
    gradients (the same for every call with the same seed)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        outs = fn()
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    return outs, torch.autograd.grad(outs, leaves, grads)


def _check(got, want, tol=1e-5):
    (outs, grads), (ref_outs, ref_grads) = got, want
    for a, b in zip(outs, ref_outs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.dtype == b.dtype
        _close(a, b, tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("from_norm", [False, True])
def test_project_matches_autograd(dtype, bias, from_norm):
    """q, k, v of one input (of an RMSNorm's output: the input is then recomputed in backward from the norm's)."""
    torch.manual_seed(0)
    linears = [nn.Linear(24, n, bias=bias) for n in (16, 8, 8)]
    norm = RMSNorm(24, scale=0.5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 24, requires_grad=True)
    leaves = [x, *(p for lin in linears for p in lin.parameters())] + ([norm.weight] if from_norm else [])

    def inp():  # not x itself: autocast caches its casts of leaves (one bf16 copy, gradients summed in bf16)
        return norm(x) if from_norm else x.clone()

    got = _forward_backward(lambda: project(inp(), *linears), leaves, dtype)
    want = _forward_backward(lambda: tuple(lin(h) for h in [inp()] for lin in linears), leaves, dtype)
    _check(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_down_matches_autograd(dtype):
    """down(silu(gate) * up) with a bias, on bf16 or fp32 inputs (weight and bias cast to their dtype)."""
    torch.manual_seed(1)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    gate, up = (torch.randn(3, 4, 40).to(dt).requires_grad_() for _ in range(2))
    down = nn.Linear(40, 24)
    leaves = [gate, up, down.weight, down.bias]

    def reference(silu_mul):
        return lambda: F.linear(silu_mul(gate, up), down.weight.to(dt), down.bias.to(dt))

    got = _forward_backward(lambda: _SwiGLUDown.apply(gate, up, down.weight, down.bias), leaves, "fp32")
    _check(got, _forward_backward(reference(_SiluMulFp32Grad.apply), leaves, "fp32"))
    # plain autograd: in bf16 it forms gate's and up's gradients in bf16 arithmetic
    plain = _forward_backward(reference(lambda a, b: F.silu(a) * b), leaves, "fp32")
    _check(got, plain, 1e-5 if dtype == "fp32" else 1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_mlp_matches_autograd(dtype, scale):
    """Norm + the whole SwiGLU MLP against nn.Linear's and autocast's plain autograd."""
    torch.manual_seed(2)
    cfg = tiny_model_config()
    mlp, norm = MLP(cfg), RMSNorm(cfg.dim, scale=scale)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 6, cfg.dim, requires_grad=True)
    leaves = [x, norm.weight, *mlp.parameters()]

    def reference(silu_mul):
        def run():
            h = norm(x)
            return mlp.down_proj(silu_mul(mlp.gate_proj(h), mlp.up_proj(h)))
        return run

    got = _forward_backward(lambda: mlp(norm(x)), leaves, dtype)
    _check(got, _forward_backward(reference(_SiluMulFp32Grad.apply), leaves, dtype))
    plain = _forward_backward(reference(lambda a, b: F.silu(a) * b), leaves, dtype)
    _check(got, plain, 1e-5 if dtype == "fp32" else 2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_and_mlp_save_input_rstd_gate_up(dtype):
    """Norm + SwiGLU MLP keep the norm's input and 1/rms, gate and up: not the normalised input, nor its
    low-precision copies, nor silu(gate) * up, nor low-precision copies of the weights."""
    cfg = tiny_model_config()
    mlp, norm = MLP(cfg), RMSNorm(cfg.dim)
    B, T = 2, 8
    x = torch.randn(B, T, cfg.dim, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        saved = saved_for_backward(nn.ModuleList([mlp, norm]), lambda: mlp(norm(x)))[0]
    act = 2 if dtype == "bf16" else 4
    assert saved == B * T * (cfg.dim * 4 + 4 + 2 * cfg.ffn_dim * act)


@pytest.mark.slow
def test_step_time_against_a_commit(monkeypatch):
    """benchmarks.memory --time-against: this tree's training step and a commit's, each in its own worker."""
    from benchmarks import memory
    from depthlab.study.page.systems import memory_table

    monkeypatch.setitem(memory.CASES, "tiny", dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, ffn_dim=64,
                                                   max_seq_len=16))
    r = memory.step_time_against("HEAD", "tiny", "fp32", batch=2, seq=16, reps=2, device="cpu")
    assert len(r["step_s"]["here"]) == len(r["step_s"]["ref"]) == 2 and r["ratio_here_over_ref"]["median"] > 0
    assert r["max_loss_difference"] < 1e-4  # the same model, data and step: the same losses within rounding
    assert "over depthlab at" in "\n".join(memory_table({**_result_stub(), "step_time_against": [r]}))


def _result_stub() -> dict:
    return {"batch": 2, "seq_len": 16, "device": "cpu", "env": {}, "loss_chunk": 1024, "rows": [], "ratios": {},
            "step_time": [], "argv": [], "wall_s": 1.0}
