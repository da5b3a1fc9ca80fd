"""The docs' scheme tables follow the registry: every registered scheme has its row in the README's table,
docs/method.md's and both export tables of docs/hf.md, which say what the registry (and the scheme's oracle,
tests/scheme_oracles.py) says; and no row names a scheme that is not registered. A new scheme fails here until it
is documented. (The `--help` texts: tests/test_help.py.)"""

import re
from pathlib import Path

import pytest

from depthlab.model import SCHEMES
from tests.scheme_oracles import ORACLES

ROOT = Path(__file__).resolve().parents[1]
NOT_SCHEMES = {"gpas"}  # backticked words of a scheme column that name an add-on, not a scheme


def table_after(text: str, anchor: str) -> list[list[str]]:
    """The cells of the first markdown table after the line holding `anchor` (its header and rule dropped)."""
    lines = text[text.index(anchor):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def named(cell: str) -> set[str]:
    """The plain words in backticks in a table cell: `pre`, `skipinit` / `rezero` (not `model.init=...`)."""
    return {w for w in re.findall(r"`([^`]*)`", cell) if re.fullmatch(r"[a-z0-9_]+", w)} - NOT_SCHEMES


def scheme_rows(path: str, anchor: str) -> dict[str, list[list[str]]]:
    """{scheme: the rows naming it in their first column} of the table after `anchor` in `path`."""
    rows: dict[str, list[list[str]]] = {}
    for row in table_after((ROOT / path).read_text(), anchor):
        for name in named(row[0]):
            rows.setdefault(name, []).append(row)
    return rows


TABLES = [("README.md", "## Normalization schemes"), ("docs/method.md", "### 2.1 Schemes"),
          ("docs/hf.md", "What folds, and what is refused"), ("docs/hf.md", "### ViT export")]


def undocumented(path: str, anchor: str) -> list[str]:
    """What is wrong with the scheme column of one table: schemes missing from it, names that are no scheme."""
    listed = set(scheme_rows(path, anchor))
    return ([f"{path} ({anchor}) has no row for {n}" for n in SCHEMES if n not in listed]
            + [f"{path} ({anchor}) names {n}, which is no registered scheme" for n in sorted(listed - set(SCHEMES))])


@pytest.mark.parametrize("path,anchor", TABLES, ids=[f"{p}:{a}" for p, a in TABLES])
def test_every_scheme_has_a_row_in_each_scheme_table(path, anchor):
    assert undocumented(path, anchor) == []


def test_a_scheme_registered_without_docs_is_reported():
    from depthlab.model.schemes import register

    try:
        register("halfnorm")(type("HalfNorm", (SCHEMES["pre"],), {"__doc__": "x", "supports_gpas": True,
                                                                 "hf_patchable": True, "hf_export": "family"}))
        assert all(any("halfnorm" in line for line in undocumented(*t)) for t in TABLES)
    finally:
        SCHEMES.pop("halfnorm", None)


def test_hf_export_table_says_what_the_registry_does():
    for name, rows in scheme_rows(*TABLES[2]).items():
        cls = SCHEMES[name]
        for row in rows:
            assert (row[1] == "refused") == (cls.hf_export is None), (name, row[1])
            assert ("Gemma-2" in row[1]) == (cls.hf_export == "gemma2"), (name, row[1])


def test_vit_export_table_says_what_the_oracles_do():
    for name, rows in scheme_rows(*TABLES[3]).items():
        for row in rows:
            assert (row[1] == "refused") == (not ORACLES[name].vit_export), (name, row[1])


def test_the_olmo2_lists_are_the_schemes_that_run_on_olmo2():
    runs = {n for n in SCHEMES if ORACLES[n].olmo2}
    method = (ROOT / "docs/method.md").read_text()
    sentence = method[method.index("**Which schemes run on which family.**"):].split("\n\n")[0]
    runs_part = sentence[sentence.index("so it runs"):sentence.index("every other scheme")]
    assert named(runs_part) == runs, runs_part
    families = scheme_rows("docs/hf.md", "### Families")  # keyed by the first column: the family
    schemes_cell = families["olmo2"][0][3]
    assert named(schemes_cell.split(";")[0]) == runs, schemes_cell
