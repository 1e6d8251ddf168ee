"""Every data file is checked where it is read (issue #41, item 2): one reader per format
(`rf_eval.files.data_files`), each bad file named with its line (or byte offset) and the field, through
every task reader that uses them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rf_eval.errors import UserError
from rf_eval.files import data_files
from rf_eval.tasks import keytoken_files, longbench_cot, ruler_data

TEXT = {"text": str}

# (file name, bytes, reader, what the message must say): one row per class of bad file
BAD_FILES = [
    ("docs.jsonl", b'{"text": "a"}\n{"text": "b",}\n', lambda p: data_files.read_jsonl(p, TEXT),
     ["docs.jsonl:2: not JSON (", "at column 14", "each line must be one JSON object"]),
    ("docs.jsonl", b'{"text": "a"}\n\n{"body": "b"}\n', lambda p: data_files.read_jsonl(p, TEXT),
     ['docs.jsonl:3: each line must be one JSON object with {"text": ...}; this one has no "text" field']),
    ("docs.jsonl", b'{"text": 7}\n', lambda p: data_files.read_jsonl(p, TEXT),
     ['docs.jsonl:1: ', 'its "text" is a number, not a string']),
    ("docs.jsonl", b'{"text": "a"}\n["a"]\n', lambda p: data_files.read_jsonl(p, TEXT),
     ["docs.jsonl:2: ", "this one is a list, not a JSON object"]),
    ("docs.jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', lambda p: data_files.read_jsonl(p, TEXT),
     ["docs.jsonl:2: not UTF-8 text (byte 0xe9 at byte offset 27)", "save the file as UTF-8"]),
    ("essay.txt", b"first line\nsecond \xff line\n", data_files.read_text,
     ["essay.txt:2: not UTF-8 text (byte 0xff at byte offset 18)"]),
    ("items.json", b'[\n  {"a": 1},\n  {"a": 2', data_files.read_json,
     ["items.json:3: not JSON (", "the file must be one JSON document"]),
    ("items.json", b'{"a": 1}', lambda p: data_files.check_items(data_files.read_json(p), TEXT, p),
     ["items.json: the file must be a JSON list of records; it holds an object"]),
    ("items.json", b'[{"text": "a"}, {"txt": "b"}]', lambda p: data_files.check_items(data_files.read_json(p), TEXT, p),
     ['items.json: item 1: ', 'this one has no "text" field']),
]


@pytest.mark.parametrize("name, content, read, says", BAD_FILES)
def test_a_bad_file_is_named_with_its_line_and_field(tmp_path, name, content, read, says):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UserError) as err:
        read(path)
    message = str(err.value)
    assert message.startswith(str(tmp_path)), message  # the file, as given
    for part in says:
        assert part in message, message


@pytest.mark.parametrize("make, says", [
    (lambda p: p / "none", "essays: folder {p}/none does not exist"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "essays: folder {p}/empty holds no .txt files"),
    (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "essays: {p}/f.txt is not a folder"),
])
def test_a_missing_or_empty_folder_names_the_path(tmp_path, make, says):
    with pytest.raises(data_files.DataFileError, match="^" + says.format(p=tmp_path) + "$"):
        data_files.folder_files(make(tmp_path), (".txt",), "essays")


def test_good_files_read_back(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x", "id": 3}\n\n{"text": "y"}\n', encoding="utf-8")
    assert [n for n, _ in data_files.iter_jsonl(tmp_path / "a.jsonl", TEXT)] == [1, 3]
    (tmp_path / "b.txt").write_text("café", encoding="utf-8")
    assert data_files.read_text(tmp_path / "b.txt") == "café"
    with pytest.raises(data_files.DataFileError, match="^docs: .*nope.txt does not exist$"):
        data_files.read_text(tmp_path / "nope.txt", "docs")


# ---- the task readers


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def _other_task_samples(path: Path) -> Path:
    """A longbench_v2_cot samples file: a key_reference that is not a keytoken_nll run."""
    line = {"doc_id": 0, "doc": {"doc_id": "item0000"}, "filtered_resps": ["The correct answer is (B)"]}
    return _write(path, json.dumps(line) + "\n")


KEYTOKEN_BAD = [
    # docs: a folder with one bad .jsonl beside good .txt documents
    (lambda p: (_write(p / "d/a.txt", "ok"), _write(p / "d/b.jsonl", '{"text": "x"}\n{"text": "y"\n'))[0].parent,
     keytoken_files.load_documents, ["d/b.jsonl:2: not JSON ("]),
    (lambda p: _write(p / "d/b.jsonl", '{"id": "1", "body": "x"}\n'),
     keytoken_files.load_documents, ['d/b.jsonl:1: ', 'no "text" field']),
    (lambda p: _write(p / "d/a.txt", b"text \x80 more").parent,
     keytoken_files.load_documents, ["d/a.txt:1: not UTF-8 text (byte 0x80 at byte offset 5)"]),
    (lambda p: _write(p / "d/b.jsonl", '{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n'),
     keytoken_files.load_documents, ["d/b.jsonl:2: document id 'x' is also the id of ", "d/b.jsonl:1"]),
    (lambda p: (p / "d").mkdir() or p / "d",
     keytoken_files.load_documents, ["docs: folder ", "/d holds no .txt or .jsonl files"]),
    # key_reference: another task's samples, a line without the document, not JSON
    (lambda p: _other_task_samples(p / "samples_longbench.jsonl"), keytoken_files.read_reference,
     ["samples_longbench.jsonl:1: filtered_resps[0]: ", "is not a keytoken_nll response",
      "samples file (--log_samples) of an exact keytoken_nll run"]),
    (lambda p: _write(p / "s.jsonl", '{"filtered_resps": []}\n'), keytoken_files.read_reference,
     ['s.jsonl:1: ', 'this one has no "doc" field']),
    (lambda p: _write(p / "s.jsonl", '{"doc": {"doc_id": "a"}, "filtered_resps": ["{\'tokens\': [1]}"]}\n'),
     keytoken_files.read_reference, ['s.jsonl:1: filtered_resps[0]: ', 'this one has no "logprobs" field']),
    (lambda p: _write(p / "s.jsonl", "{not json}\n"), keytoken_files.read_reference, ["s.jsonl:1: not JSON ("]),
    (lambda p: _write(p / "s.jsonl", "\n"), keytoken_files.read_reference, ["s.jsonl: no samples in the file"]),
]


@pytest.mark.parametrize("make, read, says", KEYTOKEN_BAD)
def test_keytoken_files_name_the_file_line_and_field(tmp_path, make, read, says):
    with pytest.raises(UserError) as err:
        read(make(tmp_path))
    for part in says:
        assert part in str(err.value), str(err.value)


def _items(n: int = 2) -> list[dict]:
    return [{"_id": f"i{i}", "domain": "d", "sub_domain": "s", "difficulty": "easy", "length": "short",
             "question": "q", "choice_A": "a", "choice_B": "b", "choice_C": "c", "choice_D": "d",
             "answer": "A", "context": "text"} for i in range(n)]


LONGBENCH_BAD = [
    (lambda p: _write(p / "lb.json", json.dumps(_items(), indent=1)[:200]), ["lb.json:", ": not JSON (",
                                                                            "a truncated download?"]),
    (lambda p: _write(p / "lb.json", json.dumps([_items()[0], {**_items()[0], "question": None}])),
     ['lb.json: item 1: ', 'its "question" is null, not a string']),
    (lambda p: _write(p / "lb.json", json.dumps([{k: v for k, v in _items()[0].items() if k != "context"}])),
     ['lb.json: item 0: ', 'this one has no "context" field']),
    (lambda p: _write(p / "lb.json", json.dumps([{**_items()[0], "answer": "E"}])),
     ["lb.json: item 0: \"answer\" is 'E'; LongBench v2 uses 'A', 'B', 'C', 'D'"]),
    (lambda p: _write(p / "lb.jsonl", "\n".join(json.dumps(i) for i in _items()) + '\n{"_id": "x"}\n'),
     ['lb.jsonl:3: ', 'this one has no "domain" field']),
]


@pytest.mark.parametrize("make, says", LONGBENCH_BAD)
def test_longbench_items_are_checked_where_read(tmp_path, make, says):
    with pytest.raises(UserError) as err:
        longbench_cot.load_items(make(tmp_path))
    for part in says:
        assert part in str(err.value), str(err.value)


@pytest.mark.parametrize("cot, ans, says", [
    (b"D: $DOC$ Q: $Q$ \xfe", "Q: $Q$ R: $COT$", "0shot_cot.txt:1: not UTF-8 text (byte 0xfe at byte offset 16)"),
    ("Q: $Q$ only", "Q: $Q$ R: $COT$", "0shot_cot.txt has no $DOC$ placeholder"),
    ("D: $DOC$ Q: $Q$", "Q: $Q$", "0shot_cot_ans.txt has no $COT$ placeholder"),
])
def test_longbench_prompt_files_are_checked(tmp_path, cot, ans, says):
    _write(tmp_path / "0shot_cot.txt", cot)
    _write(tmp_path / "0shot_cot_ans.txt", ans)
    with pytest.raises(UserError, match=re.escape(says)):
        longbench_cot.load_templates(tmp_path)


ESSAYS_BAD = [
    (lambda p: p / "none", "essay_haystack: ", "none does not exist"),
    (lambda p: (p / "e").mkdir() or p / "e", "essay_haystack: folder ", "e holds no .txt files"),
    (lambda p: _write(p / "e/a.txt", b"good").parent and _write(p / "e/b.txt", b"\xc3(").parent,
     "e/b.txt:1: not UTF-8 text (byte 0xc3 at byte offset 0)", ""),
    (lambda p: _write(p / "e.jsonl", '{"text": "a"}\n{"txt": "b"}\n'), "e.jsonl:2: ", 'no "text" field'),
    (lambda p: _write(p / "e.json", '{"body": ["a"]}'), "e.json: ", 'this one has no "text" field'),
    (lambda p: _write(p / "e.json", '[{"text": "a"}, {"text": 2}]'), "e.json: item 1: ", 'its "text" is a number'),
]


@pytest.mark.parametrize("make, first, then", ESSAYS_BAD)
def test_essay_haystacks_are_checked_where_read(tmp_path, make, first, then):
    with pytest.raises(UserError) as err:
        ruler_data.load_essays(make(tmp_path))
    assert first in str(err.value) and then in str(err.value), str(err.value)


def test_essay_parquet_without_text_column(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame({"body": ["a"]}).to_parquet(tmp_path / "e.parquet")
    with pytest.raises(UserError, match=r'e\.parquet: no "text" column \(columns: body\)'):
        ruler_data.load_essays(tmp_path / "e.parquet")
    _write(tmp_path / "f.parquet", b"not parquet")
    with pytest.raises(UserError, match=r"essay_haystack: .*f\.parquet is not a readable parquet file"):
        ruler_data.load_essays(tmp_path / "f.parquet")


# ---- through the tasks as lm-eval builds them


def test_keytoken_nll_refuses_a_bad_documents_file_as_lm_eval_builds_it(tiny_llama, th, tmp_path):
    docs = _write(tmp_path / "docs/long.jsonl", '{"text": "one"}\n{"text": "two" "three"}\n')
    with pytest.raises(UserError, match=r"docs/long\.jsonl:2: not JSON \(Expecting ',' delimiter at column 16\)"):
        th.load_task("keytoken_nll", {"pretrained": tiny_llama, "docs": str(docs.parent)})


def test_longbench_refuses_a_truncated_dataset_as_lm_eval_builds_it(task_data, tiny_llama, th, tmp_path):
    whole = task_data["longbench"].read_text()
    cut = _write(tmp_path / "longbench_v2.json", whole[: len(whole) // 2])
    with pytest.raises(UserError, match=r"longbench_v2\.json:1: not JSON \(.*\); the file must be one JSON document"):
        th.load_task("longbench_v2_cot", {"pretrained": tiny_llama, "data": str(cut)})


def test_lm_eval_prints_a_bad_documents_line_as_one_line(th, tiny_llama, tmp_path):
    """The user's command: `lm_eval ... --tasks keytoken_nll` on a docs file with a bad line stops with one
    line naming the file and line, exit status 2, no traceback."""
    docs = _write(tmp_path / "docs.jsonl", '{"text": "one"}\n{"body": "two"}\n')
    args = ["--model", "ridgefill", "--model_args", f"pretrained={tiny_llama},fill=exact,device=cpu",
            "--tasks", "keytoken_nll", "--metadata", json.dumps({"docs": str(docs)}), "--limit", "1",
            "--device", "cpu"]
    out = tmp_path / "run"
    out.mkdir()
    proc = th.start_lm_eval(args, out, {})
    proc.wait(timeout=600)
    log = (tmp_path / "run.log").read_text()
    assert proc.returncode == 2, log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("rf-eval: ")]
    assert lines == [f'rf-eval: {docs}:2: each line must be one JSON object with {{"text": ...}}; '
                     'this one has no "text" field'], log[-3000:]
    assert "Traceback" not in log


def test_a_local_qa_source_that_is_not_json_names_the_file(tmp_path):
    """RULER QA reads `squad_json` through lm-eval's `download_json`, routed to the local file."""
    bad = _write(tmp_path / "squad.json", '{"version": "v2.0",\n "data": [')
    with ruler_data.local_sources({"squad_json": str(bad)}, "ruler_qa_squad"):
        qa = ruler_data.ruler_module("qa_utils")
        with pytest.raises(UserError, match=r"squad\.json:2: not JSON \(Expecting value at column 11\)"):
            qa.download_json("https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json")
    with ruler_data.local_sources({"squad_json": str(tmp_path / "none.json")}, "ruler_qa_squad"):
        with pytest.raises(UserError, match=r"^squad_json: .*none\.json does not exist$"):
            ruler_data.ruler_module("qa_utils").download_json("https://example.org/dev.json")


@pytest.mark.parametrize("manifest, says", [
    ('{"sources": {', r"manifest\.json:1: not JSON \(Expecting property name enclosed in double quotes at column 14\)"),
    ('{"files": []}', r'manifest\.json: a fetch-data manifest holds \{"sources": \{\.\.\.\}\} .*; this one has no "sources"'),
])
def test_fetch_data_names_a_bad_manifest(tmp_path, manifest, says):
    from rf_eval.tasks import data_fetch

    _write(tmp_path / "data" / "manifest.json", manifest)
    with pytest.raises(UserError, match=says):
        data_fetch.fetch(["keytoken_nll"], tmp_path / "data", log=lambda line: None)  # downloads nothing
