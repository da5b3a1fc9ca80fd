"""Every command's --help runs, and the families and schemes it names are the registries' (issue 24)."""

import contextlib
import io
import re

import pytest

from depthlab.cli import main, make_parser
from depthlab.hf.cli import FAMILY_NAMES
from depthlab.model.families import FAMILIES
from depthlab.model.schemes import SCHEMES
from tests.scheme_oracles import names as oracle_names


def help_of(*command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main([*command, "--help"])
    assert e.value.code == 0
    return " ".join(out.getvalue().split())  # argparse wraps lines: compare words


def commands() -> list[list[str]]:
    sub = next(a for a in make_parser()._actions if a.dest == "command")
    out = []
    for name, parser in sub.choices.items():
        out.append([name])
        for action in parser._actions:
            if action.dest.endswith("command") and getattr(action, "choices", None):
                out += [[name, inner] for inner in action.choices]
    return out


@pytest.mark.parametrize("command", commands(), ids=" ".join)
def test_every_help_runs(command):
    assert help_of(*command)


def test_import_help_names_every_family_it_imports():
    types = {t for a in FAMILIES.values() for t in a.hf_model_types}
    assert types <= set(FAMILY_NAMES)
    for text in (help_of("import"), help_of()):
        for t in types:
            assert FAMILY_NAMES[t] in text, (t, text)
    assert "refused: use depthlab.hf.apply_scheme" not in help_of("import")  # Qwen2 biases import


def test_export_help_names_every_class_and_every_exported_scheme():
    text = help_of("export")
    for family in FAMILIES.values():
        assert family.hf_class in text
    for name, cls in SCHEMES.items():
        if cls.hf_export is not None:
            assert name in text, name
        else:  # a refused scheme is not named as exported
            assert not re.search(rf"\b{name}\b", text), name
        if cls.hf_export == "gemma2":
            assert "Gemma2ForCausalLM" in text
    vit = text[text.index("model.family=vit:"):].split(")")[0]
    assert set(re.findall(r"\w+", vit.split(":")[1])) - {"and"} == set(oracle_names(vit_export=True))


def test_train_help_names_every_scheme():
    text = help_of("train")
    assert all(re.search(rf"\b{name}\b", text) for name in SCHEMES)


def test_schemes_lists_the_registry(capsys):
    assert main(["schemes"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert listed == list(SCHEMES)


def test_train_help_names_every_preset():
    from depthlab.model.families import PRESETS

    text = help_of("train")
    for name in PRESETS:
        assert name in text
