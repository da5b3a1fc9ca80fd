"""The chunked LM head + cross-entropy: the loss and gradients of the full-logits loss, without the full logits."""

import pytest
import torch
import torch.nn.functional as F

from depthlab.model import Transformer, linear_cross_entropy, lm_loss
from depthlab.model.loss import IGNORE_INDEX
from tests.conftest import tiny_model_config


def _close(a, b, tol=1e-5):
    """Equal within `tol` relative to each element and to the tensor's largest element (fp32 sums in another
    order differ by a few ulps of the largest term)."""
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())


def _grads(fn, *leaves):
    for t in leaves:
        t.grad = None
    loss = fn()
    loss.backward()
    return loss.detach(), [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("chunk", [1, 7, 16, 50])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_matches_full_logits_fp32(chunk, reduction):
    h = torch.randn(3, 17, 24, requires_grad=True)
    w = torch.randn(101, 24, requires_grad=True)
    y = torch.randint(0, 101, (3, 17))
    y[0, :4] = IGNORE_INDEX  # ignored like F.cross_entropy does
    ref, ref_g = _grads(lambda: lm_loss(F.linear(h, w), y, reduction), h, w)
    got, got_g = _grads(lambda: linear_cross_entropy(h, w, y, chunk, reduction), h, w)
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    for a, b in zip(got_g, ref_g, strict=True):
        _close(a, b)
    with torch.no_grad():  # evaluation takes the no-gradient path
        assert linear_cross_entropy(h, w, y, chunk, reduction).item() == pytest.approx(ref.item(), rel=1e-5)


def test_scaled_upstream_gradient_and_single_backward():
    h = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(30, 8, requires_grad=True)
    y = torch.randint(0, 30, (20,))
    ref, ref_g = _grads(lambda: lm_loss(F.linear(h, w), y) / 4, h, w)
    got, got_g = _grads(lambda: linear_cross_entropy(h, w, y, 6) / 4, h, w)  # as with grad_accum = 4
    for a, b in zip(got_g, ref_g, strict=True):
        _close(a, b)
    loss = linear_cross_entropy(h, w, y, 6)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()


def _model_grads(model, idx, y, dtype, chunk):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        loss = model(idx, targets=y, loss_chunk=chunk) if chunk is not None else lm_loss(model(idx), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_model_loss_and_every_gradient_match_the_logits_path(tied, dtype):
    """Transformer(idx, targets=y) against lm_loss(Transformer(idx), y): fp32 at 1e-5, bf16 autocast within bf16
    rounding (the head's matmuls run in bf16 in both); tied embeddings get the head's and the lookup's gradient."""
    model = Transformer(tiny_model_config(norm_scheme="lns", tie_embeddings=tied))
    idx = torch.randint(0, 97, (3, 20))
    y = torch.roll(idx, -1, 1)
    ref_loss, ref = _model_grads(model, idx, y, dtype, None)
    loss, got = _model_grads(model, idx, y, dtype, 16)
    tol = 1e-5 if dtype == "fp32" else 1e-2
    assert loss == pytest.approx(ref_loss, rel=tol)
    assert got.keys() == ref.keys()
    for name in ref:
        _close(got[name], ref[name], tol)
    unchunked, _ = _model_grads(model, idx, y, dtype, 0)
    assert unchunked == ref_loss  # loss_chunk 0: the full logits, today's numbers exactly


def test_forward_still_returns_logits_and_hidden():
    model = Transformer(tiny_model_config())
    idx = torch.randint(0, 97, (2, 10))
    logits, hidden = model(idx, return_hidden=True)
    assert logits.shape == (2, 10, 97) and len(hidden) == 5
    loss, hidden2 = model(idx, return_hidden=True, targets=idx, loss_chunk=4)
    assert loss.shape == () and loss.item() == pytest.approx(lm_loss(logits, idx).item(), rel=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(hidden, hidden2, strict=True))


def test_loss_of_takes_the_chunked_path_only_for_depthlab_models():
    """evaluate's loss: a Transformer (bare or compiled) by chunks, any module returning logits through lm_loss."""
    from depthlab.model import loss_of

    model = Transformer(tiny_model_config())
    idx = torch.randint(0, 97, (2, 12))
    ref = lm_loss(model(idx), idx, "sum")
    calls = []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs.get("loss_chunk")), with_kwargs=True)
    assert loss_of(model, idx, idx, "sum", loss_chunk=5).item() == pytest.approx(ref.item(), rel=1e-5)
    assert calls == [5]

    class Logits(torch.nn.Module):  # an HF model behind hf.load's logits wrapper takes no targets
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(ids)

    assert loss_of(Logits(model), idx, idx, "sum").item() == pytest.approx(ref.item(), rel=1e-6)
    assert isinstance(torch.compile(model)._orig_mod, Transformer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_lean_rmsnorm_matches_autograd(dtype, scale):
    """The norm saves fewer activations; its output is bitwise autograd's reference, its gradients equal within
    rounding (fp32 1e-5; bf16 inputs within bf16 rounding). The SwiGLU MLP's and the projections' Functions:
    tests/test_memory_paths.py."""
    from depthlab.model.parts import RMSNorm

    def reference_norm(x, w):
        xf = x.float()
        out = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        return out if scale == 1.0 else out * scale

    norm = RMSNorm(24, scale=scale)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 24, dtype=dtype, requires_grad=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for fn, ref, leaves in [(lambda: norm(x), lambda: reference_norm(x, norm.weight), (x, norm.weight))]:
        out, ref_out = fn(), ref()
        assert torch.equal(out, ref_out)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, leaves, g)
        want = torch.autograd.grad(ref_out, leaves, g)
        for a, b in zip(got, want, strict=True):
            _close(a.float(), b.float(), tol)
