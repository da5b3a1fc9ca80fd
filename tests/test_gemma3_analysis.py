"""Gemma-3 everywhere `analyze` touches a block (issue 61 item 2). Gemma-3 gives its sliding-window blocks and its
global blocks each their own RoPE table (local base 10,000, global 1,000,000) and their own attention mask; a block
replayed, repeated or re-scored inside the analysis must get those of its own kind. Each path is checked against
the model `prune` or `duplicate` writes (transformers then reads each block's kind from the edited `layer_types`)
scored by `eval ppl`'s `evaluate` on the same tokens, within 1e-5: removal replay from cached prefixes, the
contiguous runs, attention-only and MLP-only removal, linear replacement, the duplication scan, greedy re-scoring
and layer-by-layer mode."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from depthlab.analysis.analyze import Options, analyze, analyze_layerwise
from depthlab.analysis.calibration import Batch
from depthlab.analysis.duplication import duplication_scan, naive_scan
from depthlab.analysis.greedy import LossScorer, greedy_removal
from depthlab.analysis.layers import from_hf
from depthlab.analysis.layerwise import load_skeleton

transformers = pytest.importorskip("transformers")

# sliding and global blocks mixed, so that a block repeated after the span (duplication) or replayed in a slot
# (layer-by-layer) sits where the other kind sat in the model's own order
KINDS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
T, WINDOWS, WINDOW = 13, 4, 4  # tokens per window > the sliding window: the sliding mask really hides keys
TOL = 1e-5


def tiny_gemma3(vocab: int = 97, **kw):
    """A tiny random Gemma-3 (sandwich norms, q/k norms, a scaled embedding) with matrices N(0, 0.15): blocks that do
    visible work, so that a block given the other kind's mask or RoPE table moves the loss by far more than TOL."""
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=len(KINDS), num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=WINDOW, max_position_embeddings=64, layer_types=KINDS,
        query_pre_attn_scalar=8, pad_token_id=0, bos_token_id=0, eos_token_id=0, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
            elif name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)  # Gemma's norms scale by (1 + w)
    return model


def stream(vocab: int = 97, seed: int = 0) -> np.ndarray:
    """WINDOWS windows of T tokens as `evaluate` cuts a stream: window k is tokens[k(T-1) : k(T-1) + T]."""
    g = np.random.default_rng(seed)
    return g.integers(1, vocab, WINDOWS * (T - 1) + 1)


def windows(tokens: np.ndarray, per_batch: int = 2) -> list[Batch]:
    ids = torch.from_numpy(np.stack([tokens[k * (T - 1):k * (T - 1) + T] for k in range(WINDOWS)])).long()
    return [Batch(ids[i:i + per_batch], torch.ones(len(ids[i:i + per_batch]), T, dtype=torch.bool))
            for i in range(0, WINDOWS, per_batch)]


def eval_ppl(model_or_path, tokens: np.ndarray) -> float:
    """`depthlab eval ppl`'s loss on `tokens` (windows of T - 1 predictions), of a saved model or one in memory."""
    from depthlab.eval.perplexity import evaluate
    from depthlab.loading import Logits, load_model

    lm = Logits(model_or_path) if isinstance(model_or_path, torch.nn.Module) else load_model(model_or_path).lm()
    return evaluate(lm, tokens, T - 1, 2, torch.device("cpu"))["val_loss"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The saved Gemma-3, its tokens and windows, and the whole-model analysis with every kind of removal."""
    folder = tmp_path_factory.mktemp("gemma3")
    model = tiny_gemma3()
    model.save_pretrained(folder / "src")
    tokens = stream()
    batches = windows(tokens)
    lm = from_hf(transformers.AutoModelForCausalLM.from_pretrained(folder / "src").eval(), "gemma3")
    fit = windows(stream(seed=1), per_batch=4)
    res = analyze(lm, batches, Options(jacobian=False, sublayers=True, linear=True, drop_lowest=2), fit=fit)
    return {"folder": folder, "model": model, "tokens": tokens, "batches": batches, "lm": lm, "res": res,
            "fit": fit}


def test_the_fixture_tells_the_kinds_apart(world):
    """Without this the other tests could not fail: every block given the other kind (its mask and its RoPE
    table) changes the loss by far more than the tolerance."""
    tokens, own = world["tokens"], eval_ppl(world["folder"] / "src", world["tokens"])
    swapped = [k.replace("sliding", "x").replace("full", "sliding").replace("x", "full") for k in KINDS]
    other = copy.deepcopy(world["model"])
    other.config.layer_types = swapped
    assert abs(eval_ppl(other, tokens) - own) > 1e-2
    assert world["res"]["removal"]["base_loss"] == pytest.approx(own, abs=TOL)


def pruned_loss(world, removed: list[int], name: str) -> float:
    from depthlab.hf.pruning import prune_blocks

    out, _ = prune_blocks(world["folder"] / "src", lambda n: removed, world["folder"] / name)
    return eval_ppl(out, world["tokens"])


def test_removal_replay_and_runs_equal_prune_then_eval(world):
    r = world["res"]["removal"]
    for row in r["single"]:
        l = row["block"] - 1
        assert row["loss"] == pytest.approx(pruned_loss(world, [l], f"single{l}"), abs=TOL), l
    assert r["runs"]
    for row in r["runs"]:
        s, n = row["start_block"] - 1, row["n"]
        assert row["loss"] == pytest.approx(pruned_loss(world, list(range(s, s + n)), f"run{s}-{n}"), abs=TOL)
    for by, rows in r["drop"].items():
        order = [b - 1 for b in world["res"]["usefulness"][by]]
        for row in rows:
            assert row["loss"] == pytest.approx(pruned_loss(world, order[:row["k"]], f"drop{row['k']}"), abs=TOL)


def zeroed(model, l: int, part: str):
    """The model with block l's attention (o_proj) or MLP (down_proj) output zeroed: what sublayer removal means."""
    m = copy.deepcopy(model)
    blk = m.model.layers[l]
    with torch.no_grad():
        (blk.self_attn.o_proj if part == "attn" else blk.mlp.down_proj).weight.zero_()
    return m


def test_attention_only_and_mlp_only_removal_equal_the_model_with_that_output_zeroed(world):
    for part in ("attn", "mlp"):
        for row in world["res"]["removal"][part]:
            l = row["block"] - 1
            assert row["loss"] == pytest.approx(eval_ppl(zeroed(world["model"], l, part), world["tokens"]),
                                                abs=TOL), (part, l)


class Linear(torch.nn.Module):
    """Stands in for a block: its fitted linear map (HF calls a block with the stream first or as hidden_states)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, hidden_states, *args, **kwargs):
        return self.fn(hidden_states)


def test_linear_replacement_equals_the_model_with_that_block_replaced(world):
    from depthlab.analysis.analyze import fit_linear_maps

    linear = fit_linear_maps(world["lm"], world["fit"])
    for row in world["res"]["removal"]["linear"]:
        l = row["block"] - 1
        m = copy.deepcopy(world["model"])
        m.model.layers[l] = Linear(linear[l])
        assert row["loss"] == pytest.approx(eval_ppl(m, world["tokens"]), abs=TOL), l


def test_duplication_scan_equals_duplicate_then_eval(world):
    from depthlab.hf.pruning import duplicate

    lm, batches = world["lm"], world["batches"]
    res = duplication_scan(lm, batches, 2)
    naive = naive_scan(lm, batches, 2)  # the model run whole in the duplicated order, each block its own kind
    for row in res["spans"]:
        i, j = row["start_block"] - 1, row["end_block"] - 1
        out, _ = duplicate(world["folder"] / "src", i, j + 1, world["folder"] / f"dup{i}-{j}")
        assert row["loss"] == pytest.approx(eval_ppl(out, world["tokens"]), abs=TOL), (i, j)
        assert row["loss"] == pytest.approx(naive[("dup", i, j)], abs=TOL), (i, j)


def test_greedy_rescoring_equals_prune_then_eval(world):
    record = greedy_removal(LossScorer(world["lm"], world["batches"]), 2)
    for step in record["steps"]:
        for how in ("greedy", "one_shot"):
            removed = [b - 1 for b in step[how]["blocks"]]
            want = pruned_loss(world, removed, f"greedy-{how}-{step['k']}")
            assert step[how]["loss"] == pytest.approx(want, abs=TOL), (how, step["k"])


def test_layer_by_layer_mode_equals_prune_then_eval(world):
    """One slot per kind: each block replayed in its kind's slot, with that slot's recorded mask and RoPE table."""
    skel = load_skeleton(str(world["folder"] / "src"))[0]
    assert skel.slots == [0, 1, 0, 0, 1]
    res = analyze_layerwise(skel, world["batches"], Options(jacobian=False, sublayers=True, linear=True,
                                                            drop_lowest=2, activation_mb=0), fit=world["fit"])
    whole = world["res"]["removal"]
    for kind in ("single", "attn", "mlp", "linear", "runs"):
        for a, b in zip(res["removal"][kind], whole[kind], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], abs=TOL), (kind, a)
    for row in res["removal"]["single"]:
        l = row["block"] - 1
        assert row["loss"] == pytest.approx(pruned_loss(world, [l], f"single{l}"), abs=TOL), l
    assert res["lens"]["ce"] == pytest.approx(world["res"]["lens"]["ce"], rel=1e-5)



@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_analyze_of_a_gemma3_or_qwen2_gguf_is_analyze_of_its_dequantized_directory(arch, tmp_path):
    """The panel's two other families as GGUF files (Gemma-3: 5 sliding-window blocks to 1 global, windows of 32
    tokens past its window of 8; Qwen2: biases on q, k, v, an untied head): `analyze` of the file gives exactly the
    numbers of the directory transformers dequantizes it to."""
    import json

    from depthlab.cli import main
    from depthlab.gguf import plain
    from tests.gguf_fixtures import TEXT, bpe_tokenizer, gguf_gemma3, sentencepiece_pieces, tiny_qwen2, write_gguf

    tok = bpe_tokenizer()
    (tmp_path / "file").mkdir()
    f = tmp_path / "file" / f"tiny-{arch}-F16.gguf"
    vocab = len(sentencepiece_pieces()) if arch == "gemma3" else tok.get_vocab_size()
    write_gguf(f, (gguf_gemma3 if arch == "gemma3" else tiny_qwen2)(vocab), tok)
    dense = tmp_path / "dense"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name, dtype=torch.float32)
    if arch == "gemma3":
        assert model.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    plain(model).save_pretrained(dense)
    transformers.AutoTokenizer.from_pretrained(str(f.parent), gguf_file=f.name).save_pretrained(dense)
    (tmp_path / "text.txt").write_text(TEXT)
    got = {}
    for name, path in (("file", f), ("dense", dense)):
        assert main(["analyze", str(path), "--data", str(tmp_path / "text.txt"), "--tokens", "128", "--seq-len", "32",
                     "--probes", "1", "--sublayers", "--duplicate", "2", "--no-progress",
                     "--out", str(tmp_path / f"out-{name}")]) == 0
        got[name] = json.loads((tmp_path / f"out-{name}" / "metrics.json").read_text())
    numbers = lambda res: {k: v for k, v in res.items() if k not in ("model", "notes", "wall_s")}  # noqa: E731
    assert numbers(got["file"]) == numbers(got["dense"])
    assert got["file"]["model"]["gguf"]["architecture"] == arch and len(got["file"]["removal"]["mlp"]) == (
        6 if arch == "gemma3" else 4)
