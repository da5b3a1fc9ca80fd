"""Each scheme puts its norms where docs/method.md section 2 says: every registered scheme's block checked against
its hand-written oracle (tests/scheme_oracles.py)."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from depthlab import UserError
from depthlab.model import SCHEMES, Transformer, lm_loss
from depthlab.model.init import INITS
from depthlab.model.parts import DyT, RMSNorm
from depthlab.model.schemes import deepnorm_alpha, deepnorm_beta
from tests.conftest import tiny_model_config
from tests.scheme_oracles import ORACLES, Parts


def block_io(model, layer_id):
    """A random residual-stream input for block `layer_id` (1-based), the block and the RoPE tables."""
    T = 9
    h = torch.randn(2, T, model.cfg.dim)
    return h, model.layers[layer_id - 1], (model.rope_cos[:T], model.rope_sin[:T])


def rms(x, w, eps=1e-6):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("p", [0.5, 1.0])
def test_lns_scales_norm_outputs_by_l_to_minus_p(p):
    pre = Transformer(tiny_model_config(norm_scheme="pre", n_layers=5))
    lns = Transformer(tiny_model_config(norm_scheme="lns", n_layers=5, lns_power=p))
    for w in pre.parameters():
        if w.dim() == 1:
            w.data.uniform_(0.5, 1.5)
    lns.load_state_dict(pre.state_dict())
    x = torch.randn(2, 7, 32)
    for l in range(1, 6):
        for name in ("attn_norm", "mlp_norm"):
            ours = lns.layers[l - 1].get_submodule(name)(x)
            ref = pre.layers[l - 1].get_submodule(name)(x)
            assert torch.allclose(ours, ref * l ** -p, atol=1e-6)
    assert torch.equal(lns.norm(x), pre.norm(x))  # the final norm is never scaled
    assert lns.layers[0].attn_norm.scale == 1.0  # l counts from 1: the first block is unscaled
    # and the block uses the scaled norms: h + attn(s * norm(h)), then + mlp(s * norm(.))
    h, blk, rope = block_io(lns, 4)
    s = 4 ** -p
    h1 = h + blk.attn(s * rms(h, blk.attn_norm.weight), rope)
    ref = h1 + blk.mlp(s * rms(h1, blk.mlp_norm.weight))
    assert torch.allclose(blk(h, rope), ref, atol=1e-5)


def parts(blk, rope, cfg, l):
    """Block l of a LLaMA model as the oracles see it (tests/scheme_oracles.py)."""
    return Parts(blk, lambda x: blk.attn(x, rope), blk.mlp, l, cfg)


def test_every_registered_scheme_has_an_oracle():
    assert set(ORACLES) == set(SCHEMES)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_block_matches_reference_formula(scheme):
    cfg = tiny_model_config(norm_scheme=scheme, skip_alpha_init=0.3, layerscale_init=0.2)
    model = Transformer(cfg)
    for w in model.parameters():
        if w.dim() == 1:  # make norm weights and gains non-trivial
            w.data.uniform_(0.5, 1.5)
    h, blk, rope = block_io(model, 3)
    want = ORACLES[scheme].block(h, parts(blk, rope, cfg, 3))
    assert torch.allclose(blk(h, rope), want, atol=1e-5)
    if scheme == "rezero":
        assert not any(isinstance(m, (RMSNorm, DyT)) for m in blk.modules())
    if scheme == "dyt":
        assert isinstance(model.norm, DyT) and isinstance(blk.attn_norm, DyT)


def test_peri_normalises_the_embedding_and_others_do_not():
    idx = torch.randint(0, 97, (2, 8))
    peri = Transformer(tiny_model_config(norm_scheme="peri"))
    _, hidden = peri(idx, return_hidden=True)
    assert torch.allclose(hidden[0], peri.embed_norm(peri.embed_tokens(idx)))
    assert torch.allclose(hidden[0].pow(2).mean(-1), torch.ones(2, 8), atol=1e-2)  # eps vs rms 0.02
    sandwich = Transformer(tiny_model_config(norm_scheme="sandwich"))
    _, hidden = sandwich(idx, return_hidden=True)
    assert torch.equal(hidden[0], sandwich.embed_tokens(idx))


@pytest.mark.parametrize("n_layers,ratio,n_post", [(8, 0.25, 2), (12, 0.25, 3), (10, 0.25, 2), (6, 0.5, 3), (4, 0, 0)])
def test_mixln_first_floor_rN_blocks_are_post_ln(n_layers, ratio, n_post):
    cfg = tiny_model_config(norm_scheme="mixln", n_layers=n_layers, mixln_ratio=ratio)
    model = Transformer(cfg)
    assert [blk.is_post for blk in model.layers] == [l <= n_post for l in range(1, n_layers + 1)]
    for l in range(1, n_layers + 1):
        h, blk, rope = block_io(model, l)
        ref = ORACLES["post" if l <= n_post else "pre"].block(h, parts(blk, rope, cfg, l))
        assert torch.allclose(blk(h, rope), ref, atol=1e-5)


@pytest.mark.parametrize("n", [1, 6, 12, 24, 32, 48, 100])
def test_deepnorm_constants(n):
    assert deepnorm_alpha(n) == pytest.approx((2 * n) ** 0.25)
    assert deepnorm_beta(n) == pytest.approx((8 * n) ** -0.25)
    assert deepnorm_beta(n) <= 1  # the reference code had the exponent's sign inverted
    if n <= 12:  # the blocks use the depth's alpha on both residual adds
        model = Transformer(tiny_model_config(norm_scheme="deepnorm", n_layers=n))
        assert all(blk.attn_add.alpha == blk.mlp_add.alpha == pytest.approx((2 * n) ** 0.25) for blk in model.layers)


def test_deepnorm_init_gains():
    n = 12
    cfg = tiny_model_config(norm_scheme="deepnorm", n_layers=n, dim=256, n_heads=4, ffn_dim=512)
    model = Transformer(cfg)
    xavier = lambda lin, gain: gain * math.sqrt(2 / sum(lin.weight.shape))  # noqa: E731
    beta = (8 * n) ** -0.25
    blk = model.layers[5]
    for lin, gain in [(blk.attn.q_proj, 1.0), (blk.attn.k_proj, 1.0), (blk.attn.v_proj, beta),
                      (blk.attn.o_proj, beta), (blk.mlp.gate_proj, beta), (blk.mlp.down_proj, beta)]:
        assert lin.weight.std().item() == pytest.approx(xavier(lin, gain), rel=0.05)


@pytest.mark.parametrize("init,expect", [("normal", lambda l, n: 0.02),
                                         ("scaled", lambda l, n: 0.02 / math.sqrt(2 * n)),
                                         ("depth_scaled", lambda l, n: 0.02 / math.sqrt(2 * l))])
def test_init_methods_output_projection_std(init, expect):
    n = 6
    model = Transformer(tiny_model_config(norm_scheme="pre", n_layers=n, dim=256, ffn_dim=512, init=init,
                                          embed_std=0.632))
    for l, blk in enumerate(model.layers, start=1):
        for lin in (blk.attn.o_proj, blk.mlp.down_proj):
            assert lin.weight.std().item() == pytest.approx(expect(l, n), rel=0.05)
        assert blk.attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.embed_tokens.weight.std().item() == pytest.approx(0.632, rel=0.05)


def test_lns_with_scaled_init_warns_once_and_lns_alone_does_not():
    with pytest.warns(UserWarning, match="measured worse"):
        Transformer(tiny_model_config(norm_scheme="lns", init="scaled"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Transformer(tiny_model_config(norm_scheme="lns"))


def test_variance_grows_much_faster_under_pre_than_lns_at_init():
    growth = {}
    idx = torch.randint(0, 97, (4, 32))
    for scheme in ("pre", "lns"):
        torch.manual_seed(0)
        model = Transformer(tiny_model_config(norm_scheme=scheme, n_layers=48, dim=64, ffn_dim=172))
        with torch.no_grad():
            _, hidden = model(idx, return_hidden=True)
        var = torch.stack([h.var() for h in hidden])
        assert torch.all(var[1:] >= var[:-1] * 0.95)  # the stream's variance (roughly) only accumulates
        growth[scheme] = (var[48] / var[1]).item()
    # Measured: pre about 40x from block 1 to 48, lns about 3x (updates damped by 1/sqrt(l)).
    assert growth["pre"] > 5 * growth["lns"], growth


@pytest.mark.parametrize("scheme,gpas", [(s, False) for s in SCHEMES] + [("pre", True), ("lns", True)])
def test_every_parameter_gets_a_gradient(scheme, gpas):
    # skipinit / rezero start at alpha = 0 by default, where branch weights get exactly zero gradient at step 0
    # (inherent to the method); the paper's table uses 1/sqrt(L), used here.
    cfg = tiny_model_config(norm_scheme=scheme, gpas=gpas, skip_alpha_init=0.5)
    model = Transformer(cfg)
    idx = torch.randint(0, 97, (2, 12))
    lm_loss(model(idx[:, :-1]), idx[:, 1:]).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{scheme}: {name} got a zero gradient"


def test_skipinit_alpha_learns_from_zero():
    model = Transformer(tiny_model_config(norm_scheme="skipinit"))
    idx = torch.randint(0, 97, (2, 12))
    lm_loss(model(idx[:, :-1]), idx[:, 1:]).backward()
    assert all(blk.attn_gain.grad.abs() > 0 for blk in model.layers)


def test_gpas_scales_forward_but_not_gradient():
    model = Transformer(tiny_model_config(norm_scheme="lns", gpas=True))
    add = model.layers[1].attn_add
    add.gate.data.fill_(1.5)
    h = torch.randn(3, 32, requires_grad=True)
    u = torch.randn(3, 32)
    out = add(h, u)
    assert torch.allclose(out, (1 - F.silu(torch.tensor(1.5))) * (h + u))
    out.sum().backward()
    assert torch.allclose(h.grad, torch.ones_like(h))  # the stop-gradient passes it unscaled


def test_gpas_shares_one_gate_per_block_by_default(tmp_path):
    cfg = tiny_model_config(norm_scheme="lns", gpas=True)
    model = Transformer(cfg)
    gates = [name for name, _ in model.named_parameters() if name.endswith("gpas.gate")]
    assert gates == [f"layers.{i}.gpas.gate" for i in range(cfg.n_layers)]  # one per block, registered once
    blk = model.layers[2]
    assert blk.attn_add.gate is blk.mlp_add.gate is blk.gpas.gate
    from safetensors.torch import save_file  # refuses two entries sharing storage

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))


def test_shared_gpas_block_matches_hand_written_formula():
    model = Transformer(tiny_model_config(norm_scheme="lns", gpas=True))
    for w in model.parameters():
        if w.dim() == 1:
            w.data.uniform_(0.5, 1.5)
    h, blk, rope = block_io(model, 3)
    blk.gpas.gate.data.fill_(0.7)
    s, g = 3 ** -0.5, 1 - F.silu(torch.tensor(0.7))  # the LNS scale and the shared GPAS factor
    h1 = g * (h + blk.attn(s * rms(h, blk.attn_norm.weight), rope))
    ref = g * (h1 + blk.mlp(s * rms(h1, blk.mlp_norm.weight)))
    assert torch.allclose(blk(h, rope), ref, atol=1e-5)
    # the gate's gradient collects both adds' contributions
    blk(h, rope).sum().backward()
    assert blk.gpas.gate.grad is not None and blk.gpas.gate.grad.abs() > 0


def test_gpas_per_add_gives_each_add_its_own_gate():
    cfg = tiny_model_config(norm_scheme="pre", gpas=True, gpas_gate="per_add")
    model = Transformer(cfg)
    gates = [name for name, _ in model.named_parameters() if name.endswith("gpas.gate")]
    assert gates == [f"layers.{i}.{add}.gpas.gate" for i in range(cfg.n_layers) for add in ("attn_add", "mlp_add")]
    h, blk, rope = block_io(model, 2)
    blk.attn_add.gate.data.fill_(0.3)
    blk.mlp_add.gate.data.fill_(-1.2)
    ga, gm = 1 - F.silu(torch.tensor(0.3)), 1 - F.silu(torch.tensor(-1.2))
    h1 = ga * (h + blk.attn(blk.attn_norm(h), rope))
    assert torch.allclose(blk(h, rope), gm * (h1 + blk.mlp(blk.mlp_norm(h1))), atol=1e-5)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_every_scheme_declares_what_the_rest_of_the_code_asks(scheme):
    cls = SCHEMES[scheme]
    assert cls.scheme == scheme
    for attr in ("supports_gpas", "hf_patchable", "hf_export"):
        assert attr in vars(cls), f"{scheme} must declare {attr} itself"
    assert cls.hf_export in ("family", "gemma2", None)
    assert (cls.hf_export is None) == bool(cls.hf_export_refusal)  # refused with a one-line reason, or exported
    assert "\n" not in cls.hf_export_refusal
    assert cls.default_init in INITS and set(cls.init_warnings) <= set(INITS)
    assert (cls.__doc__ or "").strip()  # `depthlab schemes` prints its first line
    cfg = tiny_model_config(norm_scheme=scheme, n_layers=6)
    scales = [cls.norm_scale(cfg, l) for l in range(1, 7)]
    assert scales == ([l ** -cfg.lns_power for l in range(1, 7)] if scheme == "lns" else [1.0] * 6)


def test_a_new_scheme_is_one_class_and_one_registration():
    """A scheme registered in a test reaches the model, validation, init, export and hf.apply_scheme."""
    from depthlab.config import Config, DataConfig
    from depthlab.hf.exporter import hf_weights_and_config
    from depthlab.model.apply import apply_scheme
    from depthlab.model.schemes import register
    from depthlab.model.validate import validate

    try:
        @register("halfnorm")
        class HalfNormBlock(SCHEMES["pre"]):
            """Pre-LN with every norm output halved (a test scheme)."""

            supports_gpas = hf_patchable = True
            hf_export = "family"

            @classmethod
            def norm_scale(cls, cfg, layer_id):
                return 0.5

        cfg = tiny_model_config(norm_scheme="halfnorm", gpas=True)
        validate(Config(model=cfg, data=DataConfig(seq_len=32)))
        model = Transformer(cfg)
        assert all(blk.attn_norm.scale == blk.mlp_norm.scale == 0.5 for blk in model.layers)
        with pytest.raises(UserError, match="gpas"):
            hf_weights_and_config(model)
        state, fields = hf_weights_and_config(Transformer(tiny_model_config(norm_scheme="halfnorm")))
        assert fields["model_type"] == "llama"
        from tests.test_hf_fixtures import tiny_hf

        hf = apply_scheme(tiny_hf("llama"), "halfnorm")
        assert hf.config.depthlab_scheme == "halfnorm" and hf.config.depthlab_layer_scales == [0.5] * 4
        with pytest.raises(TypeError, match="must declare"):
            register("undeclared")(type("Undeclared", (HalfNormBlock,), {"__doc__": "x"}))
        with pytest.raises(TypeError, match="must say why"):
            register("silent")(type("Silent", (HalfNormBlock,), {"supports_gpas": False, "hf_patchable": False,
                                                                 "hf_export": None}))
    finally:
        for name in ("halfnorm", "undeclared", "silent"):
            SCHEMES.pop(name, None)
