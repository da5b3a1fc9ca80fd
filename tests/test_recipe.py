"""The docs' real-model recipe is one `depthlab analyze` line: run as written (its cache swapped for a tiny GGUF file
and made-up plays, its size for theirs), it gives the numbers of the benchmark that prepares the calibration text
itself (benchmarks/real_model.py: the plays without their licence header, in a folder)."""

import json
import re
import shlex
from pathlib import Path

import pytest

from depthlab.analysis.calibration import gutenberg_body
from depthlab.cli import main
from tests.test_real_model import tiny_cache  # noqa: F401  (a fixture)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "analysis.md"


def recipe() -> list[str]:
    """The command line under the docs' `<!-- recipe -->` marker, without its leading `depthlab`."""
    line = re.search(r"<!-- recipe -->\n```\n(depthlab analyze [^\n]+)\n```", DOCS.read_text()).group(1)
    return shlex.split(line)[1:]


def test_the_licence_header_is_left_out_as_the_benchmark_leaves_it_out():
    import benchmarks.real_model as rm

    play = "The Project Gutenberg EBook\r\nlicence\r\n\r\nACT I\r\nSCENE I. Elsinore.\r\nBERNARDO. Who's there?\r\n"
    assert gutenberg_body(play) == rm.body(play.replace("\r\n", "\n")) == "ACT I\nSCENE I. Elsinore.\nBERNARDO. " \
                                                                          "Who's there?\n"
    assert gutenberg_body("no act here " * 10) == rm.body("no act here " * 10)


@pytest.mark.slow
def test_the_docs_recipe_gives_the_benchmarks_numbers_on_a_tiny_gguf(tiny_cache, tmp_path):  # noqa: F811
    rm, args = tiny_cache
    cache = Path(args[args.index("--cache") + 1])
    a = recipe()
    assert a[0] == "analyze" and "--gutenberg" in a and a[a.index("--tokens") + 1] == "2048"
    a[a.index("--tokens") + 1], a[a.index("--seq-len") + 1] = "128", "32"  # the tiny model's size
    a[a.index("--out") + 1] = str(tmp_path / "recipe")
    a = [x.replace("~/.cache/depthlab/real_model", str(cache)) for x in a]
    assert main(a) == 0
    ours = json.loads((tmp_path / "recipe" / "metrics.json").read_text())

    # the benchmark's way: the plays written without their header into a folder, analyzed with its options
    prose = rm.texts(cache, rm.fetch(cache), tmp_path / "texts")["prose"]
    cmd = rm.analyze_cmd(cache / "model" / rm.GGUF, prose, tmp_path / "bench", rm.argparse.Namespace(tokens=128,
                         seq_len=32), "--drop-lowest", "4", "--lens-tokens", "512")
    assert main(cmd[3:]) == 0
    theirs = json.loads((tmp_path / "bench" / "metrics.json").read_text())
    assert ours["removal"]["base_loss"] == theirs["removal"]["base_loss"]
    assert ours["removal"]["single"] == theirs["removal"]["single"]
    assert ours["curse_index"]["removal_cost"] == theirs["curse_index"]["removal_cost"]
    assert ours["removal"]["drop"] == theirs["removal"]["drop"]
