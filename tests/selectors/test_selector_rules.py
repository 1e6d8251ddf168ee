"""Token classes (paper 2.4, I.3), lexical-net normalization (appendix H), specs and the registry: no model."""

import pytest

from rf_eval.arm_string import ArmStringError, parse_parts
from rf_eval.selectors import make_selector, selector_from
from rf_eval.selectors.lexical import content_mask, normalize_word, sentences, words
from rf_eval.selectors.registry import cache_selector
from rf_eval.selectors.tokens import ELIGIBLE, is_digit_token, token_class

# -- token classes: one test per class ---------------------------------------------------------


def test_capitalized_word_start():
    assert token_class(" Paris", prev="in") == "cap_word_start"
    assert token_class("Paris", prev=None) == "cap_word_start"  # first token of the text
    assert token_class("Paris", prev="(") == "cap_word_start"  # after punctuation


def test_capitalized_word_piece():
    assert token_class("York", prev="New") == "cap_word_piece"
    assert token_class("X", prev="abc") == "cap_word_piece"


def test_lower_case_word_piece():
    assert token_class("ing", prev=" runn") == "lower_word_piece"
    assert token_class("ção", prev="ca") == "lower_word_piece"  # non-ASCII letters are letters


def test_lower_case_word_start_is_not_eligible():
    assert token_class(" the", prev="of") == "lower_word_start"
    assert "lower_word_start" not in ELIGIBLE


def test_mixed_tokens():
    for text in ("x2", "_id", " 3rd", "e-", "'s"):
        assert token_class(text, prev="a") == "mixed", text
    assert "mixed" in ELIGIBLE


def test_plain_numbers_and_digits_with_punctuation_are_not_eligible():
    assert token_class(" 2024", prev="in") == "number"
    assert token_class("3.14", prev=" ") == "digits_punct"
    assert token_class("1,", prev="") == "digits_punct"
    assert {"number", "digits_punct"}.isdisjoint(ELIGIBLE)
    assert is_digit_token(" 42") and is_digit_token("7") and not is_digit_token("4a") and not is_digit_token("3.1")


def test_punctuation_spaces_and_specials_are_not_eligible():
    assert token_class("?!", prev="a") == "punctuation"
    assert token_class("  \n", prev="a") == "space"
    assert token_class("<|im_start|>", prev="a", special=True) == "special"
    assert {"punctuation", "space", "special"}.isdisjoint(ELIGIBLE)
    assert set(ELIGIBLE) == {"cap_word_start", "cap_word_piece", "lower_word_piece", "mixed"}


# -- lexical-net normalization: one test per rule ------------------------------------------------


def test_words_are_runs_of_letters_and_numbers():
    assert [w for _, w in words("abc 123 x9 名字")] == ["abc", "123", "x9", "名字"]


def test_punctuation_underscores_and_combining_marks_separate_words():
    assert [w for _, w in words("foo_bar-baz.qux")] == ["foo", "bar", "baz", "qux"]
    assert [w for _, w in words("cafe\u0301x")] == ["cafe", "x"]  # U+0301 combining acute splits


def test_only_ascii_letters_are_lower_cased():
    assert normalize_word("HeLLo") == "hello"
    assert normalize_word("ÄÖÜ") == "ÄÖÜ"  # non-ASCII kept as is
    assert normalize_word("ΑΒΓ") == "ΑΒΓ"


def test_final_s_dropped_from_words_of_four_or_more_unless_ss():
    assert normalize_word("cats") == "cat"
    assert normalize_word("Keys") == "key"
    assert normalize_word("bus") == "bus"  # three characters
    assert normalize_word("glass") == "glass"  # ends in ss
    assert normalize_word("GLASS") == "glass"


def _sentences(text, specials=None):
    texts = list(text)
    groups = sentences(texts, specials or [False] * len(texts))
    return ["".join(texts[r] for r in g) for g in groups]


def test_sentence_ends_at_line_break():
    assert _sentences("one two\nthree") == ["one two\n", "three"]


def test_sentence_ends_at_period_exclamation_question_before_whitespace_or_end():
    assert _sentences("A b. C d! E f? G") == ["A b.", " C d!", " E f?", " G"]
    assert _sentences("pi is 3.14 ok.") == ["pi is 3.14 ok."]  # no whitespace after the first period
    assert _sentences("end.") == ["end."]


def test_sentence_ends_at_cjk_marks():
    assert _sentences("甲乙。丙丁！戊？己") == ["甲乙。", "丙丁！", "戊？", "己"]


def test_sentence_ends_at_special_tokens():
    texts = ["a", "b", "<s>", "c", "d"]
    groups = sentences(texts, [False, False, True, False, False])
    assert groups == [[0, 1], [3, 4]]
    # a special token and its role header up to the line break are not content
    chat = ["<|im_start|>", "user", "\n", "hi", "<|im_end|>", "\n", "x"]
    assert content_mask(chat, [True, False, False, False, True, False, False]) == [
        False, False, False, True, False, False, True]


# -- specs and the registry ----------------------------------------------------------------------


def test_spec_parser():
    assert parse_parts("a(x=1;y=0.5;z=true;w=3|7|11;s=text)+b") == [
        ("a", {"x": 1, "y": 0.5, "z": True, "w": [3, 7, 11], "s": "text"}), ("b", {})]
    assert parse_parts("random(of=attention(share=0.2);seed=3)") == [
        ("random", {"of": "attention(share=0.2)", "seed": 3})]
    for bad in ("", "a(x)", "a(x=1", "a)"):
        with pytest.raises(ArmStringError):
            parse_parts(bad)


def test_registry_errors_name_the_bad_name_and_list_valid_ones():
    with pytest.raises(ValueError, match=r"unknown selector 'atention'; valid ridgefill selectors: attention, lexical_net"):
        make_selector("atention")
    with pytest.raises(ValueError, match=r"selector 'rank' is a rarecache selector \(it reads the mapped cache\); "
                                         r"valid ridgefill selectors: attention, "):
        make_selector("rank")
    with pytest.raises(ValueError, match=r"selector 'random' is a ridgefill selector \(it reads the split state\); "
                                         r"valid rarecache selectors: layer-prefix, oracle-attention, oracle-l2, "
                                         r"random-positions, rank, source-attention"):
        cache_selector("random")
    with pytest.raises(ValueError, match=r"selector 'attention' has no parameter 'shar'; valid parameters: share"):
        make_selector("attention", shar=0.1)
    with pytest.raises(ValueError, match="exactly one of"):
        make_selector("random", seed=1)


def test_composed_selector_describes_itself():
    sel = selector_from("random(seed=3;of=attention(share=0.2;layers=3|7))+special")
    desc = sel.describe()
    assert desc["name"] == "union"
    assert desc["parts"][0] == {"name": "random", "of": {"name": "attention", "share": 0.2, "window": 64,
                                                         "layers": [3, 7], "share_of": "prompt"},
                                "count": None, "share": None, "seed": 3}
    assert desc["parts"][1] == {"name": "special"}


def test_question_hidden_window_ends_where_the_question_starts():
    import torch

    from rf_eval.engine import Plan
    from rf_eval.selectors import QuestionHidden, Request
    from rf_eval.testing import build_tokenizer

    tok = build_tokenizer()
    text = "filler text " * 10 + "Question: where is it?"
    ids = tok(text, return_tensors="pt").input_ids
    n = ids.shape[1]
    req = Request(None, tok, ids, Plan(split=4, tail=8, fill="identity"))
    assert QuestionHidden(window=16).window_rows(req) == (n - 32, n - 16)  # default: question = last `window` rows
    assert QuestionHidden(window=16, offset=5).window_rows(req) == (n - 21, n - 5)
    q0 = text.index("Question:")
    assert QuestionHidden(window=16, marker="Question:").window_rows(req) == (q0 - 16, q0)
    assert torch.equal(ids[0, q0 : q0 + 9], torch.tensor(tok("Question:").input_ids))
