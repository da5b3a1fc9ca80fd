"""depthlab finetune: Commonsense170K-format instruction data, loss on the response tokens only, the same trainer
(exact resume after a kill), one-line errors for malformed records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from depthlab.config import Config
from depthlab.data.instructions import IGNORE, build_instruction_data, encode_example, prompt_of, read_records
from depthlab.eval.perplexity import response_loss
from depthlab.hf.importer import save_as_checkpoint
from depthlab.model import Transformer
from depthlab.train.callbacks import Callback
from depthlab.train.finetune import Finetuning, finetune_config
from depthlab.train.trainer import Trainer
from tests.conftest import tiny_model_config

DATA = Path(__file__).parent / "data" / "commonsense"
TRAIN = DATA / "train.json"
FAST = ["train.max_steps=12", "train.batch_size=4", "train.lr=3e-3", "train.warmup_steps=2", "train.log_every=1",
        "train.eval_every=100", "train.device=cpu", "train.threads=1"]


def bpe_for_tests():
    from depthlab.data.tokenizer import train_bpe

    texts = [prompt_of(r["instruction"], r["input"]) + r["output"] for r in read_records(TRAIN)]
    return train_bpe(texts * 4, 400)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny pretrained-looking checkpoint with a BPE tokenizer fitted to the test data."""
    path = tmp_path_factory.mktemp("base") / "ckpt"
    mc = tiny_model_config(vocab_size=400, n_layers=2, max_seq_len=256)
    torch.manual_seed(0)
    save_as_checkpoint(path, Transformer(mc), Config(model=mc), {"step": 0}, tokenizer=bpe_for_tests())
    return path


def trainer(base, run_dir, resume=None, extra=(), callbacks=None):
    cfg, ckpt = finetune_config(str(base), str(TRAIN), seq_len=200, overrides=[*FAST, *extra])
    from depthlab.data.tokenizer import load_tokenizer

    data = build_instruction_data(TRAIN, load_tokenizer(ckpt / "tokenizer.json"), cfg.data.seq_len)
    return Trainer(cfg, run_dir=run_dir, resume=resume, data=data, progress=False, callbacks=callbacks,
                   task=Finetuning())


def run(t):
    try:
        return t.train()
    finally:
        t.close()


def test_prompt_tokens_carry_no_loss(base):
    tok = bpe_for_tests()
    data = build_instruction_data(TRAIN, tok, 200)
    rec = read_records(TRAIN)[0]
    ids, n_prompt = encode_example(tok, rec, 0, 0)
    y = data.train_targets.reshape(-1, 200)[0]
    assert (y[:n_prompt - 1] == IGNORE).all()  # positions predicting a prompt token
    assert y[n_prompt - 1:len(ids) - 1].tolist() == ids[n_prompt:]  # the response and the end of text
    assert (y[len(ids) - 1:] == IGNORE).all()  # padding
    assert tok.decode(ids[n_prompt:-1]) == rec["output"]
    assert prompt_of("Q", "").endswith("### Response:\n                ")


def test_finetune_lowers_the_response_loss_and_resumes_bitwise_after_a_kill(base, tmp_path):
    t = trainer(base, tmp_path / "ref")
    before = response_loss(t.model, t.data.train, t.data.train_targets, 200, 8, "cpu")["val_loss"]
    ref = run(t)
    after = response_loss(t.model, t.data.train, t.data.train_targets, 200, 8, "cpu")["val_loss"]
    print(f"response-token loss on the training examples: before {before:.4f}, after {after:.4f}")
    assert after < before - 0.5

    class Kill(Callback):
        def on_step_start(self, trainer, step):
            if step == 7:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(trainer(base, tmp_path / "run", resume="auto", extra=["train.ckpt_every=3"], callbacks=[Kill()]))
    resumed = run(trainer(base, tmp_path / "run", resume="auto", extra=["train.ckpt_every=3"]))

    def losses(d):
        return [json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path / "run") == losses(tmp_path / "ref") and len(losses(ref.run_dir)) == 12
    from safetensors.torch import load_file

    a, b = load_file(ref.checkpoint / "model.safetensors"), load_file(resumed.checkpoint / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_finetune_and_malformed_record(base, tmp_path, capsys):
    from depthlab.cli import main

    bad = tmp_path / "bad.json"
    records = json.loads(TRAIN.read_text())[:3]
    records[2] = {"instruction": "no output here", "input": ""}
    bad.write_text(json.dumps(records, indent=2))
    line = bad.read_text().split('"no output here"')[0].count("\n")  # the line of the record's "{"
    out = tmp_path / "ft"
    code = main(["finetune", str(base), "--data", str(bad), "--run-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{bad}:" in err[0] and f":{line}:" in err[0], err
    assert not out.exists()
    code = main(["finetune", str(base), "--data", str(TRAIN), "--run-dir", str(out), "--no-progress",
                 "--seq-len", "200", "--set", "train.max_steps=2", "--set", "train.batch_size=2"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert (out / "metrics.jsonl").is_file() and list((out / "checkpoints").iterdir())
    final = float(printed.out.split("final validation loss (response tokens) ")[1].split()[0])
    assert main(["eval", "ppl", str(out)]) == 0  # the run's own validation: its held-out records' responses
    shown = capsys.readouterr().out
    assert "held-out records" in shown and float(shown.split("response loss ")[1].split()[0]) == \
        pytest.approx(final, abs=1e-4)


def test_finetune_from_an_imported_export(base, tmp_path, capsys):
    """An export (any HF Llama directory) fine-tunes after `depthlab import`; a raw HF directory is one line."""
    pytest.importorskip("transformers")
    from depthlab.cli import main

    assert main(["export", str(base), str(tmp_path / "exported")]) == 0
    code = main(["finetune", str(tmp_path / "exported"), "--data", str(TRAIN), "--run-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "depthlab import" in err[0], err
    assert main(["import", str(tmp_path / "exported"), str(tmp_path / "imported")]) == 0
    code = main(["finetune", str(tmp_path / "imported"), "--data", str(TRAIN), "--run-dir", str(tmp_path / "ft"),
                 "--no-progress", "--seq-len", "200", "--set", "train.max_steps=2", "--set", "train.batch_size=2"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "ft" / "metrics.jsonl").is_file()


def test_malformed_json_lines_and_arrays_name_the_line(tmp_path):
    from depthlab import UserError

    good = json.dumps({"instruction": "i", "input": "", "output": "o", "answer": "o"})
    cases = {"a.jsonl": f"{good}\n\n{{not json\n", "b.jsonl": f"{good}\n{json.dumps({'instruction': 'i'})}\n",
             "c.json": f"[\n{good},\n{good},\n  {{\"instruction\": 3, \"output\": \"o\"}}\n]", "d.json": "[\n{good}\n"}
    lines = {"a.jsonl": 3, "b.jsonl": 2, "c.json": 4, "d.json": 2}
    for name, text in cases.items():
        (tmp_path / name).write_text(text.replace("{good}", good))
        with pytest.raises(UserError, match=f"{name}:{lines[name]}:"):
            read_records(tmp_path / name)
    assert len(read_records(TRAIN)) == 22
