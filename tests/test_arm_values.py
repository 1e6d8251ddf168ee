"""One converter for arm values in every format they are written in (#39 item 5).

An arm value reaches `rf_eval.fields.coerce` from lm-eval's model_args (which lm-eval has already typed),
a study file's YAML (which YAML has typed), a served `rf_arm` string (text, from the arm string's one
parser) or, without a field type, as a part's parameter in an arm string (`selector=attention(share=0.1)`).
The table gives, per written value and field, what the arm holds; the formats must agree, except where a
format already turned the text into a number before rf-eval sees it (marked per format).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from lm_eval.utils import simple_parse_args_string

from rf_eval.arm_string import ArmStringError, parse_fields, parse_parts
from rf_eval.fields import ArmError, build
from rf_eval.serving.arms import parse_rf_arm


@dataclass(frozen=True, kw_only=True)
class Fields:
    """One field of each type an arm spec declares."""

    n: int = 0
    maybe_n: int | None = None
    share: float | None = None
    flag: bool = False
    name: str = ""
    maybe_name: str | None = None
    part: Any = None  # a selector / correction / cost-match string, a dict or an object


REFUSED = object()

#: how each format hands the written value `text` of `key` on (before the field's type converts it)
FORMATS = {
    "model_args": lambda key, text: simple_parse_args_string(f"{key}={text}")[key],
    "study_yaml": lambda key, text: yaml.safe_load(f"{key}: {text}")[key],
    "rf_arm": lambda key, text: parse_rf_arm(f"{key}={text}")[key],
}

#: (written value, field, what the arm holds (REFUSED: an ArmError naming the field), what a part's
#: parameter holds (no type: `fields.read_text`))
TABLE = [
    ("64", "n", 64, 64),
    ("-3", "n", -3, -3),
    ("+3", "n", 3, 3),
    ("4096.0", "n", 4096, 4096.0),  # integral: an int (lm-eval's model_args gave 4096.0 before)
    ("1e3", "n", 1000, 1000.0),
    ("0.5", "n", REFUSED, 0.5),  # no fraction for an int
    ("true", "n", REFUSED, True),  # no bool for an int
    ("3|7", "n", REFUSED, [3, 7]),  # no list for a scalar
    ("none", "n", REFUSED, None),  # the field has no "not set"
    ("none", "maybe_n", None, None),  # `rf_arm` refused this before: now as model_args read it
    ("null", "maybe_n", None, None),
    ("None", "maybe_n", None, None),
    ("12", "maybe_n", 12, 12),
    ("0.5", "share", 0.5, 0.5),
    ("1", "share", 1.0, 1),
    ("abc", "share", REFUSED, "abc"),
    ("true", "flag", True, True),
    ("False", "flag", False, False),
    ("1", "flag", REFUSED, 1),  # only true/false for a bool
    ("none", "flag", REFUSED, None),
    ("keys", "name", "keys", "keys"),
    ("none", "name", REFUSED, None),  # as lm-eval's model_args refused `fill=none`
    ("none", "maybe_name", None, None),
    ('"123"', "name", "123", "123"),  # quotes mark text
    # the text of a number: model_args and YAML read it as a number first, and `007` would be 7: refused
    ("123", "name", {"model_args": REFUSED, "study_yaml": REFUSED, "rf_arm": "123"}, 123),
    ("/maps/a.safetensors", "maybe_name", "/maps/a.safetensors", "/maps/a.safetensors"),
    ("attention(share=0.1)+special", "part", "attention(share=0.1)+special", "attention(share=0.1)+special"),
    ("random(seed=3;of=attention)", "part", "random(seed=3;of=attention)", "random(seed=3;of=attention)"),
    ("none", "part", None, None),
    ("3|7", "part", "3|7", [3, 7]),  # a field's own parser reads its string; a part's parameter is untyped
]


#: every (format, row) but a `;` in a study YAML plain scalar, which a study file quotes (quoted, it is the text)
CASES = [(fmt, row) for row in TABLE for fmt in sorted(FORMATS) if not (fmt == "study_yaml" and ";" in row[0])]


@pytest.mark.parametrize(("fmt", "row"), CASES, ids=[f"{fmt}-{k}={t}" for fmt, (t, k, _, _) in CASES])
def test_a_written_value_becomes_the_same_field_value_in_every_format(fmt, row):
    text, key, held, _ = row
    expected = held[fmt] if isinstance(held, dict) else held
    given = FORMATS[fmt](key, text)
    if expected is REFUSED:
        with pytest.raises(ArmError, match=key):
            build(Fields, {key: given})
    else:
        value = getattr(build(Fields, {key: given}), key)
        assert value == expected and type(value) is type(expected), (fmt, given, value)


@pytest.mark.parametrize(("text", "key", "_", "param"), TABLE, ids=[f"{k}={t}" for t, k, _, _ in TABLE])
def test_a_parts_parameter_is_read_by_the_same_module_untyped(text, key, _, param):
    ((name, params),) = parse_parts(f"x({key}={text})")
    assert name == "x" and params == {key: param} and type(params[key]) is type(param)


def test_the_arm_string_parser_keeps_nested_parts_whole_in_every_shape():
    nested = "fill=ridge;selector=random(seed=3;of=attention(share=0.1))+special;tail=64"
    fields = {"fill": "ridge", "selector": "random(seed=3;of=attention(share=0.1))+special", "tail": "64"}
    assert parse_fields(nested) == fields
    assert parse_rf_arm(nested) == fields  # a served rf_arm split the selector at its inner `;` before
    assert parse_rf_arm(nested.replace(";fill", ",fill").replace(";tail", ",tail")) == fields
    assert parse_parts("random(seed=3;of=attention(share=0.1))+special") == [
        ("random", {"seed": 3, "of": "attention(share=0.1)"}), ("special", {})]


@pytest.mark.parametrize("bad", ["fill", "fill=ridge;tail", "=3", "selector=random(seed=3", "a)=1"])
def test_a_bad_arm_string_is_an_arm_error_naming_the_part(bad):
    with pytest.raises(ArmStringError):
        parse_fields(bad)
    with pytest.raises(ArmError, match="rf_arm|unbalanced"):
        parse_rf_arm(bad, ("fill", "tail"))
