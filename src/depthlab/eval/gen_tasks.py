"""Generation tasks as text: prompt and answer pairs, from a built-in family (drawn with a seed) or a jsonl file.

A task is named by a spec:
- `add[:digits=3,n=50,seed=0,shots=3]`: multi-digit addition, "123+456=" -> "579";
- `copy[:len=8,...]`: copying a string of random letters, "copy: qhdkwzay ->" -> " qhdkwzay";
- `brackets[:depth=4,...]`: closing brackets, "( [ < { ->" -> " } > ] )";
- `continue:FILE[,words=32,answer=8,...]`: continuing a held-out text verbatim: `words` words of FILE, then its
  next `answer` words (whitespace as in the file);
- `FILE.jsonl`: one {"prompt": ..., "answer": ...} object a line.
`n` questions (default 50), each after `shots` worked examples of its family (default 3; continue: none), one a
line; `seed` draws them (default 0).
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

from depthlab import UserError
from depthlab.jsonl import json_line
from depthlab.ownership import PathRole

FAMILIES = {"add": {"digits": 3}, "copy": {"len": 8}, "brackets": {"depth": 4}, "continue": {"words": 32, "answer": 8}}
COMMON = {"n": 50, "seed": 0, "shots": 3}
BRACKETS = {"(": ")", "[": "]", "{": "}", "<": ">"}


@dataclass(frozen=True)
class GenTask:
    name: str
    pairs: list[tuple[str, str]]  # (prompt, answer)


def _numbers(spec: str, items: list[str], allowed: dict) -> dict[str, int]:
    got = dict(allowed)
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or key not in allowed:
            raise UserError(f"generation task {spec!r}: {item!r} is not one of {', '.join(f'{k}=N' for k in allowed)}")
        if not value.isdigit() or int(value) < (0 if key in ("seed", "shots") else 1):
            raise UserError(f"generation task {spec!r}: {key} must be a whole number"
                            f"{'' if key in ('seed', 'shots') else ' of at least 1'}, got {value!r}")
        got[key] = int(value)
    return got


def _file_of(spec: str) -> str | None:
    """The file a spec reads (continue:FILE's text, a jsonl file of pairs; anything not a family is read as one),
    None for a drawn family or a continue without one."""
    family, _, rest = spec.partition(":")
    if family not in FAMILIES:
        return spec
    first = rest.split(",")[0]
    return first if family == "continue" and first and "=" not in first else None


def spec_paths(specs) -> list[str]:
    """The files generation task specs read: what the command that takes them may not write over."""
    return [str(Path(f).expanduser()) for f in map(_file_of, map(str, specs)) if f]


TASK_SPECS = PathRole("generation task", reads=True, paths=spec_paths)  # the argparse type of an option taking specs


def read_tasks(specs: list[str], flag: str) -> list[GenTask]:
    """The tasks specs name, each under a name of its own (results are keyed by it): a drawn family's is its spec,
    a jsonl file's its stem, or with the folders that tell it from another file's (depthlab.paths.short_names).
    A task given twice, or two that would share a name, is one line naming `flag`."""
    from depthlab.paths import short_names

    files = [s for s in specs if s.partition(":")[0] not in FAMILIES]
    drawn = [s for s in specs if s not in files]
    for i, spec in enumerate(drawn):
        if spec in drawn[:i]:
            raise UserError(f"{flag} names {spec} twice; give each task once")
    named = dict(zip(files, short_names(files, flag, taken=drawn)))
    return [GenTask(named[s], t.pairs) if s in named else t for s, t in zip(specs, map(read_task, specs))]


def read_task(spec: str) -> GenTask:
    """The task a spec names (module docstring); a bad spec or an unreadable file is one UserError line."""
    family, _, rest = spec.partition(":")
    if family not in FAMILIES:
        if spec.endswith(".jsonl") or Path(spec).is_file():
            return GenTask(Path(spec).stem, read_pairs(Path(spec)))
        raise UserError(f"unknown generation task {spec!r}: give {', '.join(FAMILIES)} (e.g. add:digits=3,n=50) or a "
                        "jsonl file of prompt/answer pairs")
    items = [x for x in rest.split(",") if x] if rest else []
    if family == "continue":
        if _file_of(spec) is None:
            raise UserError(f"generation task {spec!r}: continue needs a text file, continue:FILE[,words=32,...]")
        path, items = Path(items[0]), items[1:]
        p = _numbers(spec, items, {**FAMILIES[family], **COMMON, "shots": 0})
        return GenTask(spec, continuations(spec, _read_text(path), p))
    p = _numbers(spec, items, {**FAMILIES[family], **COMMON})
    rng = random.Random(p["seed"])
    draw = {"add": _add, "copy": _copy, "brackets": _brackets}[family]
    pairs = []
    for _ in range(p["n"]):
        shots = [draw(rng, p) for _ in range(p["shots"])]
        prompt, answer = draw(rng, p)
        pairs.append(("".join(q + a + "\n" for q, a in shots) + prompt, answer))
    return GenTask(spec, pairs)


def _add(rng: random.Random, p: dict) -> tuple[str, str]:
    a, b = (rng.randrange(10 ** (p["digits"] - 1), 10 ** p["digits"]) for _ in range(2))
    return f"{a}+{b}=", str(a + b)


def _copy(rng: random.Random, p: dict) -> tuple[str, str]:
    s = "".join(rng.choice(string.ascii_lowercase) for _ in range(p["len"]))
    return f"copy: {s} ->", f" {s}"


def _brackets(rng: random.Random, p: dict) -> tuple[str, str]:
    opened = [rng.choice(list(BRACKETS)) for _ in range(p["depth"])]
    return " ".join(opened) + " ->", "".join(" " + BRACKETS[b] for b in reversed(opened))


def continuations(spec: str, text: str, p: dict) -> list[tuple[str, str]]:
    """n places drawn in the text (distinct, seeded): `words` words there, and the next `answer` words."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    span = p["words"] + p["answer"]
    starts = range(len(spans) - span + 1)
    if len(starts) < p["n"]:
        raise UserError(f"generation task {spec!r}: the file holds {len(spans)} words, too few for {p['n']} "
                        f"places of {span} words (lower n, words or answer)")
    pairs = []
    for i in sorted(random.Random(p["seed"]).sample(starts, p["n"])):
        cut = spans[i + p["words"] - 1][1]
        pairs.append((text[spans[i][0]:cut], text[cut:spans[i + span - 1][1]]))
    return pairs


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read generation task file {path}: {getattr(e, 'strerror', None) or e}") from None


def read_pairs(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for k, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        obj = json_line(line, f"{path}:{k}")
        if not (isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and isinstance(obj.get("answer"), str)
                and obj["answer"]):
            raise UserError(f"{path}:{k}: expected {{\"prompt\": str, \"answer\": non-empty str}}")
        pairs.append((obj["prompt"], obj["answer"]))
    if not pairs:
        raise UserError(f"{path} holds no prompt/answer pairs")
    return pairs
