"""Settings that train but would be wrong later: family defaults follow the family, train warns (issue 24)."""

from depthlab.cli import main

TINY = ["--set", "model.dim=32", "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set",
        "model.ffn_dim=64", "--set", "model.vocab_size=300", "--set", "model.max_seq_len=64", "--set",
        "data.seq_len=32", "--set", "train.batch_size=4", "--set", "train.eval_every=2", "--set",
        "train.monitor_every=0", "--no-progress", "--max-steps", "2"]


def test_olmo_takes_its_norm_eps_and_warmup_beyond_the_run_warns(tmp_path, corpus, capsys):
    from depthlab.config import Config

    assert main(["train", "--data", str(corpus), "--run-dir", str(tmp_path / "r"), *TINY,
                 "--set", "model.family=olmo", "--set", "train.warmup_steps=5"]) == 0
    out = capsys.readouterr()
    assert Config.load(tmp_path / "r" / "config.json").model.norm_eps == 1e-5
    assert "warmup_steps=5 is more than train.max_steps=2" in out.err
    assert "window 32" in out.out
    assert main(["export", str(tmp_path / "r"), str(tmp_path / "hf")]) == 0


def test_an_explicit_norm_eps_for_olmo_warns_at_train(tmp_path, corpus, capsys):
    assert main(["train", "--data", str(corpus), "--run-dir", str(tmp_path / "r"), *TINY, "--set",
                 "train.warmup_steps=1", "--set", "model.family=olmo", "--set", "model.norm_eps=1e-6"]) == 0
    assert "will not export; set model.norm_eps=1e-05" in capsys.readouterr().err
