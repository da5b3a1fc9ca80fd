"""How far the golden losses move when only the floating-point path changes: the spread that
`python -m depthlab.golden check`'s default tolerance allows (docs/golden.md).

Another machine of the same kind runs the same code with other kernels: another vector width in ATen's
element-wise and reduction kernels, another GEMM kernel in MKL or oneDNN, another split of a reduction across
threads. Each variant below changes one of these on this machine (by the libraries' own environment variables,
read when torch is loaded, so each runs in a child process), trains every golden case for the file's 100 steps,
and is compared with tests/golden/losses.json: per case, the largest absolute difference over the 100 steps.

    python -m benchmarks.golden_spread                 every variant (about 2 minutes each on 2 cores)
    python -m benchmarks.golden_spread --variants "2 threads" --cases pre lns     (added to the file's others)
    python -m benchmarks.golden_spread --cases muon-lns      a new case, beside the cases measured before
    -> benchmarks/results/golden_spread.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from depthlab import golden

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}
VARIANTS = {  # name: (environment, --set overrides)
    "as made": ({}, []),
    "ATen AVX2": ({"ATEN_CPU_CAPABILITY": "avx2"}, []),
    "ATen no SIMD": ({"ATEN_CPU_CAPABILITY": "default"}, []),
    "MKL AVX2": ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, []),
    "oneDNN AVX2": ({"DNNL_MAX_CPU_ISA": "AVX2"}, []),
    "2 threads": ({}, ["train.threads=2"]),
    "AVX2 everywhere, 2 threads": (AVX2, ["train.threads=2"]),
}
OUT = Path(__file__).resolve().parent / "results" / "golden_spread.json"


def run_variant(env: dict, sets: list[str], cases: list[str]) -> dict[str, list[float]]:
    """Every case's 100 losses in a child process with `env` added (depthlab.golden's own `run` command)."""
    with tempfile.TemporaryDirectory(prefix="depthlab-spread-") as tmp:
        out = Path(tmp) / "losses.json"
        subprocess.run([sys.executable, "-m", "depthlab.golden", "run", "--out", str(out), "--cases", *cases,
                        *(a for s in sets for a in ("--set", s))], env={**os.environ, **env}, check=True)
        return json.loads(out.read_text())


def spread(got: list[float], want: list[float]) -> dict:
    diffs = [abs(g - w) for g, w in zip(got, want, strict=True)]
    differ = [i for i, d in enumerate(diffs) if d]
    return {"max_abs_diff": max(diffs), "first_differing_step": differ[0] + 1 if differ else None,
            "steps_differing": len(differ)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.golden_spread", description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--cases", nargs="+", default=list(golden.cases()))
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    want = golden.load_golden()
    before = json.loads(a.out.read_text()) if a.out.is_file() else {}
    earlier = before.get("variants", {})  # --variants adds to them
    now = golden.made_with()
    # a case measured after the file's first run names its own commit; measured_with is that first run's
    result = {"made_with": want["made_with"], "measured_with": before.get("measured_with", now),
              "steps": golden.STEPS, "variants": earlier}
    for name in a.variants:
        env, sets = VARIANTS[name]
        got = run_variant(env, sets, a.cases)
        per_case = {c: {**spread(got[c], want["cases"][c]["losses"]),
                        **({"commit": now["commit"]} if before else {})} for c in a.cases}
        cases = {**earlier.get(name, {}).get("cases", {}), **per_case}  # --cases adds to the variant's others
        result["variants"][name] = {"env": env, "set": sets, "cases": cases,
                                    "max_abs_diff": max(s["max_abs_diff"] for s in cases.values())}
        print(f"{name:28s} max |diff| {result['variants'][name]['max_abs_diff']:.3g}  " + "  ".join(
            f"{c} {s['max_abs_diff']:.2g}" for c, s in per_case.items()), flush=True)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")  # after each variant: a long run keeps its part
    return result


if __name__ == "__main__":
    main()
