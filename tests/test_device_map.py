"""Whole-model analysis of a model placed by a device map (accelerate's dispatch) gives the numbers of one device.

This machine has no GPU, so the maps here put some modules on "cpu" and the rest on "disk" (their weights written
to an offload folder and loaded by accelerate's hooks at each forward): that runs the placement itself, the hooks
and the analysis around them, not transfers between GPUs."""

import gc
import json
import subprocess
import sys
import time

import pytest

from depthlab.analysis.analyze import Options
from depthlab.analysis.run import Request, run_request
from depthlab.cli import main
from tests.test_analysis_support import TEXT, save_depthlab_checkpoint, save_hf_model

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

MAP = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
       "model.layers.2": "disk", "model.layers.3": "disk", "model.norm": "disk", "lm_head": "disk"}


def same_numbers(a, b, where=""):
    """Every number of two analyses equal within float tolerance; what they ran on aside."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            if k not in ("wall_s", "run"):
                same_numbers(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_numbers(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6, nan_ok=True), where
    else:
        assert a == b, where


def nothing_in(folder) -> bool:
    """No offloaded weights, no lock left in the offload folder (removed too when the last run out made it)."""
    return not folder.exists() or not any(folder.iterdir())


def write_mc(path):
    path.write_text("".join(json.dumps({"question": f"def f{i}(x):\n    return x * {i} +",
                                       "choices": [str(i % 7), "x", "line"], "answer": 0}) + "\n" for i in range(3)))
    return path


def _analyze(tmp_path, model, out, *extra):
    (tmp_path / "text.txt").write_text(TEXT)
    assert main(["analyze", str(model), "--data", str(tmp_path / "text.txt"), "--tokens", "64", "--seq-len", "32",
                 "--probes", "1", "--no-progress", "--out", str(tmp_path / out), *extra]) == 0
    return json.loads((tmp_path / out / "metrics.json").read_text())


@pytest.mark.slow
def test_cli_map_file_on_cpu_and_disk_gives_the_one_device_numbers(tmp_path):
    hf = save_hf_model(tmp_path / "hf", "llama")
    mc = write_mc(tmp_path / "mc.jsonl")
    (tmp_path / "map.json").write_text(json.dumps(MAP))
    extra = ["--removal-tasks", str(mc)]
    one = _analyze(tmp_path, hf, "one", "--device", "cpu", *extra)
    placed = _analyze(tmp_path, hf, "placed", "--device-map", str(tmp_path / "map.json"), "--offload-folder",
                      str(tmp_path / "offload"), *extra)
    assert placed["run"]["device_map"] == MAP and "device_map" not in one["run"]
    # metrics, Jacobians, removal losses (blocks and spans) and the task removal scores
    assert {"jacobian", "removal", "task_removal"} <= set(one)
    same_numbers(one, placed)
    gc.collect()  # the offloaded weights go with the model
    assert nothing_in(tmp_path / "offload")


def test_strategy_with_max_memory_offloads_and_keeps_a_patched_scheme(tmp_path):
    """`auto` under a small cpu budget puts the later blocks on disk; on an HF model saved under lns (its norm
    weights hold the folded scale, depthlab.model.apply) the offloaded weights are the live, unfolded ones."""
    import transformers

    from depthlab.model.apply import apply_scheme

    hf = save_hf_model(tmp_path / "hf", "llama")
    model = apply_scheme(transformers.AutoModelForCausalLM.from_pretrained(hf), "lns")
    model.save_pretrained(hf)
    (tmp_path / "text.txt").write_text(TEXT)
    req = Request(str(hf), [str(tmp_path / "text.txt")], tokens=64, seq_len=32,
                  options=Options(jacobian=False, sublayers=True, progress=False))
    one = run_request(req)
    placed = run_request(Request(**{**req.__dict__, "device_map": "auto", "max_memory": {"cpu": "100KB"},
                                    "offload_folder": str(tmp_path / "offload")}))
    assert "disk" in placed["run"]["device_map"].values() and "cpu" in placed["run"]["device_map"].values()
    same_numbers(one, placed)


def test_depthlab_checkpoint_placed_with_its_index_at_init(tmp_path):
    ckpt = save_depthlab_checkpoint(tmp_path / "ckpt")
    (tmp_path / "text.txt").write_text(TEXT)
    req = Request(str(ckpt), [str(tmp_path / "text.txt")], tokens=64, options=Options(jacobian=False,
                                                                                      progress=False))
    one = run_request(req)
    placed = run_request(Request(**{**req.__dict__, "device_map": "sequential", "max_memory": {"cpu": "150KB"},
                                    "offload_folder": str(tmp_path / "offload")}))
    assert placed["run"]["device_map"]["layers.0"] == "cpu" and placed["run"]["device_map"]["layers.3"] == "disk"
    assert "at_init" in placed["curse_index"]
    same_numbers(one, placed)


def test_task_scorer_of_a_placed_model(tmp_path):
    """`eval tasks`'s scorer (depthlab.eval.multiple_choice) on a model loaded with a device map: the one-device
    scores."""
    from depthlab.eval.multiple_choice import evaluate_tasks, scorer_for
    from depthlab.loading import load_model

    hf = save_hf_model(tmp_path / "hf", "llama")
    mc = write_mc(tmp_path / "mc.jsonl")
    one = evaluate_tasks(scorer_for(load_model(hf)), mc)
    placed = load_model(hf, device_map=MAP, offload_folder=tmp_path / "offload")
    assert placed.device_map == MAP and str(placed.device) == "cpu"
    same_numbers(one, evaluate_tasks(scorer_for(placed), mc))


@pytest.mark.parametrize("argv, msg", [
    (["--device-map", "auto", "--layer-by-layer"], "--layer-by-layer streams it one block at a time"),
    (["--device-map", "auto", "--device", "cpu"], "--device puts it on one device"),
    (["--max-memory", "cpu=1GiB"], "--max-memory has no effect without --device-map"),
    (["--device-map", "auto", "--max-memory", "cpu:1GiB"], "give DEVICE=SIZE"),
    (["--device-map", "auto", "--max-memory", "cpu=lots"], "'lots' is not a size"),
    (["--device-map", "auto", "--max-memory", "0=1GiB"], "--max-memory cuda:0: this machine has no CUDA device"),
    (["--device-map", "auto", "--max-memory", "cpu=1GiB", "cpu=2GiB"], "'cpu=1GiB' and 'cpu=2GiB' size the same"),
    (["--device-map", "{tmp}/nothing.json"], "neither auto, balanced, sequential nor a readable JSON file"),
    (["--device-map", "{tmp}/list.json"], "must hold a JSON object"),
    (["--device-map", "{tmp}/typo.json"], "has no module 'model.layer.0'"),
    (["--device-map", "{tmp}/gpu.json"], "this machine has no CUDA device"),
    (["--device-map", "{tmp}/partial.json"], "device map: "),
    (["--device-map", "{tmp}/disk.json"], "give an offload folder (--offload-folder DIR)"),
    (["--device-map", "{tmp}/disk.json", "--max-memory", "cpu=1GiB"], "drop --max-memory"),
    (["--device-map", "{tmp}/disk.json", "--offload-folder", "{tmp}/list.json"],
     "--offload-folder {tmp}/list.json is a file; give a folder for the weights the device map puts on disk"),
    (["--device-map", "{tmp}/disk.json", "--offload-folder", "/sys/depthlab-test-offload"],
     "--offload-folder /sys/depthlab-test-offload: cannot create it"),
])
def test_refusals_are_one_line(tmp_path, capsys, argv, msg):
    if "no CUDA device" in msg:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    hf = save_hf_model(tmp_path / "hf", "llama")
    for name, value in (("list", []), ("typo", {**MAP, "model.layer.0": "cpu"}), ("gpu", {"": 0}),
                        ("partial", {"model.embed_tokens": "cpu"}), ("disk", MAP)):
        (tmp_path / f"{name}.json").write_text(json.dumps(value))
    capsys.readouterr()  # what saving the model printed
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["analyze", str(hf), "--out", str(tmp_path / "out"), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert msg.replace("{tmp}", str(tmp_path)) in err and len(err.splitlines()) == 1, err


def test_without_accelerate_the_flag_names_the_package(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # importlib.util.find_spec then finds nothing
    hf = save_hf_model(tmp_path / "hf", "llama")
    assert main(["analyze", str(hf), "--device-map", "auto", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install accelerate" in err and len(err.splitlines()) == 1, err


def test_eval_on_a_placed_model_prints_the_one_device_numbers(tmp_path, capsys):
    """`depthlab eval ppl` and `eval tasks` (and `eval harness`'s loading) take the same map."""
    hf = save_hf_model(tmp_path / "hf", "llama")
    mc = write_mc(tmp_path / "mc.jsonl")
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "map.json").write_text(json.dumps(MAP))
    placed = ["--device-map", str(tmp_path / "map.json"), "--offload-folder", str(tmp_path / "offload")]
    printed = {}
    for name, where in (("one", ["--device", "cpu"]), ("placed", placed)):
        for what in (["--data", str(tmp_path / "text.txt"), "--seq-len", "32"], ["--tasks", str(mc)]):
            kind = "ppl" if what[0] == "--data" else "tasks"
            assert main(["eval", kind, str(hf), *what, *where]) == 0
            printed[name, what[0]] = capsys.readouterr().out
    for what in ("--data", "--tasks"):
        assert printed["one", what] == printed["placed", what] and printed["one", what].strip()
    gc.collect()
    assert nothing_in(tmp_path / "offload")  # the offloaded weights went with the model


def test_eval_with_every_weight_on_disk_reports_its_perplexity(tmp_path, capsys):
    """A map putting the whole model on disk (the model's own device is then "meta"): transformers re-kernelizes
    a model whose train mode changes, which fails on meta, so the evaluation must leave the mode as it found it."""
    hf = save_hf_model(tmp_path / "hf", "llama")
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "disk.json").write_text(json.dumps({"": "disk"}))
    printed = []
    for where in (["--device", "cpu"], ["--device-map", str(tmp_path / "disk.json"), "--offload-folder",
                                        str(tmp_path / "offload")]):
        assert main(["eval", "ppl", str(hf), "--no-progress", "--data", str(tmp_path / "text.txt"), "--seq-len", "32",
                     *where]) == 0, capsys.readouterr().err
        printed.append(capsys.readouterr().out)
    assert "perplexity" in printed[0] and printed[0] == printed[1]


@pytest.mark.parametrize("command", ["eval ppl", "analyze"])
@pytest.mark.slow
def test_the_next_run_clears_the_offload_copy_of_a_killed_one(tmp_path, capsys, command):
    """SIGKILL leaves a run no chance to remove the copy of the weights it offloaded (as large as those weights):
    the next run offloading into the same folder removes it, as the next writer removes a killed one's leftovers."""
    hf = save_hf_model(tmp_path / "hf", "llama")
    (tmp_path / "long.txt").write_text(TEXT * 20)  # a run that lasts long enough to be killed
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "map.json").write_text(json.dumps(MAP))
    offload = tmp_path / "offload"

    def argv(text):
        own = {"eval ppl": [], "analyze": ["--out", str(tmp_path / text) + ".analysis", "--tokens", "64", "--probes",
                                           "1", "--no-removal"]}[command]
        return [*command.split(), str(hf), "--no-progress", "--data", str(tmp_path / text), "--seq-len", "32",
                "--device-map", str(tmp_path / "map.json"), "--offload-folder", str(offload), *own]

    proc = subprocess.Popen([sys.executable, "-m", "depthlab", *argv("long.txt")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (copies := [d for d in offload.iterdir() if (d / "index.json").is_file()] if offload.is_dir() else []):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"never saw the offloaded weights: {proc.communicate()[1]}")
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert proc.returncode == -9 and copies[0].is_dir()  # killed with its copy on disk
    assert main(argv("text.txt")) == 0, capsys.readouterr().err
    gc.collect()
    assert nothing_in(offload), sorted(p.name for p in offload.iterdir())


@pytest.mark.parametrize("argv, msg", [
    (["ppl", "--device-map", "auto", "--device", "cpu"], "--device puts it on one device"),
    (["commonsense", "--device-map", "auto", "--commonsense", "{tmp}"], "unrecognized arguments: --device-map"),
    (["ppl", "--offload-folder", "{tmp}"], "--offload-folder has no effect without --device-map"),
    (["ppl", "--device-map", "auto", "--max-memory", "cpu=1GiB", "cpu=2GiB"], "size the same device"),
])
def test_eval_refusals_are_one_line(tmp_path, capsys, argv, msg):
    hf = save_hf_model(tmp_path / "hf", "llama")
    capsys.readouterr()  # what saving the model printed
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = main(["eval", argv[0], str(hf), *argv[1:]])
    except SystemExit as e:  # argparse's refusal of an option the kind does not take
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err
