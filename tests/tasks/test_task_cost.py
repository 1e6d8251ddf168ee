"""Per-item cost in every rf-eval sample, and arms set by a budget (issue #38), through lm-eval's evaluator on
the tiny Llama: the MACs each sample records equal a count written here from the model's shapes, and a
budget's arm spends at most its budget within one knob step."""

from __future__ import annotations

import json

import pytest
import torch
from warm_start import run_argv

from rf_eval.cost.prefill_cost import COST_FIELDS

OPTS = {"score_tokens": 128, "key_context": 512, "max_seq_lengths": [512], "tail": 64}
SPLIT = 3


def hand_macs(cfg, n: int, split: int | None = None, tail: int | None = None, fill: str = "exact",
              rows: int = 0) -> int:
    """MACs of an n-token prefill of a dense Llama, written from its shapes: every layer's projections and MLP
    per exact row, causal attention (scores and values) per (query, key) pair, a filled row's K/V in a late
    layer (nothing for nofill), selected prefix rows charged attention at the mean prefix position, the last
    row's logits, and for ridge the map (d x d) per filled row from layer S + 1 on."""
    d, heads, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    write = 2 * d * kv * hd
    exact_row = write + 2 * d * heads * hd + 3 * d * cfg.intermediate_size
    per_key = 2 * heads * hd

    def full_layer(m: int) -> int:
        return m * exact_row + per_key * m * (m + 1) // 2

    layers = cfg.num_hidden_layers
    total = d * cfg.vocab_size
    if split is None or tail >= n:
        return total + layers * full_layer(n)
    prefix = n - tail
    filled = prefix - rows
    for layer in range(layers):
        if layer < split:
            total += full_layer(n)
            continue
        total += (tail + rows) * exact_row
        if fill == "nofill":  # exact rows attend to exact rows only
            total += per_key * (tail * rows + tail * (tail + 1) // 2 + rows * (rows + 1) // 2)
        else:
            total += filled * (write + (d * d if fill == "ridge" and layer > split else 0))
            total += per_key * (tail * prefix + tail * (tail + 1) // 2 + rows * (prefix // 2 + 1))
    return total


def evaluate(lm, tasks, metadata, th):
    from lm_eval import simple_evaluate

    return simple_evaluate(model=lm, tasks=tasks, task_manager=th.task_manager(metadata), log_samples=True,
                           bootstrap_iters=0, verbosity="WARNING", limit=2)


def identity_maps(model_dir: str, folder) -> str:
    """A ridge map file of A = I, b = 0 (ridge then fills as identity, and is charged its maps)."""
    from transformers import AutoConfig

    from rf_eval.ridge.maps import RidgeMaps, config_hash

    cfg = AutoConfig.from_pretrained(model_dir)
    late = range(SPLIT, cfg.num_hidden_layers)
    maps = RidgeMaps(split=SPLIT, A={i: torch.eye(cfg.hidden_size) for i in late},
                     b={i: torch.zeros(cfg.hidden_size) for i in late},
                     metadata={"config_hash": config_hash(cfg), "lambda": "0.01", "rows": "10"})
    return str(maps.save(folder))


@pytest.fixture(scope="module")
def lm_class():
    from rf_eval.model_adapters import prefill_lm
    return prefill_lm.ridgefill


def test_every_sample_records_the_cost_the_model_counts(task_data, tiny_llama, th, lm_class):
    """identity at split 3, tail 64: each sample of the needle task and of keytoken_nll records its prompt
    length, the arm's and exact's MACs (equal to `hand_macs`), their ratio, the exact rows, the cache it keeps,
    1/r and measured seconds; the exact arm records exact's cost for the same prompts."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_llama)
    meta = {**OPTS, "pretrained": tiny_llama, "essay_haystack": str(task_data["essays"]), "docs": str(task_data["docs"])}
    arms = {"identity": {"fill": "identity", "split": SPLIT, "reference": "exact"}, "exact": {"fill": "exact"}}
    for name, args in arms.items():  # each adapter built just before its run: the tasks read the newest one
        lm = lm_class(pretrained=tiny_llama, tail=64, device="cpu", **args)
        out = evaluate(lm, ["niah_single_1_filled", "keytoken_nll"], {**meta, "fill": name, "reference": "exact"}, th)
        for task, samples in out["samples"].items():
            assert len(samples) == 2
            for s in samples:
                assert set(COST_FIELDS) <= set(s), task
                prompt = s["arguments"][0][0]
                n = len(lm.encode_prompt(prompt)) if task.startswith("niah") else s["resps"][0][0]["context_tokens"]
                assert s["prompt_tokens"] == n > 64
                exact = hand_macs(cfg, n)
                assert s["exact_macs"] == exact
                if name == "exact":
                    assert s["prefill_macs"] == exact and s["macs_fraction"] == 1.0 and s["exact_rows"] == n
                    assert s["cache_fraction"] == 1.0 and s["budget"] is None
                    continue
                assert s["prefill_macs"] == hand_macs(cfg, n, SPLIT, 64, "identity")
                assert s["macs_fraction"] == pytest.approx(s["prefill_macs"] / exact, rel=1e-12)
                assert s["macs_fraction"] < 1
                assert s["mac_speedup"] == pytest.approx(exact / s["prefill_macs"], rel=1e-12)
                assert s["layer_pass_speedup"] == pytest.approx(1 / (SPLIT / 6 + (1 - SPLIT / 6) * 64 / n))
                assert s["exact_rows"] == 64 and s["cache_fraction"] == 1.0  # a fill keeps every row's entry
                assert s["prefill_seconds"] > 0
                # keytoken_nll's reference=exact pass times the exact prefill of each prompt beside the arm's
                # (#55 item 6); the needle task has no reference pass
                paired = s["exact_prefill_seconds"]
                assert (paired > 0) if task == "keytoken_nll" else paired is None
        assert out["config"]["rf_eval"]["prefill_timer"].startswith("wall-clock seconds on the CPU")
        res = out["results"]["niah_single_1_filled"]
        assert res["macs_fraction,none"] == pytest.approx(
            sum(s["macs_fraction"] for s in out["samples"]["niah_single_1_filled"]) / 2)  # lm-eval's own table


@pytest.mark.parametrize("arm, knob", [
    ({"fill": "identity"}, "tail"),
    ({"fill": "ridge"}, "tail"),
    ({"fill": "nofill"}, "tail"),
    ({"fill": "identity", "tail": 32, "selector": "attention(layers=0|1)"}, "rows"),
])
def test_a_budget_spends_at_most_its_share_within_one_knob_step(arm, knob, task_data, tiny_llama, th, lm_class,
                                                                  tmp_path):
    """budget=0.6: every sample's MACs (recounted by `hand_macs` at the value the knob took) are at most 0.6 of
    exact's, and one step more of the knob would pass it."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_llama)
    args = {**arm, "split": SPLIT, "budget": 0.6, "reference": "exact"}
    if arm["fill"] == "ridge":
        args = {**arm, "budget": 0.6, "reference": "exact", "maps": identity_maps(tiny_llama, tmp_path)}
    lm = lm_class(pretrained=tiny_llama, device="cpu", **args)
    meta = {**OPTS, "pretrained": tiny_llama, "docs": str(task_data["docs"]), **args}
    samples = evaluate(lm, ["keytoken_nll"], meta, th)["samples"]["keytoken_nll"]
    fill = arm["fill"]
    for s in samples:
        n, value = s["prompt_tokens"], int(s["knob_value"])
        assert s["budget"] == 0.6 and s["macs_fraction"] <= 0.6
        exact = hand_macs(cfg, n)
        if knob == "tail":
            assert s["prefill_macs"] == hand_macs(cfg, n, SPLIT, value, fill) <= 0.6 * exact
            assert hand_macs(cfg, n, SPLIT, value + 1, fill) > 0.6 * exact  # one more tail row passes it
            assert s["exact_rows"] == value
        else:
            assert s["prefill_macs"] == hand_macs(cfg, n, SPLIT, 32, fill, rows=value) <= 0.6 * exact
            assert hand_macs(cfg, n, SPLIT, 32, fill, rows=value + 1) > 0.6 * exact  # one more row passes it
            assert s["exact_rows"] == 32 + value and value > 0
        if fill == "nofill":
            assert s["cache_fraction"] == pytest.approx((SPLIT * n + 3 * value) / (6 * n))
    info = lm.get_model_info()["rf_eval"]
    assert info["budget"] == 0.6 and info["knob"] == knob


@pytest.mark.parametrize("args, says", [
    ({"fill": "identity", "split": SPLIT, "budget": 0.01}, "budget=0.01 is below the cheapest this arm reaches"),
    ({"fill": "identity", "split": SPLIT, "budget": 0}, "0 < budget <= 1"),
    ({"fill": "identity", "split": SPLIT, "budget": 1.5}, "0 < budget <= 1"),
    ({"fill": "identity", "split": SPLIT, "budget": "half"}, "budget='half' has the wrong type"),
    ({"fill": "exact", "budget": 0.6}, "the exact arm (fill=exact) spends exact prefill's MACs"),
    ({"fill": "nofill", "split": SPLIT, "budget": 0.6, "cost_match": "identity"}, "give budget or cost_match"),
    ({"fill": "identity", "split": SPLIT, "budget": 0.6, "selector": "special"}, "chooses its rows by a rule"),
    ({"fill": "identity", "split": SPLIT, "budget": 0.6, "selector": "attention+special"},
     "chooses its rows by a rule"),
])
def test_bad_budgets_are_refused_before_the_weights_load(args, says, tiny_llama, lm_class, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters.config import ModelArgsError

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ModelArgsError, match=says.replace("(", r"\(").replace(")", r"\)")):
        lm_class(pretrained=tiny_llama, device="cpu", **args)


def test_an_unreachable_budget_exits_2_in_one_line_through_lm_eval(tiny_llama, th, tmp_path):
    cmd = th.lm_eval_argv() + ["--model", "ridgefill", "--model_args",
                               f"pretrained={tiny_llama},fill=identity,split={SPLIT},budget=0.01",
                               "--tasks", "keytoken_nll", "--output_path", str(tmp_path)]
    done = run_argv(cmd, timeout=300, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("lm_eval:") or "rf-eval" in line]
    assert "Traceback" not in done.stderr and any("budget=0.01 is below the cheapest" in line for line in lines)


def test_served_and_python_arms_take_a_budget(tiny_llama, lm_class):
    """The server's rf_arm (`arm_with`) and the Python API build the same budget arm."""
    from rf_eval.ridgefill.method import RidgeFill

    lm = lm_class(pretrained=tiny_llama, fill="identity", split=SPLIT, tail=64, device="cpu")
    served = lm.arm_with({"budget": 0.6})
    method = lm.method_for(served)
    python = RidgeFill(lm.model, lm.tokenizer, fill="identity", split=SPLIT, budget=0.6)
    for n in (200, 700):
        assert method.plan(n) == python.plan(n) and method.plan(n).setting[0].tail < n
        assert method.prefill_cost(n).macs_fraction <= 0.6
    assert json.loads(json.dumps(method.provenance()))["budget"] == 0.6
