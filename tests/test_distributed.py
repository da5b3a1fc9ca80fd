"""Scale-out on gloo, inside the test process's children: collectives on the right device, the resume decision
shared by every rank, sharded checkpoints that reshard, and the meta-device build."""

from __future__ import annotations

import os
import signal
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from depthlab.train import distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, backend, fn, args, errors):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        if backend:
            dist.init_process_group(backend)
        fn(rank, *args)
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise
    finally:  # leave the group as every depthlab process does: a bare destroy_process_group lets the last
        # collective's gloo thread free its tensors while the interpreter finalizes, which aborts the rank (SIGABRT)
        distributed.shutdown()


def run_ranks(fn, *args, world: int = 2, backend: str | None = "gloo") -> None:
    """fn(rank, *args) on `world` spawned processes that joined a group of `backend` (None: fn does it)."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(_entry, args=(world, _free_port(), backend, fn, args, errors), nprocs=world, join=True,
                       start_method="spawn")
    assert errors.empty(), errors.get()


def _reductions_under_a_cuda_only_group(rank):
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.ones(2, dtype=torch.float64))  # what "nccl" alone did to the trainer's reductions
    env = distributed.init_distributed(torch.device("cpu"))
    assert env.host_group is not None and env.world_size == 2
    assert distributed.all_reduce_sum([1.0, rank], env) == [2.0, 1.0]
    assert distributed.broadcast_object(f"from {rank}", env) == "from 0"
    assert distributed.gather_objects(rank * 10, env) == [0, 10]
    distributed.barrier(env)


@pytest.mark.slow
def test_trainer_reductions_run_under_a_group_whose_only_backend_is_for_cuda():
    run_ranks(_reductions_under_a_cuda_only_group, backend="cuda:gloo")


def _reductions_under_the_trainers_own_group(rank):
    env = distributed.init_distributed(torch.device("cpu"), timeout_s=30)
    assert env.host_group is None and "cpu:gloo" in dist.get_backend_config()  # one group serves the host
    assert distributed.all_reduce_sum([float(rank)], env) == [1.0]


@pytest.mark.slow
def test_trainer_group_has_a_cpu_backend_and_a_timeout():
    run_ranks(_reductions_under_the_trainers_own_group, backend=None)


# ---------------------------------------------------------------- one decision for resume
def _train(cfg, run_dir, resume=None):
    from depthlab.train.trainer import Trainer

    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, progress=False)
    try:
        trainer.train()
    finally:
        trainer.close()


def _kill_between_renames_then_resume(rank, cfg, run):
    from depthlab.train.trainer import Trainer

    _train(cfg, run)
    newest = run / "checkpoints" / "step_0000004"
    for _ in range(10):
        if rank == 0:  # what a kill between the two renames of a replaced checkpoint leaves
            os.replace(newest, newest.with_name(newest.name + ".old"))
        dist.barrier()
        trainer = Trainer(cfg, run_dir=run, resume="auto", progress=False)
        steps = distributed.gather_objects(trainer.step, trainer.env)
        trainer.close()
        assert steps == [4, 4], steps


@pytest.mark.slow
def test_a_kill_between_renames_restores_the_same_step_on_every_rank(tmp_path, corpus):
    from tests.test_trainer import make_cfg

    cfg = make_cfg(corpus, **{"train.max_steps": 4, "train.ckpt_every": 2, "train.batch_size": 2})
    run_ranks(_kill_between_renames_then_resume, cfg, tmp_path / "run")


def _node_local_run_dirs(rank, cfg, tmp):
    from depthlab import UserError

    os.makedirs(tmp / f"node{rank}")
    os.chdir(tmp / f"node{rank}")  # "run" is another directory on each rank, as on node-local disks
    with pytest.raises(UserError, match="rank 1 on .* does not see run directory run as rank 0 does .* one shared "
                                        "filesystem"):
        _train(cfg, "run")


@pytest.mark.slow
def test_a_run_directory_that_ranks_do_not_share_is_one_line(tmp_path, corpus):
    from tests.test_trainer import make_cfg

    run_ranks(_node_local_run_dirs, make_cfg(corpus, **{"train.max_steps": 2}), tmp_path)


# ---------------------------------------------------------------- sharded checkpoints that reshard
def _fsdp_runs_with_cut(rank, cfg, tmp):
    import shutil

    _train(cfg, tmp / "ref2")  # uninterrupted at world 2; its step-3 checkpoint is sharded
    if rank == 0:
        shutil.copytree(tmp / "ref2", tmp / "two_to_two")
        shutil.rmtree(tmp / "two_to_two" / "checkpoints" / "step_0000006")
    dist.barrier()
    for name in ("two_to_two", "one_to_two"):
        _train(cfg, tmp / name, resume="auto")


@pytest.mark.slow
def test_sharded_checkpoints_resume_on_2_1_and_2_ranks_like_the_uninterrupted_run(tmp_path, corpus):
    import shutil

    from depthlab.checkpoint import SHARDS, is_sharded, list_checkpoints, load_weights
    from tests.test_trainer import losses, make_cfg

    six = {"train.max_steps": 6, "train.ckpt_every": 3}
    one = make_cfg(corpus, **six, **{"train.batch_size": 4})
    two = make_cfg(corpus, **six, **{"train.batch_size": 2, "train.parallel": "fsdp"})
    _train(one, tmp_path / "ref1")

    def cut(src, dst):  # the run as a kill after step 3 leaves it
        shutil.copytree(tmp_path / src, tmp_path / dst)
        shutil.rmtree(tmp_path / dst / "checkpoints" / "step_0000006")
        lines = (tmp_path / dst / "metrics.jsonl").read_text().splitlines()[:3]
        (tmp_path / dst / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))

    cut("ref1", "one_to_two")
    run_ranks(_fsdp_runs_with_cut, two, tmp_path)
    ref2 = tmp_path / "ref2"
    step3 = list_checkpoints(ref2)[0]
    assert is_sharded(step3) and len(list((step3 / SHARDS).glob("*.distcp"))) == 2  # each rank its own file
    full = load_weights(step3)  # export / eval read it assembled
    assert full["layers.0.attn.q_proj.weight"].shape == (32, 32)
    from depthlab.cli import main

    assert main(["export", str(step3), str(tmp_path / "hf")]) == 0  # consolidated into one safetensors file
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert main(["eval", "ppl", str(step3)]) == 0
    _layerwise_reads_it_like_whole_model_mode(step3)
    cut("ref2", "two_to_one")
    _train(one, tmp_path / "two_to_one", resume="auto")

    a, b = losses(tmp_path / "ref1"), losses(ref2)
    for run, ref in (("two_to_two", b), ("two_to_one", b), ("one_to_two", a)):
        got = losses(tmp_path / run)
        assert list(got) == [1, 2, 3, 4, 5, 6], run
        assert all(abs(got[s] - ref[s]) < 1e-6 for s in (4, 5, 6)), (run, got, ref)


def _layerwise_reads_it_like_whole_model_mode(ckpt):
    from depthlab.analysis.analyze import Options, analyze, analyze_layerwise
    from depthlab.analysis.calibration import calibration_batches
    from depthlab.analysis.layerwise import load_skeleton
    from depthlab.analysis.run import load_layered
    from tests.test_analysis_layerwise import _close
    from tests.test_analysis_support import TEXT

    whole = load_layered(str(ckpt))
    skel, _, _, _ = load_skeleton(str(ckpt))  # one block in memory, read from the rank files block by block
    assert len(skel.lm.blocks) == 1 and skel.n_layers == whole.lm.n_layers == 3
    batches = calibration_batches(whole.tokenizer, [TEXT], 64, 16, 2, 300)
    a, b = analyze(whole.lm, batches, Options(removal=False, probes=1)), \
        analyze_layerwise(skel, batches, Options(removal=False, probes=1))
    assert _close([s["rms"] for s in a["states"]], [s["rms"] for s in b["states"]])
    assert _close(a["lens"]["kl"], b["lens"]["kl"]) and _close(a["angular"]["all_tokens"], b["angular"]["all_tokens"])


def test_resume_hashes_each_checkpoint_file_once(tmp_path, corpus, monkeypatch):
    from collections import Counter

    from depthlab import checkpoint
    from tests.test_trainer import make_cfg

    cfg = make_cfg(corpus, **{"train.max_steps": 4, "train.ckpt_every": 2})
    _train(cfg, tmp_path / "run")
    checkpoint._VERIFIED.clear()  # a new process
    real, hashed = checkpoint._sha256, Counter()
    monkeypatch.setattr(checkpoint, "_sha256", lambda p: hashed.update([str(p)]) or real(p))
    _train(cfg, tmp_path / "run", resume="auto")
    newest = tmp_path / "run" / "checkpoints" / "step_0000004"
    files = [str(newest / name) for name in checkpoint.verify_checkpoint(newest).files]
    assert files and all(hashed[f] == 1 for f in files), hashed


def _resume_with_shared_verification(rank, cfg, run):
    import json
    from collections import Counter

    from depthlab import UserError, checkpoint
    from depthlab.train.trainer import Trainer

    _train(cfg, run)
    checkpoint._VERIFIED.clear()  # a new process
    real, hashed = checkpoint._sha256, Counter()
    checkpoint._sha256 = lambda p: hashed.update([str(p)]) or real(p)
    trainer = Trainer(cfg, run_dir=run, resume="auto", progress=False)
    trainer.close()
    counts = distributed.gather_objects(hashed, trainer.env)
    newest = run / "checkpoints" / "step_0000004"
    files = [str(newest / name) for name in json.loads((newest / "meta.json").read_text())["files"]]
    total = sum(counts, Counter())
    assert trainer.step == 4 and any("__1_0.distcp" in f for f in files)
    assert all(total[f] == 1 for f in files) and set(total) == set(files), total  # each file once, in all
    assert all(counts), counts  # and both ranks took part
    if rank == 0:  # rank 1's shard of the newest checkpoint, damaged
        with open(newest / "shards" / "__1_0.distcp", "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
    dist.barrier()
    with pytest.raises(UserError) as err:
        Trainer(cfg, run_dir=run, resume=str(newest), progress=False)
    assert str(err.value) == (f"corrupted checkpoint {newest}: shards/__1_0.distcp does not match its checksum; "
                              f"the previous valid checkpoint is {run / 'checkpoints' / 'step_0000002'}")
    trainer = Trainer(cfg, run_dir=run, resume="auto", progress=False)  # auto skips it, on every rank alike
    trainer.close()
    assert distributed.gather_objects(trainer.step, trainer.env) == [2, 2]


@pytest.mark.slow
def test_ranks_share_the_verification_of_a_resumed_checkpoint(tmp_path, corpus):
    from tests.test_trainer import make_cfg

    cfg = make_cfg(corpus, **{"train.max_steps": 4, "train.ckpt_every": 2, "train.batch_size": 2,
                              "train.parallel": "fsdp"})
    run_ranks(_resume_with_shared_verification, cfg, tmp_path / "run")


# ---------------------------------------------------------------- meta-device build
def _schemes():
    from depthlab.model import SCHEMES

    cases = [{"norm_scheme": s} for s in sorted(SCHEMES)]
    cases += [{"norm_scheme": "lns", "gpas": True}, {"norm_scheme": "lns", "tie_embeddings": True},
              {"norm_scheme": "pre", "family": "qwen2", "n_kv_heads": 2}, {"norm_scheme": "lns", "family": "olmo"},
              {"norm_scheme": "lns", "family": "olmo2"}, {"norm_scheme": "deepnorm", "init": "scaled"},
              {"norm_scheme": "lns", "family": "vit", "image_size": 8, "patch_size": 2, "channels": 1,
               "num_classes": 10, "lns_placement": "branch"}]
    return cases


def _all_tensors(model) -> dict:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("case", _schemes(), ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_meta_build_equals_the_eager_build_bitwise(case):
    from depthlab.model import build_model
    from depthlab.model.meta import build_on_meta, materialize
    from tests.conftest import tiny_model_config

    cfg = tiny_model_config(**case)
    torch.manual_seed(3)
    eager = _all_tensors(build_model(cfg))
    after_eager = torch.get_rng_state()
    torch.manual_seed(3)
    model, constants = build_on_meta(cfg)
    materialize(model, torch.device("cpu"), constants)
    meta = _all_tensors(model)
    assert list(meta) == list(eager)
    assert all(torch.equal(meta[k], eager[k]) for k in eager), [k for k in eager if not torch.equal(meta[k], eager[k])]
    assert torch.equal(torch.get_rng_state(), after_eager)  # training's randomness continues identically


def _sharded_build_equals_eager(rank, cfg, tc):
    from depthlab.model import build_model, init

    init.PIECE = 48  # many pieces per parameter, and pieces that straddle the two ranks' shards

    torch.manual_seed(5)
    eager = build_model(cfg).state_dict()
    torch.manual_seed(5)
    env = distributed.init_distributed(torch.device("cpu"))
    module, _ = distributed.build_parallel(cfg, tc, env, torch.device("cpu"))
    full = distributed.full_model_state(module)  # gathered on rank 0
    if rank == 0:
        assert all(torch.equal(full[k], eager[k]) for k in eager), [k for k in eager if not torch.equal(full[k],
                                                                                                      eager[k])]


@pytest.mark.parametrize("scheme", ["lns", "deepnorm"])
@pytest.mark.slow
def test_each_rank_materialises_its_shards_with_the_eager_builds_values(scheme):
    from depthlab.config import TrainConfig
    from tests.conftest import tiny_model_config

    cfg = tiny_model_config(norm_scheme=scheme, vocab_size=99)  # 99 rows: uneven shards over 2 ranks
    run_ranks(_sharded_build_equals_eager, cfg, TrainConfig(parallel="fsdp"))


# ---------------------------------------------------------------- FSDP as the anchors do it, HSDP, the global batch
def _layouts_and_accumulation(rank, cfg, tmp):
    import dataclasses

    from depthlab.train.trainer import Trainer
    from tests.test_trainer import losses

    for replicate in (1, 2):  # FSDP over both ranks; HSDP: 2 groups of 1 (replicated, as across two nodes)
        layout = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, dp_replicate=replicate))
        _train(layout, tmp / f"replicate{replicate}")
    a, b = losses(tmp / "replicate1"), losses(tmp / "replicate2")
    assert list(a) == [1, 2, 3] and all(abs(a[s] - b[s]) < 1e-6 for s in a), (a, b)
    from depthlab.runfolder import read_metrics

    for record in read_metrics(tmp / "replicate1"):  # every rank's own timing and memory, so stragglers show
        assert all(len(record[k]) == 2 for k in ("rank_step_s", "rank_data_s", "rank_peak_mib")), record
        assert all(v > 0 for v in record["rank_peak_mib"])

    bf16 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, dtype="bf16", max_steps=1))
    trainer = Trainer(bf16, run_dir=tmp / "bf16", progress=False)
    policy = trainer.module._get_fsdp_state()._mp_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    x, y = trainer.sampler.next_batch()
    with distributed.grad_sync(trainer.model, False):  # the first of two micro-batches: reduce-scattered at once
        trainer.model(x, targets=y).backward()
    grads = [p.grad for p in trainer.module.parameters()]
    assert all(g is not None and g.to_local().numel() < g.numel() for g in grads if g.numel() > 1)
    trainer.close()


@pytest.mark.slow
def test_fsdp_layouts_agree_bf16_gathers_in_bf16_and_accumulation_keeps_gradients_sharded(tmp_path, corpus):
    from tests.test_trainer import make_cfg

    cfg = make_cfg(corpus, **{"train.max_steps": 3, "train.parallel": "fsdp", "train.global_batch": 8,
                              "train.grad_accum": 2})  # 2 ranks x 2 sequences x 2 micro-batches
    run_ranks(_layouts_and_accumulation, cfg, tmp_path)


def _no_sync_under_compile(rank):
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    compiled = torch.compile(ddp)  # compiles lazily: nothing runs here
    with distributed.grad_sync(compiled, False):
        assert not ddp.require_backward_grad_sync
    assert ddp.require_backward_grad_sync


@pytest.mark.slow
def test_ddp_skips_the_all_reduce_of_early_micro_batches_also_under_compile():
    run_ranks(_no_sync_under_compile)


def test_the_global_batch_sets_the_per_rank_batch():
    from depthlab import UserError
    from depthlab.config import per_rank_batch
    from depthlab.model.families import preset

    olmo = preset("olmo-7b").train
    assert (olmo.parallel, olmo.global_batch, olmo.ckpt_every) == ("fsdp", 512, 1000)
    assert [per_rank_batch(olmo, w) for w in (1, 2, 16, 64)] == [64, 32, 4, 1]
    with pytest.raises(UserError, match="global_batch=512 does not split .* 128 rank"):
        per_rank_batch(olmo, 128)


def test_dry_run_prints_the_plan_and_refuses_one_that_does_not_fit(capsys):
    from depthlab.cli import main

    assert main(["train", "--preset", "olmo-7b", "--dry-run", "--world-size", "16", "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "16 rank(s), fsdp (1 replicate x 16 shard)" in out and "4 sequences per rank x 8" in out
    assert main(["train", "--preset", "olmo-7b", "--dry-run", "--world-size", "16", "--gpu-memory", "80",
                 "--set", "train.parallel=ddp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than --gpu-memory 80: use train.parallel=fsdp" in err[0]
    assert main(["train", "--preset", "olmo-7b", "--dry-run", "--world-size", "128"]) == 2
    assert "does not split" in capsys.readouterr().err


def test_a_filesystem_without_flock_is_one_line(tmp_path, monkeypatch):
    import errno
    import fcntl

    from depthlab import UserError
    from depthlab.ownership import locked

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(UserError, match="cannot lock run directory .* does not support file locks"):
        with locked(tmp_path / "run", "train", "run directory "):
            pass


def _interrupt_one_rank_mid_step(rank, cfg, tmp):
    from depthlab.checkpoint import list_checkpoints
    from depthlab.train.trainer import Trainer

    _train(cfg, tmp / "ref")
    trainer = Trainer(cfg, run_dir=tmp / "run", progress=False)
    if rank == 1:  # Ctrl-C reaches rank 1 alone, inside step 3 (between its backward and its optimizer step)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a background job ignores it)
        real = trainer.train_step

        def train_step():
            out = real()
            if trainer.step == 2:
                os.kill(os.getpid(), signal.SIGINT)
            return out

        trainer.train_step = train_step
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
    finally:
        trainer.close()
    assert [c.name for c in list_checkpoints(tmp / "run")] == ["step_0000003"]  # both ranks stopped after step 3
    _train(cfg, tmp / "run", resume="auto")


@pytest.mark.slow
def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step_with_one_checkpoint(tmp_path, corpus):
    """The ranks agree on the step to stop at: no rank waits forever in a collective the others left, the sharded
    checkpoint of that step is whole, and resuming it gives the uninterrupted run's losses bit for bit."""
    from tests.test_trainer import losses, make_cfg

    cfg = make_cfg(corpus, **{"train.max_steps": 5, "train.batch_size": 2, "train.parallel": "fsdp"})
    run_ranks(_interrupt_one_rank_mid_step, cfg, tmp_path)
    assert list(losses(tmp_path / "run")) == [1, 2, 3, 4, 5]
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")
