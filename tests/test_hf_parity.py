import pytest
import torch

from depthlab.hf.convert import hf_config_dict, to_hf_state_dict
from depthlab.model import Transformer
from tests.conftest import tiny_model_config

transformers = pytest.importorskip("transformers")


def hf_twin(model: Transformer):
    cfg = transformers.LlamaConfig(**{k: v for k, v in hf_config_dict(model.cfg).items()
                                      if k not in ("architectures", "torch_dtype")})
    hf = transformers.LlamaForCausalLM(cfg).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    tied = {"lm_head.weight"} if model.cfg.tie_embeddings else set()
    assert not unexpected and all("rotary" in k or k in tied for k in missing), (missing, unexpected)
    return hf


@pytest.mark.parametrize("scheme,kv_heads,tie", [("pre", None, False), ("pre", 2, True), ("lns", 2, False)])
def test_logits_match_transformers_llama(scheme, kv_heads, tie):
    model = Transformer(tiny_model_config(norm_scheme=scheme, n_kv_heads=kv_heads, tie_embeddings=tie)).eval()
    for p in model.parameters():  # non-trivial norm weights, so a wrong fold or mapping cannot hide
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    hf = hf_twin(model)
    idx = torch.randint(0, model.cfg.vocab_size, (3, 17))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()
