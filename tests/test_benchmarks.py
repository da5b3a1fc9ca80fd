"""The benchmark scripts: their arithmetic on known cases, like-for-like comparisons, and tiny end-to-end runs."""

import json
import math
import re

import pytest
import torch

from benchmarks import common, reproduce
from depthlab.model import Transformer
from tests.conftest import tiny_model_config

TINY_CASE = (dict(vocab_size=97, dim=32, n_layers=3, n_heads=4, ffn_dim=64), 2, 16)


def test_interleaved_alternates_order_and_paired_ratio():
    calls = []
    times = common.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3, steps=2,
                               warmup=1)
    assert calls == ["a", "b"] + ["a"] * 2 + ["b"] * 2 + ["b"] * 2 + ["a"] * 2 + ["a"] * 2 + ["b"] * 2
    assert len(times["a"]) == len(times["b"]) == 3
    assert common.paired_ratio([2.0, 3.0, 8.0], [1.0, 1.0, 2.0]) == {"median": 3.0, "min": 2.0, "max": 4.0}


@pytest.mark.parametrize("fused", [False, True])
def test_hf_twin_trains_step_for_step_like_depthlab(fused):
    """The speed comparison is like for like: same weights, same losses, same updates (either AdamW kernel)."""
    pytest.importorskip("transformers")
    model = Transformer(tiny_model_config(norm_scheme="lns")).train()
    hf = common.hf_twin(model).train()
    x = torch.randint(0, 97, (2, 16))
    y = torch.roll(x, -1, 1)
    ours = common.make_train_step(model, x, y, "fp32", hf=False, fused_adamw=fused)
    theirs = common.make_train_step(hf, x, y, "fp32", hf=True, fused_adamw=not fused)
    for _ in range(3):
        a, b = ours().item(), theirs().item()
        assert a == pytest.approx(b, abs=1e-5)
    assert a < math.log(97)  # it trained


def test_matmul_probe_flops():
    run, flops = common.matmul_probe("fp32", n=8, calls=3)
    run()
    assert flops == 2 * 8**3 * 3


def test_train_speed_tiny(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from benchmarks import train_speed

    monkeypatch.setitem(train_speed.CASES, "tiny", TINY_CASE)
    out = tmp_path / "speed.json"
    train_speed.main(["--case", "tiny", "--dtype", "fp32", "bf16", "--reps", "2", "--steps", "1", "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert [r["dtype"] for r in runs] == ["fp32", "bf16"]
    assert runs[0]["first_loss"]["depthlab"] == pytest.approx(runs[0]["first_loss"]["hf"], abs=1e-5)
    for r in runs:
        assert set(r["speedup_over_hf"]) == {"depthlab", "depthlab+default_adamw", "hf+fused_adamw"}
        assert r["speedup_over_hf"]["depthlab"]["median"] > 0 and 0 < r["mfu"]["depthlab"]
        assert len(r["matmul_peak_flops"]) == 2 and len(r["step_s"]["hf"]) == 2


def test_lns_cost_export_is_stock_llama_with_lns_logits(monkeypatch):
    pytest.importorskip("transformers")
    from benchmarks import lns_cost

    monkeypatch.setitem(lns_cost.CASES, "tiny", TINY_CASE)
    r = lns_cost.inference_cost("tiny", reps=1, steps=1)
    assert r["same_class"] and r["same_config"] and r["same_parameter_shapes"]
    assert r["exported_lns_max_abs_logit_diff"] < 1e-5
    t = lns_cost.training_cost("tiny", "fp32", reps=2, steps=1)
    assert len(t["step_s"]["lns"]) == 2 and t["step_time_ratio_lns_over_pre"]["median"] > 0
    assert t["scale_ops"]["multiplies_per_step"] == 4 * 3  # 2 norms x (forward + backward) x 3 blocks
    assert 0 < t["scale_ops"]["share_of_pre_step"] < 1


def test_probe_identity_block_costs_nothing():
    """A block whose output projections are zero is the identity: removing it costs exactly 0, its input and
    output are at angular distance 0, and the other blocks' removal costs are not all 0."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(norm_scheme="lns", n_layers=4))
    with torch.no_grad():
        model.layers[2].attn.o_proj.weight.zero_()
        model.layers[2].mlp.down_proj.weight.zero_()
    tokens = torch.randint(0, 97, (16 * 32 + 1,)).numpy()
    p = reproduce.probe(model, tokens, seq_len=16, n_batches=1)
    assert p["removal_cost_by_layer"][2] == pytest.approx(0.0, abs=1e-6)
    assert p["angular_by_layer"][2] == pytest.approx(0.0, abs=1e-6)
    assert p["var_by_layer"][2] == pytest.approx(p["var_by_layer"][1], rel=1e-6)
    assert any(abs(c) > 1e-4 for i, c in enumerate(p["removal_cost_by_layer"]) if i != 2)
    assert len(model.layers) == 4  # restored


def _record(variant, seed, ppl, var_last, ang, removal, status="ok"):
    return {"variant": variant, "seed": seed, "status": status, "val_ppl": ppl, "val_loss": math.log(ppl),
            "var_by_layer": [1.0] * 3 + [var_last], "angular_by_layer": ang, "removal_cost_by_layer": removal}


def test_verdicts_on_known_numbers():
    runs = {
        "pre": {s: _record("pre", s, 20.0, 100.0, [0.3, 0.1, 0.02, 0.01], [1.0, 0.5, 0.01, 0.01]) for s in (0, 1)},
        "lns": {s: _record("lns", s, 19.0 + s, 10.0, [0.3, 0.2, 0.2, 0.2], [0.5, 0.4, 0.3, 0.3]) for s in (0, 1)},
        "post": {0: _record("post", 0, math.inf, 1, [0] * 4, [0] * 4, "diverged"),
                 1: _record("post", 1, 25.0, 1, [0] * 4, [0] * 4)},
        "lns+scaled": {s: _record("lns+scaled", s, 19.5, 10.0, [0.2] * 4, [0.3] * 4) for s in (0, 1)},
    }
    v = reproduce.verdicts(runs)
    assert v["1_lns_lower_ppl"]["paired_diff"] == [-1.0, 0.0] and not v["1_lns_lower_ppl"]["reproduces"]
    assert v["2_lns_lower_deep_variance"]["ratio_pre_over_lns"] == pytest.approx([10.0, 10.0])
    assert v["2_lns_lower_deep_variance"]["reproduces"]
    assert v["3_angular_distance"]["reproduces"] and v["4_layer_removal"]["reproduces"]
    assert v["5_post_less_stable"]["diverged"] == 1 and v["5_post_less_stable"]["reproduces"]
    assert v["6_lns_scaled_worse"]["paired_diff"] == [0.5, -0.5] and not v["6_lns_scaled_worse"]["reproduces"]


def test_reproduce_tiny_end_to_end(tmp_path):
    reproduce.main(["run", "--data", "builtin", "--builtin-mb", "0.05", "--variants", "pre", "lns", "--seeds", "0",
                    "--layers", "2", "--dim", "16", "--heads", "2", "--ffn", "32", "--vocab", "300", "--seq", "16",
                    "--batch", "4", "--steps", "3", "--eval-every", "2", "--probe-batches", "1", "--jobs", "1",
                    "--out", str(tmp_path)])
    res = json.loads((tmp_path / "results.json").read_text())
    d = res["datasets"]["builtin"]
    assert set(d["variants"]) == {"pre", "lns"} and "1_lns_lower_ppl" in d["claims"]
    assert d["variants"]["lns"]["val_ppl"]["n"] == 1
    assert res["settings"]["commands"][0].startswith("python -m benchmarks.reproduce run")
    assert (tmp_path / "builtin_var_by_depth.png").stat().st_size > 0
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2
    assert d["variants"]["lns"]["ppl_minus_pre"]["n"] == 1 and "ppl_minus_pre" not in d["variants"]["pre"]
    # One output directory holds one set of settings: other settings are refused before any training.
    with pytest.raises(SystemExit, match=r"other settings \(steps: 3 -> 5\)"):
        reproduce.main(["run", "--data", "builtin", "--steps", "5", "--layers", "2", "--dim", "16", "--heads", "2",
                        "--ffn", "32", "--vocab", "300", "--seq", "16", "--batch", "4", "--eval-every", "2",
                        "--probe-batches", "1", "--builtin-mb", "0.05", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="variant 'nosuch'"):
        reproduce.main(["run", "--variants", "nosuch", "--out", str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()


def test_variant_names_set_scheme_init_and_gpas(tmp_path):
    args = dict(vocab=300, dim=16, layers=2, heads=2, ffn=32, seq=16, embed_std=0.02, data="builtin", builtin_mb=0.05,
                steps=4, batch=2, lr=1e-3, eval_every=2)
    m = {v: reproduce.make_config(args, v, 0, tmp_path / "r").model for v in ("lns", "lns+scaled", "pre+gpas")}
    assert (m["lns"].norm_scheme, m["lns"].init, m["lns"].gpas) == ("lns", "auto", False)
    assert (m["lns+scaled"].norm_scheme, m["lns+scaled"].init) == ("lns", "scaled")
    assert (m["pre+gpas"].norm_scheme, m["pre+gpas"].init, m["pre+gpas"].gpas) == ("pre", "auto", True)


def test_gpu_script_runs_on_cpu_tiny(tmp_path):
    from benchmarks import gpu_71m

    tiny = ["train.device=cpu", "model.dim=16", "model.n_layers=2", "model.n_heads=2", "model.ffn_dim=32",
            "model.vocab_size=300", "model.max_seq_len=16", "data.seq_len=16", "train.batch_size=2",
            "data.builtin_mb=0.05", "train.dtype=fp32"]
    gpu_71m.main(["--out", str(tmp_path), "--max-steps", "2", *[a for kv in tiny for a in ("--set", kv)]])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert set(s["runs"]) == {"pre", "lns"}
    assert all(r["tokens_per_s"] > 0 and r["mfu"] > 0 and math.isfinite(r["val_loss"]) for r in s["runs"].values())
    assert (tmp_path / "loss.png").exists() and (tmp_path / "var_by_depth.png").exists()


def test_report_renders_every_section(tmp_path, monkeypatch):
    """docs/results.md is generated from result files: the depth study's headline, tables and verdicts when it
    has run, a missing file said to be missing."""
    from benchmarks import depth_study, report

    results = tmp_path / "results"
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(report, "IMG", tmp_path / "docs" / "img")
    text = report.main().read_text()
    assert "has not been run yet" in text and "Not run yet (`make study`)" in text
    depth_study.main(["run", "--out", str(results / "depth_study"), "--depths", "2", "4", "--ref-depth", "4",
                      "--seeds", "0", "1", "--ref-seeds", "0", "1", "2", "--lrs", "1e-3", "2e-3",
                      "--phases", "grid", "sweep", "long", "--steps", "3", "--eval-every", "3", "--dim", "16",
                      "--heads", "2", "--ffn", "32", "--vocab", "300", "--seq", "16", "--batch", "2",
                      "--corpus-mb", "0.05", "--probe-seqs", "4", "--jobs", "1",
                      "--long-tokens", "192", "--long-corpus-mb", "0.08", "--long-eval-every", "2"])
    text = report.main().read_text()
    assert "Not run yet (`python -m benchmarks.train_speed`)" in text
    assert "**Not run: no GPU machine was available" in text
    assert "python -m benchmarks.depth_study run --depths 2 4" in text and "## 6. The earlier study" in text
    assert str(tmp_path) not in text  # the recorded command names no machine path
    for n, seeds in ((2, 2), (4, 3)):  # every depth has a row with its seeds and a three-way verdict for claim 1
        assert re.search(rf"^\| {n} \| {seeds} \| .*\| (reproduces|contradicted|inconclusive|not testable here) \|$",
                         text, re.M)
    assert (tmp_path / "docs" / "img" / "depth_study_delta_and_precondition_by_depth.png").exists()
    # the long pair: 6 steps on its own, larger corpus, lns - pre at every evaluation
    long_runs = [json.loads(x) for x in (results / "depth_study" / "long.jsonl").read_text().splitlines()]
    assert {(r["variant"], r["tokens"]) for r in long_runs} == {("pre", 192), ("lns", 192)}
    assert long_runs[0]["corpus_sha256"] != json.loads((results / "depth_study" / "settings.json").read_text())[
        "corpus_sha256"]
    assert re.search(r"The long pair .*N=4, seed 0, 0\.0M tokens.*lns − pre at step 2: [+-]\d", text)
    assert (tmp_path / "docs" / "img" / "depth_study_long_pair.png").exists()


def test_vit_study_tiny_writes_verdicts_and_its_report_section(tmp_path):
    from benchmarks import vit_study

    out = tmp_path / "vit"
    vit_study.main(["run", "--lrs", "1e-3", "2e-3", "--seeds", "0", "1", "--steps", "4", "--batch", "8", "--jobs",
                    "1", "--out", str(out), "--runs-dir", str(tmp_path / "runs")])
    runs = vit_study.load_runs(out)
    assert len(runs) == 3 * 2 + 3  # the grid, then seed 1 at each variant's best rate
    assert all(r["images_seen"] == 32 and 0 <= r["val_acc"] <= 1 and r["val_images"] == 359 for r in runs.values())
    res = json.loads((out / "results.json").read_text())
    assert res["variants"]["lns-branch"]["acc"]["n"] == 2 and len(res["lns-norm_minus_pre"]["paired"]) == 2
    text = "\n".join(vit_study.section(out, "img/vit_study.png"))
    assert "python -m benchmarks.vit_study run --lrs 1e-3 2e-3" in text and str(tmp_path) not in text
    assert re.search(r"\| LNS on the branch outputs beats Pre-LN \| [+-]0\.\d{4}, [+-]0\.\d{4} \|", text)
    assert (out / "vit_study.png").exists()
    assert vit_study.verdict([0.01, 0.02], True) == "reproduces" and vit_study.verdict([-0.01, -0.02], True) == \
        "contradicted" and vit_study.verdict([0.01, -0.02], True) == "inconclusive"


def test_depth_study_verdicts_follow_the_precondition():
    from benchmarks import depth_study_report as r

    cursed = {"update_ratio": [0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.1, 0.1], "removal": [2, 1, 1, 1, 1, 1, .1, .1]}
    healthy = {"update_ratio": [0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.3, 0.3], "removal": [2, 1, 1, 1, 1, 1, .9, .9]}
    assert r.precondition([cursed])["curse"] == "present" and r.precondition([healthy])["curse"] == "absent"
    assert r.verdict("present", [-0.1, -0.2]) == "reproduces"
    assert r.verdict("present", [0.1, 0.2]) == "contradicted"
    assert r.verdict("present", [0.1, -0.2]) == "inconclusive"
    assert r.verdict("absent", [-0.1, -0.2]) == "not testable here"


def test_memory_benchmark_tiny(tmp_path, monkeypatch):
    """Every contender measured in its own process, the ratios and the step-time comparison recorded, and the
    docs section rendered from the result."""
    pytest.importorskip("transformers")
    from benchmarks import memory

    monkeypatch.setitem(memory.CASES, "tiny", dict(TINY_CASE[0], max_seq_len=16))
    out = tmp_path / "memory.json"
    r = memory.main(["--case", "tiny", "--batch", "2", "--seq", "16", "--reps", "1", "--time-case", "tiny",
                     "--out", str(out)])
    assert json.loads(out.read_text())["ratios"] == r["ratios"]
    assert [row["contender"] for row in r["rows"]] == list(memory.CONTENDERS)
    for row in r["rows"]:
        # weights, gradients, two AdamW moments (and AdamW's step counters)
        assert 16 * row["params"] <= row["static_tensor_bytes"] <= 16 * row["params"] + 1024
        assert row["activation_and_logits_bytes"] >= 0 and row["saved_for_backward_bytes"] > 0
    assert r["ratios"]["tiny fp32"]["depthlab_over_hf"] > 0
    assert r["step_time"][0]["ratio_chunked_over_unchunked"]["median"] > 0
    text = "\n".join(memory.section(r))
    assert "| tiny | fp32 | hf |" in text and "depthlab / HF activation-and-logits memory" in text
    assert memory.section(None) == ["Not run yet (`python -m benchmarks.memory`)."]


def test_gpu_table_runs_on_cpu_tiny(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from benchmarks import gpu_table

    monkeypatch.setitem(gpu_table.CASES, "tiny", dict(TINY_CASE[0], max_seq_len=16))
    r = gpu_table.main(["--case", "tiny", "--batch", "2", "--seq", "16", "--steps", "1", "--warmup", "1",
                        "--dtype", "fp32", "--device", "cpu", "--out", str(tmp_path / "t.json")])
    assert [row["contender"] for row in r["rows"]] == list(gpu_table.CONTENDERS)
    losses = [row["loss"] for row in r["rows"]]
    assert all(row["tokens_per_s"] > 0 and row["mfu"] > 0 for row in r["rows"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)  # same weights, same batch, same step
    assert "Not run: no GPU" in gpu_table.section(r)[0]  # a CPU run is not reported as a GPU result
