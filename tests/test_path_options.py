"""Every option of every depthlab command that names a path says what the command does with it (issue 48 item 1):
its argparse type is one of depthlab.ownership's path roles (INPUT, OUTPUT, FOLDER, PREFIX, CONTINUED), so the
one own-input rule sees it. `prune --analysis DIR` was read but not declared: `prune M DIR --analysis DIR
--drop-lowest K --overwrite` deleted the analysis it had just read. A new option cannot slip through: the walk
below fails for an option whose type is left to argparse's default, and for a plain-text option whose name or
help speaks of a file or folder."""

from __future__ import annotations

import argparse
import re

import pytest

from depthlab import UserError
from depthlab.cli import make_parser
from depthlab.eval.gen_tasks import TASK_SPECS
from depthlab.ownership import CONTINUED, INPUT, UPDATED, PathRole, option_name

COMPANIONS = {"--device-map": ["auto"], "--greedy": []}  # what an option acting only with another needs: the
# other's value (--offload-folder needs --device-map auto; prune's --data a bare --greedy)
PATH_WORDS = re.compile(r"\b(DIR|FILE|PATH|PREFIX|CKPT|file|files|folder|folders|directory|checkpoint)\b")
IN_SPEC = re.compile(r"\b([a-z][\w-]*):(FILE|DIR|PATH)\b")  # a spec naming a path inside it: continue:FILE, hf:DIR


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(the words naming the command, its parser) for every command and subcommand, however deep."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from commands(sub, (*prefix, name))


def valued(parser: argparse.ArgumentParser):
    """The options and positionals of one command that take a value (not flags, help, or a subcommand)."""
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction)]


def test_every_value_an_option_takes_is_declared():
    undeclared, text_paths = [], []
    for words, parser in commands(make_parser()):
        for action in valued(parser):
            where = f"{' '.join(words)} {option_name(action)}"
            if action.type is None and action.choices is None:
                undeclared.append(where)
            elif action.type is str and PATH_WORDS.search(f"{action.metavar or ''} {action.help or ''}"):
                text_paths.append(where)
    # a path: type=depthlab.ownership.INPUT / OUTPUT / FOLDER / PREFIX / CONTINUED / UPDATED; plain text: type=str
    assert undeclared == [], "declare what these options take"
    assert text_paths == [], "these plain-text options speak of files or folders: give them a path role"


def test_every_path_a_spec_names_is_read_by_its_option(tmp_path):
    """A value may name a path inside a spec (`--removal-generate continue:FILE,n=3`): the option's role must find
    the path there, or `--out` over FILE's folder with --overwrite deletes it (issue 60). For every spec an option's
    help shows with a path in it, the role given it reads that path out of such a value."""
    (tmp_path / "f").write_text("x")
    missed, seen = [], 0
    for words, parser in commands(make_parser()):
        for action in valued(parser):
            for prefix, _ in IN_SPEC.findall(action.help or ""):
                seen += 1
                role = action.type
                found = role.paths([f"{prefix}:{tmp_path / 'f'}"]) if isinstance(role, PathRole) and role.reads \
                    else []
                if str(tmp_path / "f") not in found:
                    missed.append(f"{' '.join(words)} {option_name(action)} ({prefix}:...)")
    assert seen >= 2 and missed == [], "these options take specs naming files their role does not read"


def test_generation_specs_name_their_files():
    assert TASK_SPECS.paths(["add:digits=3,n=5", "continue:d/t.txt,n=3", "continue:,n=3", "copy", "p/q.jsonl"]) == \
        ["d/t.txt", "p/q.jsonl"]


def test_the_walk_sees_every_command_and_the_paths_it_read_unchecked():
    """The options the audit of issue 48 found read or written outside the own-input rule are all declared."""
    seen = {" ".join(words): parser for words, parser in commands(make_parser())}
    assert {"train", "eval ppl", "eval images", "eval tasks", "eval harness", "eval mmlu", "eval commonsense",
            "finetune", "export", "prune", "import", "analyze", "compare", "theory", "data prepare",
            "data dedup", "data info", "coord-check", "schemes"} <= set(seen)
    roles = {(c, option_name(a)): a.type for c, p in seen.items() for a in valued(p) if isinstance(a.type, PathRole)}
    for found in [("prune", "--analysis"), ("import", "--tokenizer"), ("train", "--config"), ("coord-check",
                  "--config"), ("eval tasks", "--tasks"), ("eval commonsense", "--commonsense"), ("eval mmlu",
                  "--mmlu"), ("eval commonsense", "--mmlu"), ("eval harness", "--harness"), ("eval ppl",
                  "--device-map"), ("analyze", "--removal-tasks"), ("analyze",
                  "--removal-mmlu"), ("analyze", "--removal-commonsense"), ("analyze", "--device-map"),
                  ("compare", "--device-map"), ("data dedup", "INPUT"), ("data info", "PATH")]:
        assert roles[found] is INPUT, found
    for found in [("analyze", "--removal-generate"), ("compare", "--removal-generate"), ("prune", "--generate")]:
        assert roles[found] is TASK_SPECS, found
    assert roles[("train", "--resume")] is roles[("finetune", "--resume")] is CONTINUED
    assert all(roles[(f"eval {kind}", "--card")] is UPDATED for kind in ("ppl", "images", "tasks", "mmlu",
                                                                          "commonsense"))  # read, README.md rewritten
    for command in ("eval ppl", "eval images", "eval tasks", "eval harness", "analyze", "compare"):
        assert roles[(command, "--offload-folder")].refuses == ("is", "is inside")


def argv_for(words: tuple[str, ...], parser, fill: dict) -> list[str]:
    """A command line giving every required option and positional of `parser` a value (`fill`: action -> value)."""
    argv = list(words)
    for action in valued(parser):
        if action in fill or action.required:
            value = fill.get(action, "unused")
            argv += [value] if not action.option_strings else [action.option_strings[0], value]
    return argv


def pairs():
    """(command words, written option, read option) for every command: each pair the own-input rule judges."""
    for words, parser in commands(make_parser()):
        opts = valued(parser)
        for w in opts:
            if isinstance(w.type, PathRole) and w.type.refuses:
                for r in opts:
                    if isinstance(r.type, PathRole) and r.type.reads:
                        yield pytest.param(words, option_name(w), option_name(r), id=f"{'-'.join(words)}"
                                           f"{option_name(w)}-in{option_name(r)}")


@pytest.mark.parametrize("words, written, read", list(pairs()))
def test_every_written_path_inside_every_read_one_is_refused_before_the_command_runs(tmp_path, words, written,
                                                                                      read):
    """Each pair of (what a command writes, what it reads), the written path inside the read folder: refused in one
    line that names both options, whatever the command; nothing is read or made."""
    parser = dict(commands(make_parser()))[words]
    opts = {option_name(a): a for a in valued(parser)}
    (tmp_path / "in").mkdir()
    argv = argv_for(words, parser, {opts[read]: str(tmp_path / "in"), opts[written]: str(tmp_path / "in" / "x")})
    for needed, flags in getattr(parser, "only_with", []):  # an option that acts only with another gets it
        if (written in flags or read in flags) and needed not in (read, written):
            argv += [needed, *COMPANIONS.get(needed, [])]
    args = make_parser().parse_args(argv)
    with pytest.raises(UserError) as refused:
        args.func(args)
    message = str(refused.value)
    assert f"{written} {tmp_path}/in/x is inside {' '.join(words)}'s own input {read} {tmp_path}/in" in message
    assert message.endswith(f"choose another {written}") and sorted(p.name for p in tmp_path.rglob("*")) == ["in"]
