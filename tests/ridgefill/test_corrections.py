"""Splices, corrections, rho and the cost-matched control (paper 2.3, 3.3, 6.6, appendix H)."""

import math

import pytest
import torch
from safetensors.torch import save_file

from rf_eval.cli import main as cli_main
from rf_eval.cost.mac_model import cost_matched_tail, prefill_macs
from rf_eval.engine import LateLayerHooks, Plan, plain_prefill, prefill
from rf_eval.ridge.maps import config_hash, identity_fill
from rf_eval.ridge.state_correction import filled_share, load_table, share_bound
from rf_eval.ridgefill.method import RidgeFill

N, TAIL = 48, 8


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


# -- splices ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_splice_of_keys_and_values_gives_the_exact_logits(tiny_model, family):
    model, tok = tiny_model(family)
    ids = prompt()
    ref = plain_prefill(model, ids)
    plain = RidgeFill(model, tok, split=2, tail=TAIL, fill="identity").prefill(ids)
    both = RidgeFill(model, tok, split=2, tail=TAIL, fill="identity", splice="both").prefill(ids)
    assert (plain.logits - ref.logits).abs().max() > 1e-3
    torch.testing.assert_close(both.logits, ref.logits, rtol=1e-5, atol=1e-5)
    for part in ("keys", "values"):
        one = RidgeFill(model, tok, split=2, tail=TAIL, fill="identity", splice=part).prefill(ids)
        assert (one.logits - ref.logits).abs().max() > 1e-6, part


def test_cached_exact_keys_are_exact_keys_rotated_at_their_own_positions(tiny_model):
    """The splice copies the reference cache's keys; they equal pre-RoPE exact keys rotated at their positions."""
    from rf_eval.families import family_for

    model, _ = tiny_model("llama")
    ids = prompt()
    family = family_for(model.config)
    ref = plain_prefill(model, ids)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        cos, sin = model.model.rotary_emb(hidden[0], torch.arange(N)[None])
        for index in (3, 5):
            layer = model.model.layers[index]
            k_pre, _ = family.project_kv(layer.self_attn, layer.input_layernorm(hidden[index]))
            rotated = family.rotate(k_pre, cos, sin)
            torch.testing.assert_close(rotated, ref.cache.layers[index].keys, rtol=1e-6, atol=1e-6)


# -- value and key rescale ---------------------------------------------------------------------------


def test_value_rescale_scales_filled_values_by_the_tail_norm_ratio(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt()
    split, c = 3, 4
    plain = RidgeFill(model, tok, split=split, tail=TAIL, fill="identity").prefill(ids)
    rf = RidgeFill(model, tok, split=split, tail=TAIL, fill="identity", corrections=f"value_rescale(c={c})")
    got = rf.prefill(ids)
    scales = rf.arm.correction_objs[0].last_scales
    assert torch.equal(scales[split], torch.ones_like(scales[split]))  # layer S reads the true split state
    prefix = N - TAIL
    for index in range(split, 6):
        want = plain.cache.layers[index].values[:, :, :prefix] * scales[index][..., None, None]
        torch.testing.assert_close(got.cache.layers[index].values[:, :, :prefix], want, rtol=1e-6, atol=1e-6)
        assert torch.equal(got.cache.layers[index].keys[:, :, :prefix], plain.cache.layers[index].keys[:, :, :prefix])
    # layer S+1: the tail's true input is the exact model's; the prediction is the split state (identity)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        layer = model.model.layers[split + 1]
        rows = slice(prefix, prefix + c)
        v_true = layer.self_attn.v_proj(layer.input_layernorm(hidden[split + 1][:, rows])).view(1, c, -1, 16)
        v_pred = layer.self_attn.v_proj(layer.input_layernorm(hidden[split][:, rows])).view(1, c, -1, 16)
    # the paper's definition (section 2.3): the per-row ratio, averaged over the c rows
    want = (v_true.norm(dim=-1) / v_pred.norm(dim=-1)).mean(1)
    torch.testing.assert_close(scales[split + 1], want, rtol=1e-5, atol=1e-6)
    # the other reduction, on request: the ratio of the mean norms, which differs here
    other = RidgeFill(model, tok, split=split, tail=TAIL, fill="identity",
                      corrections=f"value_rescale(c={c};reduce=ratio_of_means)")
    other.prefill(ids)
    ratio_of_means = v_true.norm(dim=-1).mean(1) / v_pred.norm(dim=-1).mean(1)
    torch.testing.assert_close(other.arm.correction_objs[0].last_scales[split + 1], ratio_of_means, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ratio_of_means, want, rtol=1e-4, atol=0)
    assert rf.arm.correction_objs[0].describe()["reduce"] == "mean_of_ratios"


def test_key_rescale_scales_filled_keys_only(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt()
    plain = RidgeFill(model, tok, split=3, tail=TAIL, fill="identity").prefill(ids)
    rf = RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", corrections="key_rescale(c=4)")
    got = rf.prefill(ids)
    scale = rf.arm.correction_objs[0].last_scales[4]
    assert not torch.allclose(scale, torch.ones_like(scale))
    prefix = N - TAIL
    want = plain.cache.layers[4].keys[:, :, :prefix] * scale[..., None, None]
    torch.testing.assert_close(got.cache.layers[4].keys[:, :, :prefix], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got.cache.layers[4].values[:, :, :prefix], plain.cache.layers[4].values[:, :, :prefix])


# -- rho and the terminal-state correction -----------------------------------------------------------


def test_rho_reproduces_figure_4_and_the_appendix_h_bound():
    filled = torch.arange(200) < 150  # 200 rows, the last 50 exact
    low = filled_share(torch.full((200,), math.log(0.90)), filled)
    high = filled_share(torch.full((200,), math.log(0.995)), filled)
    assert round(float(low), 3) == 0.005
    assert round(float(high), 2) == 0.65
    assert f"{share_bound(0.4, 16):.1e}" == "7.2e-07"
    # the bound holds for any gates <= gamma with the last m rows exact
    gates = torch.rand(300, 4, generator=torch.Generator().manual_seed(0)) * 0.4
    assert (filled_share(gates.log(), torch.arange(300) < 284) <= share_bound(0.4, 16)).all()
    # rho is the filled rows' weight share, w_j = product of the gates after row j
    g = torch.tensor([0.5, 0.9, 0.8, 0.7])
    w = torch.tensor([0.9 * 0.8 * 0.7, 0.8 * 0.7, 0.7, 1.0])
    mask = torch.tensor([True, False, True, False])
    torch.testing.assert_close(filled_share(g.log().double(), mask)[0], (w[mask].sum() / w.sum()).double())


def test_split_gated_deltanet_scan_equals_one_scan(tiny_model):
    model, _ = tiny_model("qwen3_5")
    ids = prompt()
    plan = Plan(split=3, tail=TAIL, fill="identity")
    one = prefill(model, ids, plan, fill=identity_fill)
    two = prefill(model, ids, plan, fill=identity_fill, hooks=LateLayerHooks(prefix_state=lambda view, s: s))
    torch.testing.assert_close(two.logits, one.logits, rtol=1e-5, atol=1e-5)


def test_fit_state_correction_command_and_correction(tiny_model, tiny_model_dir, tmp_path, capsys):
    model, tok = tiny_model("qwen3_5")
    docs = []
    for i in range(2):
        path = tmp_path / f"doc{i}.txt"
        path.write_text(f"Calibration prompt number {i} kept apart from the maps' text, long enough.")
        docs.append(str(path))
    out = tmp_path / "dm"
    code = cli_main(["fit-state-correction", "--model", tiny_model_dir("qwen3_5"), "--fill", "identity",
                     "--split", "3", "--calibration", *docs, "--out", str(out), "--every", "16", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    delta, meta = load_table(out)
    assert sorted(delta) == [4] and delta[4].shape == (4, 16, 16) and delta[4].abs().max() > 0
    assert meta["states"] == str(2 * (len(tok(open(docs[0]).read()).input_ids) // 16))
    assert meta["config_hash"] == config_hash(model.config) and meta["fill"] == "identity"

    ids = prompt()
    spec = f"terminal_state(path={out / 'state_correction_split3.safetensors'})"
    rf = RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", corrections=spec)
    correction = rf.arm.correction_objs[0]
    seen = {}

    def record(view, state):
        seen["in"] = state.clone()
        seen["out"] = correction.prefix_state(view, state)
        seen["gates"] = view.family.log_gates(view.layer.linear_attn, view.h[:, : view.prefix_end])
        return seen["out"]

    correction_hooks = LateLayerHooks(prefix_state=record)
    plain = prefill(model, ids, rf.arm.plan, fill=identity_fill)
    fixed = prefill(model, ids, rf.arm.plan, fill=identity_fill, hooks=correction_hooks)
    assert torch.allclose(correction.last_rho[4], torch.ones(4, dtype=torch.float64))  # every prefix row filled
    torch.testing.assert_close(seen["out"] - seen["in"], delta[4][None], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(fixed.logits, plain.logits)
    # with exact prefix rows, rho is their complement's share of the gate weights
    exact_rows = torch.tensor([5, 20, 39])
    prefill(model, ids, rf.arm.plan, fill=identity_fill, hooks=correction_hooks, select=lambda ctx: exact_rows)
    gates = seen["gates"].exp()
    weights = torch.stack([gates[j + 1 :].prod(0) for j in range(N - TAIL)])  # (rows, heads)
    mask = torch.ones(N - TAIL, dtype=torch.bool)
    mask[exact_rows] = False
    torch.testing.assert_close(correction.last_rho[4], weights[mask].sum(0) / weights.sum(0), rtol=1e-6, atol=1e-9)
    assert rf.provenance()["corrections"][0]["name"] == "terminal_state"
    with pytest.raises(ValueError, match="fitted at split 3"):
        RidgeFill(model, tok, split=2, tail=TAIL, fill="identity", corrections=spec)


def test_terminal_state_refuses_a_table_for_another_fill(tiny_model, tmp_path):
    model, tok = tiny_model("qwen3_5")
    path = tmp_path / "dm.safetensors"
    save_file({"dM.4": torch.zeros(4, 16, 16)}, str(path),
              metadata={"split": "3", "fill": "ridge", "config_hash": config_hash(model.config)})
    with pytest.raises(ValueError, match="fitted for fill 'ridge'"):
        RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", corrections=f"terminal_state(path={path})")
    with pytest.raises(ValueError, match="unknown correction 'state'; valid corrections: value_rescale"):
        RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", corrections="state")
    with pytest.raises(ValueError, match=r"predicted inputs \(identity, ridge\), not fill=nofill"):
        RidgeFill(model, tok, split=3, tail=TAIL, fill="nofill", splice="both")


# -- cost-matched control ----------------------------------------------------------------------------


def test_cost_matched_nofill_tail(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt()
    rf = RidgeFill(model, tok, split=3, tail=TAIL, fill="nofill", cost_match="identity(exact_share=0.1)")
    result = rf.prefill(ids)
    target = prefill_macs(model.config, N, split=3, tail=TAIL, exact_rows=round(0.1 * N), fill="identity")
    tail = result.plan.tail
    assert tail == cost_matched_tail(model.config, N, 3, target) and tail > TAIL
    assert prefill_macs(model.config, N, split=3, tail=tail, fill="nofill") <= target
    assert prefill_macs(model.config, N, split=3, tail=tail + 1, fill="nofill") > target
    assert result.exact_rows.tolist() == list(range(N - tail, N))
    assert rf.provenance()["cost_match"]["exact_share"] == 0.1
    with pytest.raises(ValueError, match="lengthens the tail of an arm without filled rows: it needs fill=nofill"):
        RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", cost_match="ridge")
