"""RaReCache's per-prompt cost (eq. 11 with the source's prefill charged) and its arms set by a budget."""

from __future__ import annotations

import pytest

from rf_eval.rarecache.method import RaReCache


def eq11_macs(target, source, maps, T: int, k: int) -> tuple[int, int]:
    """(exact, arm) multiply-accumulates written from eq. 11's terms (FLOPs / 2): exact = P_T T + a T^2 / 4;
    arm = (P_map + P_probe) T + k P_T + k a T / 2 + the source's P_S T + a_S T^2 / 4, a = 4 L H d."""

    def params(model):
        return sum(p.numel() for p in model.model.layers.parameters()) + sum(p.numel() for p in model.model.norm.parameters())

    def alpha(cfg):
        return 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim

    p_map = sum(m.weight.numel() + m.bias.numel() for m in maps.maps.values())
    p_probe = sum(m.basis.shape[0] * m.basis.shape[1] for m in maps.maps.values())
    exact = params(target) * T + alpha(target.config) * T * T / 4
    source_cost = params(source) * T + alpha(source.config) * T * T / 4
    arm = (p_map + p_probe) * T + k * params(target) + k * alpha(target.config) * T / 2 + source_cost
    return round(exact), round(arm)


def test_the_cost_is_eq11_with_the_source_charged(fitted, prompt):
    f = fitted("llama")
    T = prompt.shape[1]
    rc = RaReCache(f["target"], f["tokenizer"], source=f["source"], maps=f["maps"], rho=0.3)
    cost = rc.prefill_cost(T, rc.prefill(prompt))
    k = -(-3 * T // 10)  # ceil(0.3 T), the last row counted
    exact, arm = eq11_macs(f["target"], f["source"], f["maps"], T, k)
    assert (cost.exact_macs, cost.prefill_macs, cost.exact_rows) == (pytest.approx(exact, abs=1), pytest.approx(arm, abs=1), k)
    assert cost.cache_entries == cost.exact_cache_entries  # a mapped cache keeps every row
    assert cost.budget is None and cost.layer_pass_speedup is None
    whole = RaReCache(f["target"], f["tokenizer"], source=f["source"], maps=f["maps"], rho=1.0)
    assert whole.prefill_cost(T).macs_fraction == 1.0  # every row recomputed: the target's own prefill


def test_a_budget_sets_the_recomputed_rows_per_length(fitted, prompt):
    """budget=F: the most recomputed rows whose cost (source charged) fits F of exact's; one more passes it."""
    f = fitted("llama")
    rc = RaReCache(f["target"], f["tokenizer"], source=f["source"], maps=f["maps"], budget=0.9)
    for T in (prompt.shape[1], 200, 1000):
        k = rc.plan(T).setting
        exact, arm = eq11_macs(f["target"], f["source"], f["maps"], T, k)
        _, more = eq11_macs(f["target"], f["source"], f["maps"], T, k + 1)
        assert arm <= 0.9 * exact < more or k == T
        cost = rc.prefill_cost(T)
        assert cost.macs_fraction <= 0.9 and cost.knob_value == pytest.approx(k / T) and cost.budget == 0.9
    result = rc.prefill(prompt)
    assert result.exact_rows.numel() == rc.plan(prompt.shape[1]).setting
    assert rc.provenance()["budget"] == 0.9 and rc.provenance()["rho"] is None


@pytest.mark.parametrize("fields, says", [
    ({"budget": 0.9, "rho": 0.3}, "give rho or budget, not both"),
    ({"budget": 0.0}, "0 < budget <= 1"),
    ({"budget": 0.001}, "budget=0.001 is below the cheapest"),
])
def test_bad_rarecache_budgets(fitted, fields, says):
    from rf_eval.fields import ArmError

    f = fitted("llama")
    with pytest.raises(ArmError, match=says):
        RaReCache(f["target"], f["tokenizer"], source=f["source"], maps=f["maps"], **fields)


def test_the_adapter_refuses_an_unreachable_budget_before_the_weights(fitted, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.config import ModelArgsError
    f = fitted("llama")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ModelArgsError, match="budget=0.001 is below the cheapest"):
        prefill_lm.rarecache.create_from_arg_obj({"pretrained": f["target_dir"], "source": f["source_dir"],
                                         "maps": f["maps_dir"], "budget": 0.001, "device": "cpu"})


def test_a_study_refuses_an_unreachable_rarecache_budget_before_anything_runs(fitted, tmp_path, monkeypatch):
    """The study preflight asks the arm's method (`RaReCacheMethod.check_budget`), from the configs and maps."""
    from transformers import AutoModelForCausalLM

    from rf_eval.study.preflight import check_arm_args
    from rf_eval.study.study_file import StudyError, load_study

    f = fitted("llama")
    path = tmp_path / "study.yaml"
    path.write_text(f"model: {{pretrained: {f['target_dir']}, args: {{device: cpu}}}}\ntasks: [keytoken_nll]\n"
                    "arms:\n  exact: {args: {fill: exact}}\n"
                    f"  rc: {{model: rarecache, args: {{source: {f['source_dir']}, maps: {f['maps_dir']}, "
                    "budget: 0.001}}\nreference: exact\n")
    study = load_study(path)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(StudyError, match=r"arms.rc: budget=0.001 is below the cheapest"):
        check_arm_args(study, study.arms["rc"])
    study.arms["rc"].args["budget"] = 0.9
    check_arm_args(study, study.arms["rc"])
