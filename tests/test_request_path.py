"""One request path (#39 item 2, #53 item 3): a traced request runs each of the path's rules once.

Per prompt the shell asks the method's plan once (`Method.plan`: plain or not, and what runs) and hands it
on as a value: no other function decides "plain?" or the plan's parts again (the engine, the cost, the
generation prefill read the plan). The method checks the prompt once (`check_prompt`), its forward context
opens once around the whole request (`rf_eval.methods.requests.ForwardContext`: the method's own entry
points find it open), the method prefills once (a dropper chooses its rows once) and the stock model
extends its cache. `tests/request_trace.py` records the calls; run it to print the files a request crosses.
"""

from __future__ import annotations

import math

import pytest
import torch
from request_trace import ONCE, REQUESTS, filled_adapter, loglikelihood_request, trace

from rf_eval.fills.base import FORWARD_MARK, ReplacedForward
from rf_eval.methods.requests import ForwardContext

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: files every filled request of the `ridgefill` adapter crosses: its shell (entered first), the shared rules,
#: the method and the engine (`README.md`, "How it works")
PATH = {
    "loglikelihood": ["model_adapters/scoring.py", "rf_eval/methods/requests.py", "rf_eval/ridgefill/method.py",
                      "rf_eval/engine/__init__.py"],
    "generate_until": ["model_adapters/generation.py", "rf_eval/methods/requests.py", "rf_eval/ridgefill/method.py",
                       "rf_eval/engine/__init__.py"],
    "served": ["rf_eval/serving/backend.py", "rf_eval/methods/requests.py", "rf_eval/ridgefill/method.py",
               "rf_eval/engine/__init__.py"],
}


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return filled_adapter(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def dropper(tiny_model_dir):
    """`--model drop` (GemFilter) keeping 8 rows of a prompt: a method of another kind, the same path."""
    from rf_eval.model_adapters import prefill_lm
    return prefill_lm.drop.create_from_arg_obj({"pretrained": tiny_model_dir("llama"), "device": "cpu", "keep": 8,
                                       "filter_layer": 2})


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_filled_request_runs_each_rule_once(lm, kind):
    answer, found = trace(REQUESTS[kind](lm))
    assert answer, kind  # the request answered
    twice = {rule: found.callers[rule] for rule in ONCE if found.rules[rule] > 1}
    assert not twice, f"{kind}: rules run more than once: {twice}\n{found.summary()}"
    for rule in ("plan built", "prompt check", "forward context", "prefill"):
        assert found.rules[rule] == 1, (kind, rule, found.summary())
    assert found.rules["decided apart"] == 0, found.summary()  # the plan is handed on, never re-decided
    assert found.rules["rows chosen"] == 0  # an identity arm with no selector chooses no row
    assert found.rules["extend"] == (1 if kind == "loglikelihood" else 0)  # generation extends inside generate
    assert found.files[0] == PATH[kind][0], found.summary()  # the shell first
    assert set(PATH[kind]) <= set(found.files), found.summary()  # then the rules, the method, the engine


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_dropped_request_runs_each_rule_once(dropper, kind):
    answer, found = trace(REQUESTS[kind](dropper))
    assert answer, kind
    assert {rule: found.rules[rule] for rule in (*ONCE, "decided apart")} == \
        {"plan built": 1, "rows chosen": 1, "prompt check": 1, "forward context": 1, "prefill": 1,
         "extend": int(kind == "loglikelihood"), "decided apart": 0}, found.summary()
    assert found.files[0] == PATH[kind][0]
    assert {"rf_eval/methods/requests.py", "rf_eval/drop/base.py"} <= set(found.files)


def test_a_plain_request_runs_the_stock_model_only(lm):
    from lm_eval.api.instance import Instance

    request = [Instance("loglikelihood", {}, ("a b c", " d"), 0)]  # 4 tokens: within the tail, no filled row
    [(logprob, _)], found = trace(lambda: lm.loglikelihood(request, disable_tqdm=True))
    assert math.isfinite(logprob)
    # the shell decides once, and prices the prompt as exact's from that same plan
    assert found.callers["plan built"] == ["model_adapters/scoring.py:_loglikelihood_tokens"]
    assert found.rules["decided apart"] == 0
    assert found.rules["prefill"] == found.rules["prompt check"] == found.rules["forward context"] == 0
    assert "rf_eval/engine/lower.py" not in found.files  # `hf`'s own code path, not the engine's


def test_the_traced_request_answers_as_an_untraced_one(lm):
    traced, _ = trace(loglikelihood_request(lm))
    assert traced == loglikelihood_request(lm)()


class _Replaced:
    """A model whose forward a fill replaced (`rf_eval.fills.base.ReplacedForward`)."""

    def __init__(self, fill: str):
        setattr(self, FORWARD_MARK, ReplacedForward(fill))


class _Arm:
    """A method over `model` whose arm runs `fill` (what the forward context reads: `Method.forward_fill`)."""

    def __init__(self, model, fill: str):
        self.model, self.forward_fill = model, fill

    def forward_context(self):
        return ForwardContext(self)


def test_the_forward_context_opens_once_and_pauses_a_replaced_forward_for_another_arm():
    model = _Replaced("swiftkv_released")
    replaced = getattr(model, FORWARD_MARK)
    exact, released = _Arm(model, "exact"), _Arm(model, "swiftkv_released")
    with released.forward_context():
        assert replaced.active  # the arm whose forward it is runs it
    with exact.forward_context():
        assert not replaced.active  # the exact arm beside it runs the base forward
        with exact.forward_context() as inner:  # a method's own entry point inside its shell's context
            assert inner.entered == [None] and not replaced.active  # opens nothing again
        assert not replaced.active  # and leaving it closes nothing
    assert replaced.active
    with pytest.raises(RuntimeError), exact.forward_context():
        raise RuntimeError("a failed request")
    assert replaced.active  # restored after a failure too
    with exact.forward_context():
        assert not replaced.active  # and opens again for the next request
    context = exact.forward_context()
    with context:
        with context:  # one context object entered twice
            assert not replaced.active
        assert not replaced.active  # its inner exit closes nothing
    assert replaced.active


def test_a_generation_cache_reads_the_requests_plan_without_asking_again(tiny_model):
    from rf_eval.methods.requests import generation_cache
    from rf_eval.ridgefill.method import RidgeFill

    model, tok = tiny_model("llama")
    rf = RidgeFill(model, tok, split=3, tail=4, fill="identity")
    prompt = torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    plan, plain = rf.plan(12), rf.plan(3)
    asked: list[int] = []
    rf.plan = lambda n: asked.append(n) or plan  # type: ignore[method-assign]
    assert generation_cache(rf, prompt, plan).prompt_length == 11 and asked == []
    assert generation_cache(rf, prompt[:3], plain) is None and asked == []
