"""depthlab finetune --lora: peft adapters on every scheme (the model unchanged at the start, the LNS scale
untouched), only the adapters train (counted, and all the optimizer holds), the response loss falls, resume after
a kill is bitwise, and both exports (merged stock checkpoint; peft adapter directory on the base's export) give
the adapted model's logits. One-line errors for bad options."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab.config import Config, LoraConfig
from depthlab.data.instructions import build_instruction_data
from depthlab.eval.perplexity import response_loss
from depthlab.hf.importer import save_as_checkpoint
from depthlab.model import SCHEMES, Transformer, lora as L
from depthlab.train.callbacks import Callback
from depthlab.train.finetune import Finetuning, finetune_config
from depthlab.train.trainer import Trainer
from tests.conftest import tiny_model_config
from tests.test_finetune import FAST, TRAIN, bpe_for_tests, run

pytest.importorskip("peft")
LORA = LoraConfig(rank=4, alpha=8.0)  # LLM-Adapters' alpha = 2 x rank at a rank that fits a 32-wide model


def adapted_linears(model):
    """(in, out) of every layer LoRA's default targets adapt: q, k, v, up, down."""
    names = tuple("." + L.TARGETS[t] for t in LoraConfig().targets)
    return [(m.in_features, m.out_features) for n, m in model.named_modules()
            if n.endswith(names) and isinstance(m, torch.nn.Linear)]


def constants(model) -> dict:
    """Every scheme constant a module holds (norm scales, output scales, residual alphas): not weights."""
    names = ("scale", "branch_multiplier", "branch_multiplier_now", "alpha")
    return {f"{n}.{a}": getattr(m, a) for n, m in model.named_modules() for a in names
            if isinstance(getattr(m, a, None), float)}


@pytest.mark.parametrize("scheme,family", [(s, "llama") for s in SCHEMES] +
                         [("lns", a) for a in ("qwen2", "olmo", "olmo2")])
def test_adapters_at_init_leave_the_model_as_it_was(scheme, family):
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(norm_scheme=scheme, family=family)).eval()
    x = torch.randint(0, 97, (2, 16))
    before, scales, shapes = model(x), constants(model), adapted_linears(model)
    n = L.add_adapters(model, LoraConfig(rank=4))
    model.eval()  # peft's new dropout modules start in training mode
    assert torch.equal(model(x), before)  # B = 0 at the start: the base model's logits, bitwise
    assert constants(model) == scales and (scheme != "lns" or any(v != 1.0 for v in scales.values()))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert n == sum(4 * (i + o) for i, o in shapes) and len(trainable) == 2 * len(shapes) == 2 * 5 * 4
    assert all(".lora_A." in name or ".lora_B." in name for name in trainable)


@pytest.fixture(scope="module")
def bpe():
    return bpe_for_tests()


def base_checkpoint(path, bpe, scheme="lns", family="llama"):
    """A tiny pretrained-looking checkpoint (random weights) with a BPE tokenizer fitted to the test data."""
    mc = tiny_model_config(vocab_size=400, n_layers=2, max_seq_len=256, norm_scheme=scheme, family=family,
                           norm_eps=1e-5 if family == "olmo" else 1e-6)  # OlmoForCausalLM fixes its epsilon
    torch.manual_seed(0)
    save_as_checkpoint(path, Transformer(mc), Config(model=mc), {"step": 0}, tokenizer=bpe)
    return path


def lora_trainer(base, run_dir, resume=None, extra=(), callbacks=None):
    cfg, ckpt = finetune_config(str(base), str(TRAIN), seq_len=200, overrides=[*FAST, "train.lr=2e-2", *extra],
                                lora=LORA)  # a higher rate than full fine-tuning's: B starts from zero
    from depthlab.data.tokenizer import load_tokenizer

    data = build_instruction_data(TRAIN, load_tokenizer(ckpt / "tokenizer.json"), cfg.data.seq_len)
    return Trainer(cfg, run_dir=run_dir, resume=resume, data=data, progress=False, callbacks=callbacks,
                   task=Finetuning())


def test_lora_trains_only_the_adapters_and_resumes_bitwise_after_a_kill(bpe, tmp_path):
    from safetensors.torch import load_file

    base = base_checkpoint(tmp_path / "base", bpe)
    shapes = adapted_linears(Transformer(Config.load(base / "config.json").model))  # before the trainer seeds
    t = lora_trainer(base, tmp_path / "ref")
    adapters = {id(p) for n, p in t.module.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    held = {id(p) for g in t.opt.param_groups for p in g["params"]}
    trainable = {id(p) for p in t.module.parameters() if p.requires_grad}
    counted = sum(p.numel() for p in t.module.parameters() if p.requires_grad)
    assert held == trainable == adapters and len(adapters) == 2 * 5 * 2  # A and B on 5 projections x 2 blocks
    assert counted == sum(4 * (i + o) for i, o in shapes)
    print(f"LoRA rank 4: {counted} trainable of {t.module.num_params()} parameters")
    before = response_loss(t.model, t.data.train, t.data.train_targets, 200, 8, "cpu")["val_loss"]
    ref = run(t)
    after = response_loss(t.model, t.data.train, t.data.train_targets, 200, 8, "cpu")["val_loss"]
    print(f"LoRA response-token loss on the training examples: before {before:.4f}, after {after:.4f}")
    assert after < before - 0.2

    saved, start = load_file(ref.checkpoint / "model.safetensors"), load_file(base / "model.safetensors")
    assert {k for k in saved if "lora" not in k} == set(start)  # the base under its own names, and the adapters
    assert all(torch.equal(saved[k], start[k]) for k in start)  # frozen: bitwise the base's
    assert all(saved[k].abs().max() > 0 for k in saved if k.endswith("lora_B.weight"))  # B moved from zero

    class Kill(Callback):
        def on_step_start(self, trainer, step):
            if step == 7:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(lora_trainer(base, tmp_path / "run", resume="auto", extra=["train.ckpt_every=3"], callbacks=[Kill()]))
    resumed = run(lora_trainer(base, tmp_path / "run", resume="auto", extra=["train.ckpt_every=3"]))

    def losses(d):
        return [json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path / "run") == losses(tmp_path / "ref") and len(losses(ref.run_dir)) == 12
    again = load_file(resumed.checkpoint / "model.safetensors")
    assert set(again) == set(saved) and all(torch.equal(saved[k], again[k]) for k in saved)


def adapted_model(ckpt):
    """The LoRA run's model as it trained: peft's adapters live (not merged), in eval mode."""
    from depthlab.checkpoint import load_weights
    from depthlab.paths import find_checkpoint

    ckpt = find_checkpoint(ckpt)
    cfg = Config.load(ckpt / "config.json")
    model = Transformer(cfg.model, init=False)
    L.add_adapters(model, cfg.train.lora)
    missing, unexpected = model.load_state_dict(L.peft_names(load_weights(ckpt)), strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing)
    return model.eval()


@pytest.mark.parametrize("scheme,family", [("lns", "llama"), ("layerscale", "llama"), ("lns", "olmo")])
def test_exports_give_the_adapted_models_logits(bpe, tmp_path, capsys, scheme, family):
    """lns (its scale folded into the norm weights), layerscale (gains into the rows of down_proj) and OLMo-1's
    lns (the scale into the columns of q, k, v and up): the merged export and the adapter on the base's export."""
    pytest.importorskip("transformers")
    import peft
    from transformers import AutoModelForCausalLM

    from depthlab.cli import main

    base = base_checkpoint(tmp_path / "base", bpe, scheme, family)
    run_dir = tmp_path / "ft"
    assert main(["finetune", str(base), "--data", str(TRAIN), "--run-dir", str(run_dir), "--no-progress",
                 "--seq-len", "200", "--lora", "--lora-rank", "4", "--set", "train.max_steps=4", "--set",
                 "train.batch_size=4", "--set", "train.lr=3e-2", "--set", "train.warmup_steps=1"]) == 0
    final = float(capsys.readouterr().out.split("final validation loss (response tokens) ")[1].split()[0])
    assert main(["export", str(run_dir), str(tmp_path / "merged")]) == 0
    assert main(["export", str(base), str(tmp_path / "base-hf")]) == 0
    assert main(["export", str(run_dir), str(tmp_path / "adapter"), "--adapter-only"]) == 0
    assert {p.name for p in (tmp_path / "adapter").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}

    x = torch.randint(0, 400, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = adapted_model(run_dir)(x)
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "base-hf").eval()
        moved = (ours - plain(x).logits).abs().max().item()
        merged = (ours - AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(x).logits).abs().max()
        on_base = peft.PeftModel.from_pretrained(plain, str(tmp_path / "adapter")).eval()
        adapter = (ours - on_base(x).logits).abs().max().item()
    with capsys.disabled():
        print(f"{scheme}/{family}: adapters moved the logits by {moved:.3g}; max |logit difference| to the adapted "
              f"model: merged export {merged.item():.3g}, peft adapter on the base export {adapter:.3g}")
    assert moved > 1e-3 and merged < 1e-5 and adapter < 1e-5

    assert main(["eval", "ppl", str(run_dir)]) == 0  # a LoRA run's own validation, on its merged weights
    shown = capsys.readouterr().out
    assert float(shown.split("response loss ")[1].split()[0]) == pytest.approx(final, abs=1e-4)
    assert main(["finetune", str(run_dir), "--data", str(TRAIN), "--run-dir", str(tmp_path / "again"),
                 "--no-progress", "--seq-len", "200", "--set", "train.max_steps=1"]) == 0  # from its merged weights
    assert Config.load(tmp_path / "again" / "config.json").train.lora.rank == 0  # full fine-tuning unless --lora
    capsys.readouterr()
    assert main(["analyze", str(run_dir), "--layer-by-layer", "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err  # the stored weights are not the model: refused, not analysed wrongly
    assert "is a LoRA fine-tune" in err and err.count("\n") == 1 and not (tmp_path / "report").exists()


def test_bad_lora_options_are_one_line(bpe, tmp_path, capsys, monkeypatch):
    import sys

    from depthlab.cli import main

    base = base_checkpoint(tmp_path / "base", bpe)
    cases = [(["--lora", "--lora-rank", "0"], "--lora-rank must be a positive integer"),
             (["--lora", "--lora-targets", "q,x_proj"], "unknown LoRA target 'x_proj'"),
             (["--lora", "--lora-targets", "q,q_proj"], "given twice"),
             (["--lora", "--lora-dropout", "1"], "dropout must be in [0, 1)"),
             (["--lora", "--lora-alpha", "0"], "alpha must be positive"),
             (["--lora-rank", "8"], "--lora-rank needs --lora")]
    for args, msg in cases:
        code = main(["finetune", str(base), "--data", str(TRAIN), "--run-dir", str(tmp_path / "ft"), *args])
        err = capsys.readouterr().err
        assert code == 2 and msg in err and err.count("\n") == 1, (args, err)
    code = main(["export", str(base), str(tmp_path / "adapter"), "--adapter-only"])
    err = capsys.readouterr().err
    assert code == 2 and "not a LoRA fine-tune" in err and err.count("\n") == 1, err
    monkeypatch.setitem(sys.modules, "peft", None)  # as if it were not installed
    code = main(["finetune", str(base), "--data", str(TRAIN), "--run-dir", str(tmp_path / "ft"), "--lora"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'depthlab[lora]'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "ft").exists() and not (tmp_path / "adapter").exists()
