"""`rf-eval serve` renders chat messages as `--model ridgefill` does (`rf_eval.harness.chat`): thinking off where the
template has the switch, the user's value where given, and the same record; so served and adapter arms pair."""

from __future__ import annotations

import json
import urllib.request

import pytest
from serving_helpers import post, start_server

from rf_eval.harness import chat
from rf_eval.testing import THINKING_TEMPLATE, with_chat_template

THINK_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a colour of the sea."}],
    [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi there."},
     {"role": "user", "content": "Count to three, please."}],
]
ARM = {"fill": "identity", "tail": 8}  # the server's own arm and the adapter's: every prompt has filled rows
MAX_GEN = 10
GREEDY = {"until": ["<|im_end|>"], "max_gen_toks": MAX_GEN, "do_sample": False, "temperature": 0.0}


@pytest.fixture(scope="module")
def thinking_dir(serve_model_dir, tmp_path_factory) -> str:
    """The serving tests' tiny Qwen3 with a chat template that has the `enable_thinking` switch."""
    folder = tmp_path_factory.mktemp("thinking") / "qwen3_thinking"
    return str(with_chat_template(serve_model_dir, folder, THINKING_TEMPLATE))


@pytest.fixture(scope="module")
def thinking_server(thinking_dir, serve_env, tmp_path_factory):
    served = start_server(thinking_dir, tmp_path_factory.mktemp("thinking_server"), serve_env,
                          "--fill", ARM["fill"], "--tail", str(ARM["tail"]))
    yield served
    served.stop()


@pytest.mark.parametrize("hf_args, template, expected", [
    ({}, THINKING_TEMPLATE, ({"enable_thinking": False}, True)),
    ({"enable_thinking": True}, THINKING_TEMPLATE, ({"enable_thinking": True}, False)),
    ({"chat_template_args": {"enable_thinking": True, "x": 1}}, THINKING_TEMPLATE,
     ({"enable_thinking": True, "x": 1}, False)),
    ({"enable_thinking": False, "chat_template_args": {"enable_thinking": True}}, THINKING_TEMPLATE,
     ({"enable_thinking": False}, False)),  # as `hf`: enable_thinking over chat_template_args
    ({}, {"default": THINKING_TEMPLATE, "tool_use": "{{ messages }}"}, ({"enable_thinking": False}, True)),
    ({}, "{{ messages }}", ({}, False)),
    ({"enable_thinking": True}, "{{ messages }}", ({"enable_thinking": True}, False)),  # passed on as given
    ({}, None, ({}, False)),
])
def test_the_chat_rule(hf_args, template, expected):
    assert chat.template_args(hf_args, template) == expected


def test_the_switch_is_what_the_template_renders(thinking_dir, serve_model_dir):
    """`renders_thinking` renders the template both ways; a thinking setting it cannot render is refused, by
    the server as by the adapter (the adapter's refusal: tests/model_adapters/test_adapter_config.py)."""
    from transformers import AutoTokenizer

    from rf_eval.errors import UserError
    from rf_eval.serving.backend import Backend

    switch, plain = AutoTokenizer.from_pretrained(thinking_dir), AutoTokenizer.from_pretrained(serve_model_dir)
    assert chat.renders_thinking(switch, {}) and not chat.renders_thinking(plain, {})
    # the text names the switch, the rendering never reads it: no switch
    plain.chat_template = "{# enable_thinking #}" + plain.chat_template
    assert chat.template_has_thinking_switch(plain.chat_template) and not chat.renders_thinking(plain, {})
    chat.check_thinking(switch, {"enable_thinking": True})
    chat.check_thinking(plain, {})
    with pytest.raises(UserError, match=r"^enable_thinking=True: the chat template of x renders the same prompt"):
        chat.check_thinking(plain, {"enable_thinking": True}, "x")
    plain.chat_template = None
    with pytest.raises(UserError, match=r"^chat_template_args enable_thinking=False: the tokenizer has no chat"):
        chat.check_thinking(plain, {"chat_template_args": {"enable_thinking": False}})
    with pytest.raises(UserError, match="renders the same prompt with enable_thinking=True and False"):
        Backend.from_model_args({"pretrained": serve_model_dir, "fill": "exact", "device": "cpu",
                                 "enable_thinking": True, "think_end_token": "</think>"})


def test_served_chat_prompts_and_answers_are_the_adapters_item_by_item(thinking_server, thinking_dir):
    """Same messages, same settings: the server's rendered prompt ids (vLLM's `return_token_ids`), its
    prompt string, its greedy answers (also through lm-eval's `local-chat-completions`) and its
    rendering record equal `--model ridgefill`'s, one chat at a time."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalChatCompletion

    from rf_eval.model_adapters import prefill_lm
    lm = prefill_lm.ridgefill(pretrained=thinking_dir, device="cpu", **ARM)
    record = lm.get_model_info()["rf_eval"]["chat_template"]
    assert record["thinking_switch"] and record["enable_thinking"] is False and record["enable_thinking_default"]
    prompts = [lm.apply_chat_template(c) for c in CHATS]  # what lm-eval's --apply_chat_template sends the adapter
    local = lm.generate_until([Instance("generate_until", {}, (p, GREEDY), i) for i, p in enumerate(prompts)],
                              disable_tqdm=True)
    url = thinking_server.url
    for messages, prompt, answer in zip(CHATS, prompts, local):
        assert prompt.endswith(THINK_OFF)
        status, out = post(url + "/v1/chat/completions", {"messages": messages, "max_tokens": MAX_GEN,
                                                          "temperature": 0, "stop": ["<|im_end|>"],
                                                          "return_token_ids": True})
        assert status == 200, out
        ids = lm.encode_prompt(prompt)
        assert out["prompt_token_ids"] == ids and out["usage"]["prompt_tokens"] == len(ids)
        assert post(url + "/detokenize", {"tokens": out["prompt_token_ids"]})[1]["prompt"] == prompt
        assert out["choices"][0]["message"]["content"] == answer
        assert len(out["choices"][0]["token_ids"]) == out["usage"]["completion_tokens"] <= MAX_GEN
        assert out["rf_chat_template"] == record
        assert out["rf_arm"]["fill"] == ARM["fill"] and out["rf_arm"]["tail"] == ARM["tail"]
    assert len(set(local)) > 1  # the answers tell the chats apart: equal answers are evidence

    api = LocalChatCompletion(base_url=url + "/v1/chat/completions", model="tiny", max_retries=1)
    requests = [Instance("generate_until", {}, (api.apply_chat_template(c), GREEDY), i) for i, c in enumerate(CHATS)]
    assert api.generate_until(requests, disable_tqdm=True) == local

    with urllib.request.urlopen(url + "/rf/info", timeout=30) as resp:
        assert json.loads(resp.read())["rf_chat_template"] == record
    logged = [r for r in thinking_server.records() if r["endpoint"] == "/v1/chat/completions" and r["status"] == 200]
    assert logged and all(r["chat_template"] == {"enable_thinking": False,
                                                 "template_sha256": record["template_sha256"]} for r in logged)


@pytest.mark.parametrize("switch, model_args", [
    (True, {}),
    (True, {"enable_thinking": True, "think_end_token": "</think>"}),
    (True, {"chat_template_args": {"enable_thinking": True}}),
    (True, {"enable_thinking": False}),
    (False, {}),
])
def test_server_and_adapter_render_alike_under_every_setting(thinking_dir, serve_model_dir, switch, model_args):
    """The server's backend, configured by the same model_args, renders, tokenizes and records as the adapter."""
    from rf_eval.model_adapters import prefill_lm
    from rf_eval.serving.backend import Backend

    folder = thinking_dir if switch else serve_model_dir
    given = {"pretrained": folder, "fill": "exact", "device": "cpu", **model_args}
    lm = prefill_lm.ridgefill(**given)
    backend = Backend.from_model_args(dict(given))  # a second adapter of its own, as `rf-eval serve` builds
    for messages in CHATS:
        text = lm.apply_chat_template(messages)
        assert backend.render_chat(messages) == text and backend.encode(text) == lm.encode_prompt(text)
    assert backend.chat_template == lm.chat.record()
    thinking = model_args.get("enable_thinking", (model_args.get("chat_template_args") or {}).get("enable_thinking"))
    expected = (False if thinking is None else thinking) if switch else None
    assert backend.chat_template["enable_thinking"] is expected
    assert backend.chat_template["thinking_switch"] is switch
    assert lm.apply_chat_template(CHATS[0]).endswith(THINK_OFF) is (expected is False and switch)
