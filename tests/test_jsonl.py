"""Every reader of the JSON-lines records depthlab writes (metrics.jsonl, a study's runs.jsonl and probes.jsonl,
coord_check.jsonl) is depthlab.jsonl.read_jsonl, with one behaviour: a last line cut short by a killed writer is
skipped with a warning, any other bad line is one error naming file:line. The JSON-lines files a person gives
(training text, fine-tuning records, multiple-choice and generation tasks) are parsed by depthlab.jsonl.json_line:
every bad line is that error."""

import json

import pytest

from depthlab import UserError
from depthlab.data import instructions
from depthlab.data.sources import file_documents
from depthlab.eval.gen_tasks import read_pairs
from depthlab.eval.multiple_choice import read_tasks
from depthlab.jsonl import read_jsonl
from depthlab.runfolder import read_metrics
from depthlab.study.records import load_records
from depthlab.study.runner import load_probes
from depthlab.train.coordcheck import RECORDS, read_records

RECORD = {"step": 1, "name": "a", "depth": 2, "seed": 0, "variant": "pre", "lr": 0.01, "update": [0.1],
          "ratio": [0.1], "rms": [1.0]}  # the keys every one of them needs
READERS = {"metrics.jsonl": read_metrics, "runs.jsonl": load_records, "probes.jsonl": load_probes,
           RECORDS: lambda path: read_records(path.parent)}


@pytest.mark.parametrize("name", READERS)
def test_every_records_reader_reads_alike(tmp_path, capsys, name):
    path, read = tmp_path / name, READERS[name]
    good = json.dumps(RECORD) + "\n"
    path.write_text(good + good[:20])  # a writer killed mid-line
    assert len(read(path)) == 1 and "its last line was cut short" in capsys.readouterr().err
    for text, where in ((good[:20] + "\n" + good, ":1: not a JSON record"),  # broken, not the last line
                        (good + "[1, 2]\n", ":2: not a JSON record"),
                        (good + "\udcff\udcfe\n" + good, ":2: not a JSON record")):  # bytes that are not UTF-8
        path.write_bytes(text.encode(errors="surrogateescape"))
        with pytest.raises(UserError) as e:
            read(path)
        assert str(e.value) == f"{path}{where}"
    assert read(tmp_path / "missing" / name) in ([], {})


def test_a_record_without_a_key_its_reader_needs_is_a_bad_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"step": 1}\n{"loss": 2.0}\n\n')
    assert read_jsonl(path) == [{"step": 1}, {"loss": 2.0}]
    with pytest.raises(UserError, match=r"x.jsonl:2: a record without 'step'$"):
        read_jsonl(path, need=("step",))


# the JSON-lines files a person gives: every broken line is an error, the last one too
PERSON_READERS = {  # what reads the file, and a good line for it
    "training text": (lambda p: list(file_documents(str(p))), {"text": "a"}),
    "fine-tuning records": (instructions.read_records, {"instruction": "say", "input": "", "output": "fox"}),
    "multiple-choice tasks": (read_tasks, {"question": "q", "choices": ["a", "b"], "answer": 0}),
    "generation pairs": (read_pairs, {"prompt": "p", "answer": "a"})}


@pytest.mark.parametrize("name", PERSON_READERS)
@pytest.mark.parametrize("bad,why", [
    ('{"text": "a"', "not JSON (Expecting ',' delimiter at column 13)"),
    ('{"text": ' + "[" * 100_000, "not JSON that a record can be (nested too deeply)")])
@pytest.mark.parametrize("last", [True, False], ids=["last", "middle"])
def test_a_broken_line_of_a_persons_file_is_the_same_error_in_every_reader(tmp_path, name, bad, why, last):
    """A person's file is no record of ours that a kill could have cut: its last line is not forgiven. A line nested
    too deeply was a RecursionError traceback from the training-text and the task readers."""
    read, good = PERSON_READERS[name]
    path, good = tmp_path / "given.jsonl", json.dumps(good) + "\n"
    path.write_text(good + bad + ("" if last else "\n" + good))
    with pytest.raises(UserError) as e:
        read(path)
    assert str(e.value) == f"{path}:2: {why}"
