"""Shared builders for the Hugging Face interop tests (no tests here): tiny random HF models of each family, built
locally, and tiny depthlab checkpoints with a word-level tokenizer whose token counts are known by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from depthlab.config import Config
from depthlab.hf.importer import save_as_checkpoint
from depthlab.model import Transformer
from tests.conftest import tiny_model_config
from tests.families import FAMILIES

transformers = pytest.importorskip("transformers")

WORDS = "the sky is red blue green yellow a b c what color grass dark very".split()


def word_tokenizer():
    """Whitespace-split words, one token each: token counts of a text are its word count."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def randomize_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial 1-D parameters (norm weights, gains), so a wrong fold or a wrong mapping cannot hide."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def tiny_hf(family: str, n_layers: int = 4, **kw):
    """A tiny random model of the family's stock class (tests/families.py: its config class and own fields; kw
    over both), eager attention (soft-capping has no other)."""
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                bos_token_id=0, eos_token_id=0)
    base.update({**FAMILIES[family].hf, **kw})
    config = getattr(transformers, FAMILIES[family].hf_config)(**base)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():  # norms non-trivial; biases stay as initialised (zero)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def make_checkpoint(path, scheme: str = "lns", gpas: bool = False, **kw):
    mc = tiny_model_config(norm_scheme=scheme, gpas=gpas, **kw)
    model = randomize_norms(Transformer(mc)).eval()
    save_as_checkpoint(path, model, Config(model=mc), {"step": 7}, tokenizer=word_tokenizer())
    return model


STOCK_LOADER = textwrap.dedent("""
    import json, sys
    class NoDepthlab:  # the exported directory must load with depthlab absent
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "depthlab":
                raise ImportError("depthlab is blocked in this process")
    sys.meta_path.insert(0, NoDepthlab())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out_dir, ids_file, logits_file = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=False).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    ids = torch.tensor(json.load(open(ids_file)))
    with torch.no_grad():
        torch.save(model(ids).logits, logits_file)
    print(json.dumps({"class": type(model).__name__, "encoded": tok("the sky is blue").input_ids,
                      "depthlab_loaded": any(m.startswith("depthlab") for m in sys.modules)}))
""")


def load_stock(out_dir, ids: torch.Tensor, tmp_path):
    """Logits of the exported directory computed in a fresh process that cannot import depthlab."""
    script, ids_file, logits_file = tmp_path / "load.py", tmp_path / "ids.json", tmp_path / "logits.pt"
    script.write_text(STOCK_LOADER)
    ids_file.write_text(json.dumps(ids.tolist()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(script), str(out_dir), str(ids_file), str(logits_file)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(logits_file), json.loads(r.stdout.strip().splitlines()[-1])
