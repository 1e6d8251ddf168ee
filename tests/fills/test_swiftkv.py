"""SwiftKV checkpoints (`rf_eval.files.checkpoints`) and its two fills (#25 item 2).

- the checkpoint layout loads with no remote code, and with the fill off it is its base model, bitwise;
- `swiftkv` with SwiftKV's projections equal to the layers' own (norm_swiftkv all ones) is `identity`;
- on random SwiftKV weights, `swiftkv` writes the filled rows' late K/V from SwiftKV's projections of x_S
  and `swiftkv_released` is SwiftKV's forward as its authors define it, both checked against a reference
  written out here from the layers' weights;
- the rules: which models, splits and settings each fill refuses.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rf_eval.cost.mac_model import layer_costs, prefill_macs
from rf_eval.engine import Plan, plain_prefill, prefill
from rf_eval.fields import ArmError
from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.testing import make_tiny_model, make_tiny_swiftkv

N, TAIL = 40, 6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(family="llama", first=2, group=2, like_own=False):
        key = (family, first, group, like_own)
        if key not in made:
            made[key] = make_tiny_swiftkv(tmp_path_factory.mktemp("swiftkv"), family, first, group, like_own=like_own)
        return made[key]

    return get


def prompt(n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + turned * sin[:, None]


def heads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    return t.view(*t.shape[:2], -1, head_dim).transpose(1, 2)


def reference(model, ids: torch.Tensor, swiftkv_from: int | None, released: bool) -> tuple[torch.Tensor, dict]:
    """Every row's logits and each layer's rotated keys and values, written out from the layers' weights.

    Layers below `swiftkv_from` (None: every layer) are the base model's. From it on, each layer's keys and
    values come from its group's SwiftKV projections of norm_swiftkv(x at `swiftkv_from`); `released` also
    takes queries from q_proj_swiftkv (SwiftKV's forward), else from the layer's own q_proj.
    """
    config, inner = model.config, model.model
    n, head_dim = ids.shape[1], config.head_dim
    x = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(x, torch.arange(n)[None])
    causal = torch.full((n, n), float("-inf")).triu(1)
    kv, first, group = {}, config.num_key_value_layers, config.key_value_group_size
    for index, layer in enumerate(inner.layers):
        attn = layer.self_attn
        if index == swiftkv_from:
            state = inner.norm_swiftkv(x)
        h = layer.input_layernorm(x)
        if swiftkv_from is None or index < swiftkv_from:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        else:
            lead = inner.layers[first + (index - first) // group * group].self_attn
            q = attn.q_proj_swiftkv(h) if released else attn.q_proj(h)
            k, v = lead.k_proj_swiftkv(state), lead.v_proj_swiftkv(state)
        q, k, v = heads(q, head_dim), heads(k, head_dim), heads(v, head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        kv[index] = (k, v)
        repeat = q.shape[1] // k.shape[1]
        k_all, v_all = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        weights = torch.softmax(q @ k_all.transpose(-1, -2) / math.sqrt(head_dim) + causal, dim=-1)
        context = (weights @ v_all).transpose(1, 2).reshape(1, n, -1)
        x = x + attn.o_proj(context)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(inner.norm(x)), kv


def test_the_layout_loads_as_its_base_model_with_the_fill_off(checkpoints, tmp_path):
    swift_dir = checkpoints()
    base = AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path / "base"), dtype=torch.float32)
    exact = RidgeFill.from_pretrained(swift_dir, fill="exact", device="cpu", dtype="float32")
    assert exact.model.config.model_type == "llama_swiftkv" and exact.model.config.num_key_value_layers == 2
    assert exact.model.model.norm_swiftkv.weight.shape == (64,)
    assert not hasattr(exact.model.model.layers[1].self_attn, "q_proj_swiftkv")  # below L: the base model only
    assert not hasattr(exact.model.model.layers[3].self_attn, "k_proj_swiftkv")  # in a group: shares layer 2's
    ids = prompt()
    assert torch.equal(exact.prefill(ids).logits, plain_prefill(base, ids).logits)
    ridge_free = RidgeFill(exact.model, fill="identity", split=3, tail=TAIL)
    assert ridge_free.arm.split == 3  # identity and ridge run on it as on any llama


def test_swiftkv_with_the_layers_own_projections_is_the_identity_fill(checkpoints):
    model = AutoModelForCausalLM.from_pretrained(checkpoints(first=2, group=1, like_own=True), dtype=torch.float32)
    ids = prompt()
    swift = RidgeFill(model, fill="swiftkv", tail=TAIL)
    identity = RidgeFill(model, fill="identity", split=2, tail=TAIL)
    assert swift.arm.split == 2  # the default: SwiftKV's own num_key_value_layers
    a, b = swift.prefill(ids), identity.prefill(ids)
    assert (a.logits - b.logits).abs().max() < 1e-5
    for layer in range(2, 6):
        for got, want in zip(a.cache.layers[layer].keys, b.cache.layers[layer].keys):
            assert (got - want).abs().max() < 1e-5


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_swiftkv_fills_the_filled_rows_from_swiftkvs_projections(checkpoints, family):
    model = AutoModelForCausalLM.from_pretrained(checkpoints(family), dtype=torch.float32).eval()
    ids = prompt()
    result = RidgeFill(model, fill="swiftkv", tail=TAIL).prefill(ids)
    filled = torch.arange(N - TAIL)
    with torch.no_grad():
        _, swift_kv = reference(model, ids, swiftkv_from=2, released=False)
        _, own_kv = reference(model, ids, swiftkv_from=None, released=False)
    for layer in range(6):
        keys, values = result.cache.layers[layer].keys, result.cache.layers[layer].values
        want_k, want_v = (swift_kv if layer >= 2 else own_kv)[layer]
        assert (keys[:, :, filled] - want_k[:, :, filled]).abs().max() < 1e-4, layer
        assert (values[:, :, filled] - want_v[:, :, filled]).abs().max() < 1e-4, layer
    # the tail is exact: the last row's own keys in the last layer come from its own projections, not SwiftKV's
    last = result.cache.layers[5].keys[:, :, -1]
    assert (last - swift_kv[5][0][:, :, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_swiftkv_released_is_swiftkvs_own_forward_for_prompt_and_decoded_tokens(checkpoints, family):
    model = AutoModelForCausalLM.from_pretrained(checkpoints(family), dtype=torch.float32).eval()
    fingerprint = weights_fingerprint(model)
    ids, more = prompt(), prompt(5, seed=1)
    released = RidgeFill(model, fill="swiftkv_released", tail=TAIL)
    assert weights_fingerprint(model) == fingerprint  # hooks, not new modules: results pair with the exact arm's
    with torch.no_grad():
        want, _ = reference(model, torch.cat([ids, more], 1), swiftkv_from=2, released=True)
    for tail in (1, TAIL, N):  # the partial path and the plain forward alike
        result = prefill(model, ids, Plan(2, tail=tail, fill="swiftkv_released"), fill=released.fill_fn)
        assert (result.logits - want[:, N - 1]).abs().max() < 1e-4, tail
        steps = released.extend(result, more)  # decoded tokens run the model's forward: SwiftKV's
        assert (steps - want[:, N:]).abs().max() < 1e-4, tail
    generated = released.generate(ids, max_new_tokens=3, do_sample=False)
    with torch.no_grad():
        for step in range(3):
            logits, _ = reference(model, generated[:, : N + step], swiftkv_from=2, released=True)
            assert int(logits[0, -1].argmax()) == int(generated[0, N + step])


def test_the_cost_model_charges_swiftkvs_projections_in_each_groups_first_layer(checkpoints):
    config = AutoModelForCausalLM.from_pretrained(checkpoints(), dtype=torch.float32).config
    kv = config.hidden_size * 2 * config.num_key_value_heads * config.head_dim
    assert all(c.write == kv for c in layer_costs(config))
    identity = prefill_macs(config, N, split=2, tail=TAIL, fill="identity")  # K/V in each of layers 2..5
    swift = prefill_macs(config, N, split=2, tail=TAIL, fill="swiftkv")  # in layers 2 and 4 (groups of 2)
    assert identity - swift == (N - TAIL) * 2 * kv
    assert prefill_macs(config, N, split=2, tail=TAIL, fill="swiftkv_released") == swift


@pytest.mark.parametrize(
    "fields, model, message",
    [
        ({"fill": "swiftkv"}, "plain", "needs a SwiftKV checkpoint (model_type llama_swiftkv or qwen2_swiftkv), "
                                       "not model_type 'llama'"),
        ({"fill": "swiftkv_released"}, "plain", "needs a SwiftKV checkpoint"),
        ({"fill": "swiftkv", "split": 1}, "swiftkv", "split=1: SwiftKV's projections start at layer 2"),
        ({"fill": "swiftkv_released", "split": 4}, "swiftkv", "runs at SwiftKV's own split 2"),
        ({"fill": "swiftkv_released", "selector": "random(share=0.1)"}, "swiftkv",
         "has no exact prefix rows to select"),
        ({"fill": "swiftkv", "corrections": "value_rescale(c=64)"}, "swiftkv", "need a fill from predicted inputs"),
    ],
)
def test_bad_swiftkv_arms_are_refused_naming_the_fix(checkpoints, tiny_model_dir, fields, model, message):
    folder = checkpoints() if model == "swiftkv" else tiny_model_dir("llama")
    with pytest.raises(ArmError, match=None) as err:
        RidgeFill.from_pretrained(folder, device="cpu", **fields)
    assert message in str(err.value)


def test_a_released_model_keeps_its_base_forward_for_the_exact_arm_beside_it(checkpoints, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(checkpoints(), dtype=torch.float32).eval()
    ids = prompt()
    base = plain_prefill(model, ids).logits
    released = RidgeFill(model, fill="swiftkv_released", tail=TAIL)
    exact = RidgeFill(model, fill="exact")  # the reference of the same weights, as lm-eval's adapter builds it
    assert not torch.equal(plain_prefill(model, ids).logits, base)  # the model's own forward is SwiftKV's now
    assert torch.equal(exact.prefill(ids).logits, base)  # and the exact arm's is the base model's
    assert torch.equal(exact.generate(ids, max_new_tokens=3, do_sample=False),
                       RidgeFill(AutoModelForCausalLM.from_pretrained(checkpoints(), dtype=torch.float32).eval(),
                                 fill="exact").generate(ids, max_new_tokens=3, do_sample=False))
    with torch.no_grad():
        want, _ = reference(model, ids, swiftkv_from=2, released=True)
    assert (released.prefill(ids).logits - want[:, -1]).abs().max() < 1e-4  # and it pauses nothing for good
    with pytest.raises(ArmError, match="fill=identity needs the model loaded again"):
        RidgeFill(model, fill="identity", split=2)
    with pytest.raises(ArmError, match="fill=swiftkv needs the model loaded again"):
        RidgeFill(model, fill="swiftkv")


def test_check_equivalence_checks_both_fills_the_released_one_against_its_own_forward(checkpoints, capsys):
    from rf_eval.cli import main

    assert main(["check-equivalence", "--model", str(checkpoints()), "--device", "cpu", "--lengths", "48"]) == 0
    out = capsys.readouterr().out
    assert "OK   N=48 fill=swiftkv tail=48: bitwise equal" in out
    assert "OK   N=48 fill=swiftkv_released tail=48: bitwise equal" in out
    assert out.index("fill=swiftkv_released") > out.index("PASS N=48 partial path")  # after the stock checks
    assert "SKIP fill=ridge: fill=ridge needs maps=" in out


def test_a_server_of_one_fill_refuses_a_request_for_the_other_forward(checkpoints):
    from transformers import AutoConfig

    from rf_eval.ridgefill.arm_spec import RidgeFillArm
    from rf_eval.serving import arms

    config = AutoConfig.from_pretrained(checkpoints())
    released = RidgeFillArm.from_fields({"fill": "swiftkv_released"})  # a server's arm, as `serve` parses it
    exact = RidgeFillArm.from_fields({"fill": "exact"})

    def resolve(base, given, config):  # as a RidgeFill server resolves a request's arm
        return arms.resolve(base, given, lambda f: base.updated(f, config), RidgeFill.arm_fields())

    with pytest.raises(arms.ArmError, match="start one with fill=swiftkv_released"):
        resolve(exact, {"fill": "swiftkv_released"}, config)
    with pytest.raises(arms.ArmError, match=r"this one serves fill=swiftkv_released"):
        resolve(released, {"fill": "exact"}, config)
    assert resolve(released, {"tail": "8"}, config).tail == 8


def test_a_late_projection_outside_the_models_forward_is_refused_not_fed_a_stale_state(checkpoints):
    model = AutoModelForCausalLM.from_pretrained(checkpoints(), dtype=torch.float32).eval()
    RidgeFill(model, fill="swiftkv_released", tail=TAIL)
    ids = prompt()
    plain_prefill(model, ids)  # a whole forward: layer 2 kept its state, the last layer let it go
    attn = model.model.layers[3].self_attn
    h = torch.zeros(1, N, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="ran outside the model's own forward"):
        attn.k_proj(h)
