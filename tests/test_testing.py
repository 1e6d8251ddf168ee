import torch
from transformers import AutoModelForCausalLM

from rf_eval.cli import main
from rf_eval.testing import FAMILIES, build_tokenizer, make_tiny_model


def test_tokenizer_round_trip_and_single_digit_tokens():
    tok = build_tokenizer()
    text = "Needle 8675309 in a haystack, naïve."
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    digits = tok("8675309").input_ids
    assert len(digits) == 7
    assert tok.eos_token == "<|im_end|>"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_make_tiny_model_is_deterministic(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path / "b", seed=3))
    c = AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path / "c", seed=4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_all_families_load(tiny_model):
    for family in FAMILIES:
        model, tok = tiny_model(family)
        ids = tok("a b c 123", return_tensors="pt").input_ids
        assert model(ids).logits.shape == (1, ids.shape[1], len(tok))


def test_cli_tiny_model_rejects_unknown_family(capsys, tmp_path):
    assert main(["tiny-model", "--family", "gpt2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gpt2'" in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_make_tiny_model_rejects_unknown_family_before_writing(tmp_path):
    import pytest

    with pytest.raises(ValueError, match=r"unknown family 'gpt2'; valid families: gemma3, gpt_oss, llama, mistral, olmo2"):
        make_tiny_model("gpt2", tmp_path / "out")
    assert not (tmp_path / "out").exists()
