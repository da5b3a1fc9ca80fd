"""The package's shape: no import cycle among depthlab's modules nor among its subpackages, no function over 60 lines,
one scheme registry."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """depthlab modules that `name` imports anywhere in its file (inside functions too: a lazy import still ties
    the two modules together). `from pkg import x` counts as importing pkg.x when that is a module, else pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from .x import y` inside package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of nodes (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_lazy_and_relative_imports(tmp_path):
    assert "depthlab.model.schemes" in import_graph()["depthlab.model.transformer"]
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom depthlab import UserError\n\n\ndef f():\n"
                      "    from depthlab.model import schemes\n    from . import init\n")
    known = {"depthlab", "depthlab.model", "depthlab.model.schemes", "depthlab.model.init"}
    assert imports_of("depthlab.model.m", module, known) == {"depthlab", "depthlab.model.schemes",
                                                             "depthlab.model.init"}


def test_no_import_cycle_among_depthlab_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def package_of(module: str) -> str:
    """The node a module counts as in the package graph: its subpackage of depthlab (depthlab.hf.cli: depthlab.hf),
    or itself for a top-level module (depthlab.paths, depthlab.cli, depthlab for __init__.py)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (SRC / Path(*parts)).is_dir() else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed onto packages: A -> B when some module of A imports one of B (lazy imports
    inside functions count, as in the module graph)."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        out.setdefault(package_of(module), set()).update(package_of(d) for d in deps)
    return {p: deps - {p} for p, deps in out.items()}


def test_package_graph_collapses_modules_onto_subpackages():
    assert package_of("depthlab.hf.cli") == "depthlab.hf" == package_of("depthlab.hf")
    assert package_of("depthlab.model.families.llama") == "depthlab.model"
    assert package_of("depthlab.paths") == "depthlab.paths" and package_of("depthlab") == "depthlab"
    # two acyclic modules whose packages import each other: a cycle only the package graph shows
    modules_only = {"depthlab.data.a": {"depthlab.paths"}, "depthlab.paths": {"depthlab.data.b"},
                    "depthlab.data.b": set()}
    assert find_cycle(modules_only) is None
    assert find_cycle(package_graph(modules_only)) == ["depthlab.data", "depthlab.paths", "depthlab.data"]
    graph = package_graph(import_graph())
    assert {"depthlab.data", "depthlab.model", "depthlab.paths"} <= graph["depthlab.train"]
    assert "depthlab.model" in graph["depthlab.hf"] and "depthlab.loading" in graph["depthlab.analysis"]


SIBLINGS = ("depthlab.hf", "depthlab.analysis", "depthlab.train")


def test_hf_analysis_and_train_are_siblings():
    """None of the three command packages imports another's modules: what two of them share (device resolution,
    instruction records, LoRA, loading any model, finding an HF model's blocks) lives in a layer below them."""
    graph = package_graph(import_graph())
    crossing = sorted(f"{a} -> {b}" for a in SIBLINGS for b in graph[a] if b in SIBLINGS)
    assert crossing == []
    offenders = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                       if package_of(m) in SIBLINGS and package_of(d) in SIBLINGS and package_of(d) != package_of(m))
    assert offenders == []


def test_eval_imports_none_of_the_command_packages():
    """depthlab.eval (every scorer, and the `eval` command) sits below hf, analysis and train: none of its modules
    imports theirs, lazily or not, so each of them may import the scorers."""
    offenders = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                       if package_of(m) == "depthlab.eval" and package_of(d) in SIBLINGS)
    assert offenders == []
    assert "depthlab.eval" in package_graph(import_graph())["depthlab.analysis"]


def test_no_import_cycle_among_depthlab_packages():
    """depthlab.data, .hf, .train, .model, .analysis, .study and the top-level modules (each its own node) form a
    DAG: paths, owned, loading and metrics sit below the packages that use them."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, " -> ".join(cycle)


def test_a_step_directory_is_named_in_one_place():
    """checkpoint.step_dir writes a checkpoint directory's name and checkpoint.step_of reads it: no other module
    spells the pattern (as a format string, a glob or a prefix to cut)."""
    spelled = re.compile(r"""["']step_(\{|\*|["'])""")
    offenders = sorted(name for name, path in modules().items()
                       if name != "depthlab.checkpoint" and spelled.search(path.read_text()))
    assert offenders == []


def test_config_is_data_only():
    assert not {m for m in import_graph()["depthlab.config"] if m.startswith("depthlab.model")}


@pytest.mark.parametrize("module", ["depthlab.config", "depthlab.model", "depthlab.model.validate",
                                    "depthlab.model.apply", "depthlab.hf.exporter", "depthlab.analysis.layerwise",
                                    "depthlab.cli", "depthlab.paths", "depthlab.ownership", "depthlab.loading",
                                    "depthlab.metrics", "depthlab.eval.cli"])
@pytest.mark.slow
def test_modules_import_in_isolation(module):
    """Each in a fresh interpreter, so that no earlier import hides an order-dependent cycle."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def long_functions() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_60_lines():
    assert long_functions() == []


def test_no_module_keeps_its_own_list_of_scheme_names():
    """Scheme names appear together (a tuple, list, set or dict of two or more) only in the registry module."""
    from depthlab.model import SCHEMES

    names = set(SCHEMES)
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "schemes.py" and path.parent.name == "model":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            elts = (node.keys if isinstance(node, ast.Dict) else node.elts
                    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [])
            found = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
            if len(found) >= 2:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {sorted(found)}")
    assert offenders == []


# ---------------------------------------------------------------------------------------------------- benchmarks/
ROOT = SRC.parent
BENCH = ROOT / "benchmarks"
STUDY_CODE = ("mean_std", "cv", "verdict", "verdicts", "best_lr", "best_rate", "best_rates", "load_runs", "run_cell",
              "train_cell", "probe", "bootstrap_ci", "binomial_se", "paired_differences", "precondition",
              "standard_error", "deep_over_shallow", "quarters", "claims", "curse_index")


def bench_modules() -> dict[str, Path]:
    return {f"benchmarks.{p.stem}" if p.stem != "__init__" else "benchmarks": p for p in sorted(BENCH.glob("*.py"))}


def test_no_import_cycle_among_depthlab_and_benchmark_modules():
    mods = {**modules(), **bench_modules()}
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_benchmarks_compute_no_metric_statistic_or_runner_of_their_own():
    """The studies' metrics, statistics, verdicts and runner live in depthlab (analysis, study); benchmarks/ only
    declares studies and formats their results. metrics.jsonl is read through depthlab.runfolder.read_metrics."""
    offenders = []
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in STUDY_CODE:
                offenders.append(f"{path.name}:{node.lineno} defines {node.name}")
            if isinstance(node, ast.Constant) and node.value == "metrics.jsonl":
                offenders.append(f"{path.name}:{node.lineno} reads metrics.jsonl by hand")
        if path.stem.endswith("_study") or path.stem == "study_report":
            imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            for banned in sorted(imported & {"statistics", "numpy", "concurrent", "multiprocessing", "torch"}):
                offenders.append(f"{path.name} imports {banned}")
            if path.stem.endswith("_study") and len(path.read_text().splitlines()) > 120:
                offenders.append(f"{path.name} is not a thin script")
    assert offenders == []


def test_ruff_covers_src_tests_and_benchmarks():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed beside this interpreter")
    done = subprocess.run([str(ruff), "check", "src", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def unresolved_imports(paths: dict[str, Path], root: Path = ROOT) -> list[str]:
    """`from depthlab... import x` / `from benchmarks... import x` lines, lazy ones inside functions too, whose x is
    neither an attribute nor a submodule of the module they name (a rename that missed a caller)."""
    import importlib.util

    bad = []
    for path in paths.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in ("depthlab", "benchmarks")):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                submodule = hasattr(module, "__path__") and importlib.util.find_spec(f"{node.module}.{alias.name}")
                if not hasattr(module, alias.name) and not submodule:
                    bad.append(f"{path.relative_to(root)}:{node.lineno}: from {node.module} import {alias.name}")
    return bad


def test_every_import_of_a_depthlab_or_benchmark_name_resolves(tmp_path):
    """A function-level import of a moved name only fails when that function runs (own_rate's composition printout
    did, in a study nobody had started on the new code); read every such import statically instead."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from depthlab.data.dataset import no_such_name\n")
    assert unresolved_imports({"planted": planted}, tmp_path) == ["planted.py:2: from depthlab.data.dataset import "
                                                                  "no_such_name"]
    assert unresolved_imports({**modules(), **bench_modules()}) == []
