"""model_args of `--model ridgefill`: the arm's keys checked once and early; every `hf` key works as for `hf`."""

from __future__ import annotations

import pytest
from adapter_helpers import identity_maps

from rf_eval.model_adapters import prefill_lm
from rf_eval.model_adapters.config import ModelArgsError, parse_model_args


def parse(args: dict):
    return parse_model_args(args, "ridgefill")


def test_values_are_typed_and_lm_eval_flags_merge(tiny_model_dir):
    llama = tiny_model_dir("llama")
    settings, hf = parse({"pretrained": llama, "fill": "identity", "tail": "16", "split": "3", "dtype": "float32",
                          "batch_size": "4", "device": "cpu"})
    assert (settings.arm.tail, settings.arm.split, settings.arm.fill) == (16, 3, "identity")
    assert hf == {"dtype": "float32", "batch_size": "4", "device": "cpu"}  # hf's keys go to HFLM untouched
    settings, _ = parse({"pretrained": llama, "fill": "exact"})
    assert settings.arm.split == 3  # L // 2, resolved against the model's config
    with pytest.raises(AttributeError):
        settings.arm.tail = 3  # frozen


@pytest.mark.parametrize(
    "args, message",
    [
        ("fill=exact,tial=3", "unknown model_args key(s): 'tial' (did you mean 'tail'?)"),
        ("fill=exact,selector_args=x", "unknown model_args key(s): 'selector_args' (did you mean 'selector'?)"),
        ("tail=3", "missing required model_args key(s): fill"),
        ("fill=ridge", "fill=ridge needs maps="),
        ("fill=rigde", "fill='rigde' is not valid; valid fills: exact, identity, kv_ridge, nofill, ridge"),
        ("fill=exact,tail=0", "tail must be >= 1"),
        ("fill=exact,tail=abc", "tail='abc' has the wrong type; expected int"),
        ("fill=exact,dtype=float8", "dtype='float8' is not valid"),
        ("fill=exact,reference=ridge", "reference='ridge' is not valid; valid: exact"),
        ("fill=exact,reference=exact,paired_timing=maybe", "paired_timing='maybe' is not valid; valid: true, false"),
        ("fill=exact,paired_timing=false", "paired_timing=False times the reference=exact pass; give reference=exact"),
        ("fill=exact,batch_size=lots", "batch_size='lots'"),
        ("fill=exact,max_gen_toks=0", "max_gen_toks=0: give an integer >= 1"),
        ("fill=exact,max_gen_toks=-3", "max_gen_toks=-3: give an integer >= 1"),
        ("fill=ridge,maps=/nowhere", "maps='/nowhere': map path /nowhere does not exist"),
        ("fill=identity,selector=atention", "selector='atention': unknown selector 'atention'"),
        ("fill=identity,corrections=rescale(c=4)", "corrections='rescale(c=4)': unknown correction"),
        ("fill=identity,splice=queries", "splice='queries' is not valid; valid splices: keys"),
        ("fill=nofill,splice=keys", "they need a fill from predicted inputs (identity, ridge), not fill=nofill"),
        ("fill=identity,cost_match=ridge", "cost_match lengthens the tail of an arm without filled rows: it needs "
                                           "fill=nofill, not fill=identity"),
        ("preset=pop,tail=8", "preset=pop sets fill, tail and split; leave out tail"),
        ("preset=pop,fill=ridge,split=2", "preset=pop sets fill, tail and split; leave out fill, split"),
        ("preset=popp", "preset='popp' is not valid; valid presets: fastkv, pop"),
        ("fill=identity,split=6", "split 6 is outside 1..5 for this 6-layer model"),
        ("fill=exact,pretrained=/no/such/model", "pretrained='/no/such/model'"),
        ("fill=identity,selector=probe,split=3", "selector='probe': no attention layer among layers [3, 7, 11, 15] "
                                                 "lies below split 3"),
        ("fill=identity,selector=attention(layers=5),split=4", "no attention layer among layers [5] lies below split 4"),
        ("fill=identity,allow_other_weights=maybe", "allow_other_weights='maybe' has the wrong type; expected bool"),
        ("fill=exact,foo=1", "model_args key(s) 'foo' are taken by neither lm-eval's hf model, transformers' "
                             "from_pretrained nor LlamaConfig"),
        ("fill=exact,rope_theta=20000", "'rope_theta' are taken by neither"),
        ("fill=exact,attn_implementaton=eager", "(closest: attn_implementation"),
        ("fill=exact,dtype=int8", "dtype='int8' is not valid: the weights need a floating-point dtype"),
        ("fill=exact,dtype=bool", "dtype='bool' is not valid"),
    ],
)
def test_bad_model_args_name_the_key(tiny_model_dir, args, message):
    from lm_eval.utils import simple_parse_args_string

    given = {"pretrained": tiny_model_dir("llama"), **simple_parse_args_string(args)}
    with pytest.raises(ModelArgsError) as err:
        parse(given)
    assert message in str(err.value)


def test_maps_contradictions_fail_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    llama, qwen = tiny_model_dir("llama"), tiny_model_dir("qwen3")
    maps = identity_maps(llama, 3, tmp_path / "maps")
    with pytest.raises(ModelArgsError, match="split=2 contradicts the maps, fitted for split 3"):
        parse({"pretrained": llama, "fill": "ridge", "maps": str(maps), "split": 2})
    with pytest.raises(ModelArgsError, match="no maps for split 2"):
        parse({"pretrained": llama, "fill": "ridge", "maps": str(maps.parent), "split": 2})

    import transformers

    def no_weights(*a, **k):
        raise AssertionError("the model weights were loaded before the model_args were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(ModelArgsError, match="fitted for another model"):
        prefill_lm.ridgefill.create_from_arg_string(f"pretrained={qwen},fill=ridge,maps={maps}")
    with pytest.raises(ModelArgsError, match="split 6 is outside 1..5"):
        prefill_lm.ridgefill.create_from_arg_string(f"pretrained={llama},fill=identity,split=6")
    with pytest.raises(ModelArgsError, match="unknown model_args key"):
        prefill_lm.ridgefill.create_from_arg_obj({"pretrained": llama, "fill": "exact", "selector_args": "share=0.1"})


def test_demo_is_the_default_model_and_brings_its_maps(monkeypatch, tiny_model_dir, tmp_path):
    """No pretrained (or pretrained=demo): the demo model, and for fill=ridge the demo's maps."""
    from rf_eval.demo import model as demo_model
    from rf_eval.demo import study as demo

    model_dir = tiny_model_dir("llama")
    maps = identity_maps(model_dir, 3, tmp_path / "maps")
    monkeypatch.setattr(demo_model, "resolve_pretrained", lambda name, log=None: str(model_dir))
    monkeypatch.setattr(demo, "demo_maps", lambda d, s: maps)
    monkeypatch.setattr(demo, "SPLIT", 3)  # the tiny model's split in place of the demo model's
    for given in ({}, {"pretrained": "demo"}, {"pretrained": "DEMO", "fill": "ridge"}):
        settings, _ = parse(given)
        assert (settings.pretrained, settings.arm.fill, settings.source.files.get("maps")) == (model_dir, "ridge", str(maps))
        assert settings.arm.split == demo.SPLIT
    settings, _ = parse({"pretrained": "demo", "fill": "identity", "split": 2})
    assert (settings.arm.fill, settings.source.files.get("maps"), settings.arm.split) == ("identity", None, 2)


# -- every `hf` model_arg works as for `--model hf` ---------------------------------------------------

@pytest.fixture
def thinking_model(tiny_model_dir, tmp_path):
    """The tiny Qwen3 with a chat template that has Qwen3's `enable_thinking` switch."""
    from rf_eval.testing import THINKING_TEMPLATE, with_chat_template

    return str(with_chat_template(tiny_model_dir("qwen3"), tmp_path / "qwen3_thinking", THINKING_TEMPLATE))


def test_enable_thinking_false_reaches_the_chat_template(thinking_model):
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    off = prefill_lm.ridgefill(pretrained=thinking_model, fill="identity", tail=8, enable_thinking=False, device="cpu")
    # thinking is off by default where the template has the switch: "on" must ask for it
    on = prefill_lm.ridgefill(pretrained=thinking_model, fill="identity", tail=8, enable_thinking=True,
                     think_end_token="</think>", device="cpu")
    assert off.apply_chat_template(chat).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.apply_chat_template(chat).endswith("<|im_start|>assistant\n")
    extra = prefill_lm.ridgefill(pretrained=thinking_model, fill="exact", device="cpu",
                        chat_template_args={"enable_thinking": False})
    assert extra.apply_chat_template(chat) == off.apply_chat_template(chat)


def test_thinking_is_off_by_default_and_recorded(thinking_model, tiny_model_dir):
    """The paper's protocols run with thinking off (section 3.2, appendix E): a template with the
    switch renders enable_thinking=False unless the user sets it; the results record the rendering."""
    import hashlib

    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    default = prefill_lm.ridgefill(pretrained=thinking_model, fill="identity", tail=8, device="cpu")
    assert default.apply_chat_template(chat).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    record = default.get_model_info()["rf_eval"]["chat_template"]
    assert record["thinking_switch"] and record["enable_thinking"] is False and record["enable_thinking_default"]
    assert record["rendered_example"].endswith("<think>\n\n</think>\n\n")
    assert record["rendered_sha256"] == hashlib.sha256(record["rendered_example"].encode()).hexdigest()
    # the user's value wins, through either key
    on = prefill_lm.ridgefill(pretrained=thinking_model, fill="exact", enable_thinking=True, think_end_token="</think>",
                     device="cpu")
    assert on.apply_chat_template(chat).endswith("<|im_start|>assistant\n")
    assert on.get_model_info()["rf_eval"]["chat_template"]["enable_thinking"] is True
    args = prefill_lm.ridgefill(pretrained=thinking_model, fill="exact", device="cpu",
                       chat_template_args={"enable_thinking": True})
    assert args.apply_chat_template(chat).endswith("<|im_start|>assistant\n")
    assert args.get_model_info()["rf_eval"]["chat_template"]["enable_thinking_default"] is False
    # a template without the switch is left alone
    plain = prefill_lm.ridgefill(pretrained=tiny_model_dir("llama"), fill="exact", device="cpu")
    record = plain.get_model_info()["rf_eval"]["chat_template"]
    assert record["thinking_switch"] is False and record["enable_thinking"] is None
    assert "enable_thinking" not in plain.chat_template_args


@pytest.mark.parametrize("given", [{"enable_thinking": True, "think_end_token": "</think>"},
                                   {"enable_thinking": False}, {"chat_template_args": {"enable_thinking": True}}])
def test_a_thinking_setting_the_template_cannot_render_is_refused_before_the_weights_load(
        tiny_model_dir, monkeypatch, given):
    """A template without the switch renders the same prompt with enable_thinking True and False: the run
    would be labelled (its model_args name the arm) with a thinking setting its prompts never had. Refused,
    naming the key and the checkpoint, before any weights load (issue #41, item 3)."""
    import transformers

    from rf_eval.errors import UserError

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded before the thinking setting was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    llama = tiny_model_dir("llama")
    key = "enable_thinking" if "enable_thinking" in given else "chat_template_args enable_thinking"
    value = given.get("enable_thinking", (given.get("chat_template_args") or {}).get("enable_thinking"))
    with pytest.raises(UserError) as err:
        prefill_lm.ridgefill(pretrained=llama, fill="exact", device="cpu", **given)
    message = str(err.value)
    assert message.startswith(f"{key}={value!r}: the chat template of {llama} renders the same prompt")
    assert "leave enable_thinking out" in message


def test_revision_and_trust_remote_code_reach_from_pretrained(tiny_model_dir, monkeypatch):
    import transformers

    seen = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    lm = prefill_lm.ridgefill.create_from_arg_string(
        f"pretrained={tiny_model_dir('llama')},fill=identity,tail=8,revision=main,trust_remote_code=True",
        {"device": "cpu"},
    )
    assert seen and seen[0]["revision"] == "main" and seen[0]["trust_remote_code"] is True
    assert lm.get_model_info()["model_revision"] == "main"
    assert lm.get_model_info()["rf_eval"]["fill"] == "identity"


def test_parallelize_places_the_model_as_hf_does(tiny_model_dir, tmp_path):
    """parallelize=True: HFLM's accelerate placement (on a CPU-only machine: weights offloaded to
    `offload_folder`); the filled arm then runs on the placed model."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    path = tiny_model_dir("llama")
    args = dict(pretrained=path, parallelize=True, dtype="float32", device="cpu", offload_folder=str(tmp_path))
    hf = HFLM(**args)
    rf = prefill_lm.ridgefill(fill="exact", **args)
    filled = prefill_lm.ridgefill(fill="identity", tail=4, **args)
    assert getattr(rf.model, "hf_device_map", None) == getattr(hf.model, "hf_device_map", None)
    reqs = [Instance("loglikelihood", {}, ("the cat sat on the mat " * 3, " and the dog"), 0)]
    want = hf.loglikelihood(reqs, disable_tqdm=True)
    assert rf.loglikelihood(reqs, disable_tqdm=True) == want  # fill=exact is hf, bitwise
    got = filled.loglikelihood(reqs, disable_tqdm=True)
    assert got[0][0] != want[0][0]  # the filled arm really ran the engine


def test_a_broken_run_ledger_is_refused_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    from rf_eval.model_adapters import prefill_lm
    monkeypatch.setenv("RF_EVAL_LEDGER", str(tmp_path / "none.jsonl"))
    with pytest.raises(ModelArgsError, match=r"\$RF_EVAL_LEDGER: no ledger at"):
        prefill_lm.ridgefill(pretrained=tiny_model_dir("llama"), fill="exact", device="cpu")


def test_keys_from_pretrained_or_the_config_take_pass(tiny_model_dir):
    """The unknown-key check refuses nothing transformers would take: from_pretrained's own keyword arguments
    and the config's attributes (which from_pretrained sets on the config)."""
    llama = tiny_model_dir("llama")
    _settings, hf = parse({"pretrained": llama, "fill": "exact", "attn_implementation": "eager",
                           "low_cpu_mem_usage": True, "vocab_size": 300, "use_safetensors": True})
    assert hf["attn_implementation"] == "eager" and hf["vocab_size"] == 300


def test_a_model_of_no_rf_eval_family_is_refused_before_the_weights(tmp_path, tiny_model_dir, monkeypatch):
    """A checkpoint whose model_type no family module claims (GPT-2 here) would end in an AttributeError
    inside the engine after loading; the adapters refuse it from the config."""
    import shutil

    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_model_dir('llama')}/{name}", folder / name)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ModelArgsError, match="model_type 'gpt2' has no rf-eval family; supported: .*llama"):
        parse({"pretrained": str(folder), "fill": "exact"})
