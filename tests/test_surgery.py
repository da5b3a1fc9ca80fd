"""Model surgery sits above analysis and hf (depthlab.surgery): `depthlab --help`, train and eval load no analysis
code nor scipy, and the command list of `depthlab --help` is the same whether a command module loads or not."""

import subprocess
import sys

import pytest

from depthlab.cli import LAZY_COMMANDS, make_parser

# runs main for each command line in one fresh interpreter, then prints what of analysis and scipy it imported
PROBE = """
import contextlib, io, sys
from depthlab.cli import main
for argv in {commands!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(sorted({{m.split(".")[0] if m.startswith("scipy") else m for m in sys.modules
              if m == "scipy" or m.startswith(("scipy.", "depthlab.analysis"))}}))
"""


def imported_by(*commands: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(commands=list(commands))], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_help_train_and_eval_import_no_analysis_nor_scipy():
    assert imported_by(["--help"], ["train", "--help"], ["eval", "--help"], ["eval", "ppl", "--help"],
                       ["prune", "--help"], ["duplicate", "--help"], ["export", "--help"]) == []
    # the probe sees an import when there is one: analyze's parser is analysis code
    assert "depthlab.analysis.cli" in imported_by(["analyze", "--help"])


def test_the_command_list_is_the_same_with_the_lazy_modules_loaded_or_not():
    whole = make_parser().format_help()
    assert make_parser("").format_help() == whole  # `depthlab --help`: the lazy commands by their listed lines
    for commands in LAZY_COMMANDS.values():
        for command in commands:
            assert make_parser(command).format_help() == whole
            assert command in whole


def test_a_lazy_command_runs_its_own_parser():
    """make_parser(command) builds that command's whole parser: its flags are known, its help is its own."""
    parser = make_parser("compare")
    args = parser.parse_args(["compare", "a", "b", "--labels", "x", "y"])
    assert args.models == ["a", "b"] and args.labels == ["x", "y"] and callable(args.func)
