"""`rf-eval overlap` and `rf_eval.study.overlap` (issue #42, item 6): the check of RidgeFill Appendix G, calibration
texts vs evaluation texts by whole-text sha256 and by shared runs of N (default 50) or more words."""

from __future__ import annotations

import hashlib
import json
import random
import sys
import unicodedata

import numpy as np
import pytest

import rf_eval.study.word_runs as word_runs
from rf_eval.cli import main
from rf_eval.files.outputs import MARKER
from rf_eval.study.overlap import EXCERPT_WORDS, OverlapError, Text, find_overlap
from rf_eval.study.word_runs import words_of


def filler(prefix: str, n: int) -> list[str]:
    """`n` words that occur nowhere else (so a planted run cannot grow by chance)."""
    return [f"{prefix}{i}" for i in range(n)]


def planted(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"run{seed}_{rng.randrange(10**6)}" for _ in range(n)]


def pair_with(run: list[str], cal_at: int = 300, eval_at: int = 1000) -> tuple[Text, Text]:
    """A calibration and an evaluation text that share exactly `run`, at word `cal_at` and `eval_at`."""
    cal = filler("c", cal_at) + run + filler("cc", 200)
    ev = filler("e", eval_at) + run + filler("ee", 500)
    return Text("cal.txt", " ".join(cal)), Text("docs/a.txt", " ".join(ev))


def excerpt_of(run: list[str]) -> str:
    return " ".join(run[:EXCERPT_WORDS]) + (" ..." if len(run) > EXCERPT_WORDS else "")


def longest_common_run(a: list[str], b: list[str]) -> int:
    """Brute force: the longest k with a[i:i+k] == b[j:j+k] for some i, j (dynamic programming)."""
    best, previous = 0, [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


@pytest.mark.parametrize("length, words, found", [(50, 50, True), (49, 50, False), (73, 50, True), (73, 10, True),
                                                  (73, 73, True), (73, 74, False), (5, 5, True)])
def test_a_planted_run_is_found_with_its_exact_length_where_and_excerpt(length, words, found):
    run = planted(length)
    cal, ev = pair_with(run)
    result = find_overlap([cal], [ev], words)
    assert result.found is found and not result.identical
    if not found:
        assert result.pairs == () and result.longest == 0 and result.line().startswith("no overlap")
        return
    (pair,) = result.pairs
    assert (pair.calibration, pair.evaluation, pair.words, pair.runs) == ("cal.txt", "docs/a.txt", length, 1)
    assert (pair.calibration_word, pair.evaluation_word) == (300, 1000)
    assert pair.excerpt == excerpt_of(run)
    assert result.longest == length and f"longest {length} words" in result.line()


def test_identical_texts_match_by_hash_also_when_shorter_than_the_rule():
    short = "a calibration note of nine words, much shorter than fifty"
    long = " ".join(planted(80))
    result = find_overlap([Text("c1", short), Text("c2", long), Text("c3", "other text")],
                          [Text("e1", long), Text("e2", short + " ")], 50)
    assert [(i.calibration, i.evaluation, i.sha256) for i in result.identical] == [
        ("c2", "e1", hashlib.sha256(long.encode()).hexdigest())]  # "short " is another text: no hash match
    assert [(p.calibration, p.evaluation, p.words) for p in result.pairs] == [("c2", "e1", 80)]
    only_short = find_overlap([Text("c1", short)], [Text("e1", short)], 50)
    assert only_short.pairs == () and len(only_short.identical) == 1 and only_short.found


def test_words_are_nfkc_whitespace_split_and_case_folded_with_punctuation_kept():
    run = planted(60)
    cal = " ".join(filler("c", 20) + run + filler("cc", 20))
    respaced = "\n\t ".join(w.upper() for w in run)  # other whitespace, other case: the same words
    wide = unicodedata.normalize("NFKC", "\uff32\uff35\uff2e")  # fullwidth "RUN" folds to "RUN"
    assert wide == "RUN"
    ev = " ".join(filler("e", 5)) + "  " + respaced + "\u3000" + " ".join(filler("ee", 5))
    (pair,) = find_overlap([Text("c", cal)], [Text("e", ev)], 50).pairs
    assert (pair.words, pair.calibration_word, pair.evaluation_word) == (60, 20, 5)
    assert pair.excerpt == excerpt_of(run)  # the calibration text's words, as written
    punctuated = " ".join(run[:30]) + ". " + " ".join(run[30:])  # "word." is another word than "word"
    assert find_overlap([Text("c", cal)], [Text("e", punctuated)], 50).pairs == ()
    assert words_of("\uff21b\u00a0c\u2003d\n") == ["Ab", "c", "d"]


def test_no_character_changes_whitespace_under_nfkc_and_case_folding():
    """`_ids` folds whole texts before splitting them: that keeps every word in its place only if no
    character's NFKC form or case fold adds or removes whitespace."""
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        normal = unicodedata.normalize("NFKC", chr(cp))
        assert len(normal.split()) == len(normal.casefold().split()), hex(cp)
        assert (normal.strip() == "") == (normal.casefold().strip() == ""), hex(cp)


def test_several_runs_in_one_pair_are_counted_and_the_longest_reported():
    first, second = planted(55, seed=1), planted(90, seed=2)
    cal = filler("c", 10) + first + filler("x", 10) + second + filler("y", 10)
    ev = filler("e", 10) + second + filler("z", 10) + first + filler("w", 10) + first
    (pair,) = find_overlap([Text("c", " ".join(cal))], [Text("e", " ".join(ev))], 50).pairs
    assert (pair.words, pair.runs, pair.calibration_word, pair.evaluation_word) == (90, 3, 75, 10)


def test_every_hash_colliding_proposes_alignments_but_only_equal_words_make_runs(monkeypatch):
    """A hit only proposes an alignment: with every window hashed alike, the words decide, and the result is
    the true one."""
    texts = [pair_with(planted(73, seed=s), cal_at=40 + s, eval_at=60 + 2 * s) for s in range(3)]
    cals, evs = [c for c, _ in texts], [Text(f"e{i}", e.text) for i, (_, e) in enumerate(texts)]
    honest = find_overlap(cals, evs, 50)
    monkeypatch.setattr(word_runs, "_windows", lambda ids, values, n: np.zeros(max(len(ids) - n + 1, 0), np.uint64))
    monkeypatch.setattr(word_runs, "MAX_OCCURRENCES", 10**9)
    colliding = find_overlap(cals, evs, 50)
    assert colliding == honest and len(honest.pairs) == 3  # cal.txt is every calibration text's name
    assert sorted(p.words for p in honest.pairs) == [73, 73, 73]


@pytest.mark.parametrize("seed", range(6))
def test_runs_agree_with_brute_force_on_random_small_vocabulary_text(seed):
    """Text over 3 words repeats windows often: every pair's longest run equals the brute-force longest
    common run whenever that is >= N, and no other pair is reported."""
    rng = random.Random(seed)
    vocab, n = ["x", "y", "z"], 6
    cals = [Text(f"c{i}", " ".join(rng.choices(vocab, k=rng.randint(0, 80)))) for i in range(4)]
    evs = [Text(f"e{i}", " ".join(rng.choices(vocab, k=rng.randint(0, 80)))) for i in range(4)]
    got = {(p.calibration, p.evaluation): p.words for p in find_overlap(cals, evs, n).pairs}
    want = {(c.name, e.name): k for c in cals for e in evs
            if (k := longest_common_run(c.text.split(), e.text.split())) >= n}
    assert got == want and want  # the seeds give overlapping pairs


@pytest.mark.parametrize("words", [0, -1, 2.5, True])
def test_find_overlap_refuses_a_run_length_that_is_not_a_positive_count(words):
    with pytest.raises(OverlapError, match="whole number of words >= 1"):
        find_overlap([Text("c", "a")], [Text("e", "a")], words)


@pytest.fixture
def files(tmp_path):
    """A calibration JSONL and a keytoken_nll docs folder; calibration line 2 shares a 64-word run with
    docs/prose/b.txt, and line 3 is docs/code/c.jsonl's first line, exactly."""
    run = planted(64, seed=7)
    cal = tmp_path / "cal.jsonl"
    lines = [" ".join(filler("p", 100)), " ".join(filler("q", 30) + run + filler("r", 30)), "a short calibration line"]
    cal.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    docs = tmp_path / "docs"
    (docs / "prose").mkdir(parents=True)
    (docs / "code").mkdir()
    (docs / "prose" / "a.txt").write_text(" ".join(filler("s", 300)), encoding="utf-8")
    (docs / "prose" / "b.txt").write_text(" ".join(filler("t", 7) + run), encoding="utf-8")
    (docs / "code" / "c.jsonl").write_text(json.dumps({"text": lines[2]}) + "\n", encoding="utf-8")
    clean = tmp_path / "clean.txt"
    clean.write_text(" ".join(filler("u", 500)), encoding="utf-8")
    return {"cal": cal, "docs": docs, "clean": clean, "run": run, "tmp": tmp_path}


def test_cli_exit_1_on_overlap_with_a_table_a_verdict_line_and_json(files, capsys):
    out = files["tmp"] / "overlap.json"
    code = main(["overlap", "--calibration", str(files["cal"]), "--eval", str(files["docs"]), "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 1
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("overlap found: 1 calibration-evaluation pair shares a run of 50 or more words "
                           "(longest 64 words); 1 pair of identical texts") and "(3 calibration texts vs 3 " in last
    assert f"{files['cal']}:2" in stdout and f"{files['docs']}/prose/b.txt" in stdout
    record = json.loads(out.read_text())
    assert record["written_by"] == MARKER and record["overlap"] is True and record["longest"] == 64
    (shared,) = record["shared_runs"]
    assert (shared["calibration"], shared["evaluation"], shared["words"]) == (
        f"{files['cal']}:2", f"{files['docs']}/prose/b.txt", 64)
    assert (shared["calibration_word"], shared["evaluation_word"], shared["excerpt"]) == (30, 7, excerpt_of(files["run"]))
    (same,) = record["identical"]
    assert (same["calibration"], same["evaluation"]) == (f"{files['cal']}:3", f"{files['docs']} [id c.jsonl:0]")
    # a rerun replaces its own output
    assert main(["overlap", "--calibration", str(files["cal"]), "--eval", str(files["docs"]), "--json", str(out)]) == 1


def test_cli_exit_0_without_overlap(files, capsys):
    code = main(["overlap", "--calibration", str(files["clean"]), "--eval", str(files["docs"]),
                 str(files["docs"] / "prose" / "a.txt"), "--words", "20"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert out == ["no overlap: no calibration text shares a run of 20 or more words with an evaluation text, "
                   "and none has the same sha256 (1 calibration texts vs 4 evaluation texts)"]


def test_cli_never_writes_over_a_file_it_did_not_write(files, capsys):
    mine = files["tmp"] / "mine.json"
    mine.write_text('{"my": "notes"}')
    argv = ["overlap", "--calibration", str(files["cal"]), "--eval", str(files["docs"]), "--json", str(mine)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--json" in err and "mine.json" in err and "--overwrite" in err
    assert mine.read_text() == '{"my": "notes"}'
    assert main([*argv, "--overwrite"]) == 1
    assert json.loads(mine.read_text())["written_by"] == MARKER


BAD = [  # (argv after `rf-eval overlap`, with {cal} {docs} {tmp}; what the one line must say)
    (["--calibration", "{tmp}/none.jsonl", "--eval", "{docs}"], "none.jsonl does not exist"),
    (["--calibration", "{docs}", "--eval", "{docs}"], "is a folder; give the files in it"),
    (["--calibration", "{tmp}/latin1.txt", "--eval", "{docs}"], "latin1.txt:1: not UTF-8 text (byte 0xe9"),
    (["--calibration", "{cal}", "--eval", "{tmp}/latin1.txt"], "latin1.txt:1: not UTF-8 text (byte 0xe9"),
    (["--calibration", "{cal}", "--eval", "{tmp}/none"], "none does not exist"),
    (["--calibration", "{cal}", "--eval", "{tmp}/empty_folder"], "holds no .txt or .jsonl files"),
    (["--calibration", "{tmp}/blank.txt", "--eval", "{docs}"], "calibration input is empty"),
    (["--calibration", "{cal}", "--eval", "{docs}", "--words", "0"], "argument --words: '0' must be an integer >= 1"),
    (["--calibration", "{cal}", "--eval", "{docs}", "--words", "ten"], "argument --words: 'ten' is not an integer"),
    (["--calibration", "{cal}", "--eval", "{docs}", "--json", "{tmp}"], "is a folder; name a file in it"),
    (["--eval", "{docs}"], "the following arguments are required: --calibration"),
]


@pytest.mark.parametrize("argv, says", BAD)
def test_bad_inputs_are_one_line_and_exit_2(files, argv, says, capsys):
    tmp = files["tmp"]
    (tmp / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    (tmp / "blank.txt").write_text("  \n")
    (tmp / "empty_folder").mkdir(exist_ok=True)
    given = [a.format(cal=files["cal"], docs=files["docs"], tmp=tmp) for a in argv]
    assert main(["overlap", *given]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rf-eval overlap") and says in lines[0], err
    assert not (tmp / "overlap.json").exists()


def test_runs_of_tokens_under_a_tokenizer_find_what_the_word_rule_cannot(tiny_model_dir, tmp_path, capsys):
    """Appendix G's first check (#55 item 7): 50 consecutive tokens of the model's tokenizer. A shared blob
    with no whitespace is one word, so the word rule finds nothing; its tokens are a run of 50 or more."""
    from transformers import AutoTokenizer

    folder = tiny_model_dir("llama")
    tok = AutoTokenizer.from_pretrained(folder)
    blob = ",".join(f"k{i}" for i in range(60))
    cal = [Text("cal", f"A calibration page about gardens. {blob} And the end of it.")]
    ev = [Text("ev", f"An evaluation essay on rivers, quoting {blob} before it goes on.")]
    assert not find_overlap(cal, ev, 50).found
    same = [Text("same", cal[0].text)]  # whole-text hashes are the word check's: a token check does not repeat them
    assert len(find_overlap(cal, same, 50).identical) == 1 and find_overlap(cal, same, 50, tok).identical == ()
    tokens = find_overlap(cal, ev, 50, tok)
    shared = len(tok(blob, add_special_tokens=False)["input_ids"])
    (pair,) = tokens.pairs
    assert tokens.found and tokens.unit.startswith("tokens of") and shared - 2 <= pair.words <= shared + 2
    assert f"longest {pair.words} tokens" in tokens.line() and pair.excerpt.startswith(tok.decode(
        tok(cal[0].text, add_special_tokens=False)["input_ids"][pair.calibration_word:pair.calibration_word + 3]))
    (tmp_path / "cal.txt").write_text(cal[0].text)
    (tmp_path / "ev.txt").write_text(ev[0].text)
    args = ["overlap", "--calibration", str(tmp_path / "cal.txt"), "--eval", str(tmp_path / "ev.txt")]
    assert main(args) == 0
    assert main([*args, "--tokenizer", folder, "--json", str(tmp_path / "o.json")]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("no overlap") and lines[-1].startswith("overlap found") and "tokens of" in lines[-1]
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["overlap"] is False and record["by_tokens"][0]["overlap"] is True
    assert main([*args, "--tokenizer", str(tmp_path / "no-such-tokenizer")]) == 2
    assert "no-such-tokenizer': none could be loaded" in capsys.readouterr().err
