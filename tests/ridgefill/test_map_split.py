"""`map_split`: by default layer S's filled rows read x_S itself (computed exactly by the lower layers);
with map_split=true they read x̂_S = A_S x_S + b_S, as the paper's released maps do (RidgeFill section 2.2
"Size and cost": maps for layers S..L-1)."""

from __future__ import annotations

import pytest
import torch

from rf_eval.cli import main
from rf_eval.cli.check_equivalence import cache_tensors
from rf_eval.fields import ArmError
from rf_eval.ridge.capture import heldout_cosines
from rf_eval.ridge.maps import RidgeMaps, config_hash, load_maps
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.method import RidgeFill

SPLIT, TAIL = 3, 6


def random_maps(model, seed: int = 0) -> RidgeMaps:
    """Maps for layers S..L-1 with A_l = I + noise (so A_S is not the identity)."""
    gen = torch.Generator().manual_seed(seed)
    d, L = model.config.hidden_size, model.config.num_hidden_layers
    A = {layer: torch.eye(d) + 0.2 * torch.randn(d, d, generator=gen) for layer in range(SPLIT, L)}
    b = {layer: 0.1 * torch.randn(d, generator=gen) for layer in range(SPLIT, L)}
    return RidgeMaps(split=SPLIT, A=A, b=b, metadata={"config_hash": config_hash(model.config)})


def prompt(n: int = 24) -> torch.Tensor:
    return torch.arange(n)[None] % 200 + 5


def split_state(model, ids: torch.Tensor) -> torch.Tensor:
    seen = {}

    def hook(_m, args, kwargs):
        seen["x"] = args[0] if args else kwargs["hidden_states"]

    handle = model.model.layers[SPLIT].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.model(input_ids=ids)
    finally:
        handle.remove()
    return seen["x"]


def test_the_default_reads_x_s_and_model_args_parse_it():
    from rf_eval.cost.mac_model import prefill_macs
    from rf_eval.engine import Plan

    assert RidgeFillArm().map_split is False and Plan(split=1, tail=1).map_split is False
    arm = RidgeFillArm.from_fields({"fill": "ridge", "map_split": "true"})
    assert arm.map_split is True and arm.describe()["map_split"] is True
    # the cost model charges the map at S only where it is used: the default arm's MACs are map_split=false's
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    default = prefill_macs(config, 1000, split=2, tail=100, fill="ridge")
    assert default == prefill_macs(config, 1000, split=2, tail=100, fill="ridge", map_split=False)
    assert prefill_macs(config, 1000, split=2, tail=100, fill="ridge", map_split=True) - default == 900 * 64 * 64
    with pytest.raises(ArmError, match="map_split"):
        RidgeFillArm.from_fields({"map_split": "maybe"})
    # the served arm and lm-eval's model_args take it as any other arm field
    from rf_eval.methods import METHODS
    from rf_eval.model_adapters.config import method_keys
    from rf_eval.serving.arms import as_fields

    assert "map_split" in METHODS["ridgefill"].arm_fields() and "map_split" in method_keys(METHODS["ridgefill"])
    assert RidgeFillArm.from_fields(as_fields("fill=identity;map_split=false")).map_split is False


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_identity_fill_is_the_same_either_way_bitwise(tiny_model, family):
    model, tok = tiny_model(family)
    ids = prompt()
    on = RidgeFill(model, tok, fill="identity", split=SPLIT, tail=TAIL, map_split=True).prefill(ids)
    off = RidgeFill(model, tok, fill="identity", split=SPLIT, tail=TAIL, map_split=False).prefill(ids)
    assert torch.equal(on.logits, off.logits)
    a, b = cache_tensors(on.cache), cache_tensors(off.cache)
    assert len(a) == len(b) and len(a) >= 2 * model.config.num_hidden_layers
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_layer_s_filled_rows_read_the_map_with_map_split(tiny_model):
    model, tok = tiny_model("llama")
    maps, ids = random_maps(model), prompt()
    n, prefix = ids.shape[1], ids.shape[1] - TAIL
    x_s = split_state(model, ids)
    layer = model.model.layers[SPLIT]
    on = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, map_split=True).prefill(ids)
    off = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL).prefill(ids)
    # by hand: layer S's keys of the filled rows from x̂_S = A_S x_S + b_S, or from x_S itself
    cos, sin = model.model.rotary_emb(x_s, torch.arange(n)[None])
    from rf_eval.families import family_for

    family = family_for(model.config)
    with torch.no_grad():
        x_hat = x_s @ maps.A[SPLIT].T + maps.b[SPLIT]
        k_hat, v_hat = family.kv(layer.self_attn, layer.input_layernorm(x_hat), cos, sin)
        k_true, v_true = family.kv(layer.self_attn, layer.input_layernorm(x_s), cos, sin)
    got_on, got_off = on.cache.layers[SPLIT], off.cache.layers[SPLIT]
    torch.testing.assert_close(got_on.keys[:, :, :prefix], k_hat[:, :, :prefix], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_on.values[:, :, :prefix], v_hat[:, :, :prefix], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_off.keys[:, :, :prefix], k_true[:, :, :prefix], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got_on.keys[:, :, :prefix], got_off.keys[:, :, :prefix], atol=1e-3)
    # the tail is exact in both
    torch.testing.assert_close(got_on.keys[:, :, prefix:], k_true[:, :, prefix:], rtol=1e-5, atol=1e-5)
    rf = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL)
    assert rf.provenance()["map_split"] is False and rf.arm.plan.map_split is False


def test_default_arm_with_fitted_maps_writes_layer_s_exactly(tiny_model, tiny_model_dir, tmp_path):
    """Acceptance of #23: maps fitted by `rf-eval fit` hold A_S, and the default arm ignores it: layer S's
    keys and values for filled rows equal the stock model's (<= 1e-5); with map_split=true they do not."""
    model, tok = tiny_model("llama")
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river stone and the quiet market, seven blue lamps over the harbour wall. " * 12)
    out = tmp_path / "maps"
    assert main(["fit", "--model", tiny_model_dir("llama"), "--splits", str(SPLIT), "--calibration", str(corpus),
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    maps = load_maps(out, SPLIT)
    assert SPLIT in maps.A  # the release format's map at S is in the file
    ids = prompt()
    prefix = ids.shape[1] - TAIL
    with torch.no_grad():
        stock = model(input_ids=ids, use_cache=True).past_key_values.layers[SPLIT]
    for map_split in (False, True):
        kwargs = {"map_split": True} if map_split else {}
        got = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, **kwargs).prefill(ids).cache.layers[SPLIT]
        k_err = (got.keys[:, :, :prefix] - stock.keys[:, :, :prefix]).abs().max().item()
        v_err = (got.values[:, :, :prefix] - stock.values[:, :, :prefix]).abs().max().item()
        if map_split:
            assert max(k_err, v_err) > 1e-3  # A_S x_S + b_S is a shrunk copy of x_S, not x_S
        else:
            assert k_err <= 1e-5 and v_err <= 1e-5
        # the next late layer reads the map either way: its filled rows are not the stock model's
        nxt = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, **kwargs).prefill(ids).cache.layers[SPLIT + 1]
        stock_next = model(input_ids=ids, use_cache=True).past_key_values.layers[SPLIT + 1]
        assert (nxt.keys[:, :, :prefix] - stock_next.keys[:, :, :prefix]).abs().max() > 1e-4


def test_heldout_lambda_choice_scores_layer_s_with_map_split(tiny_model):
    model, _ = tiny_model("qwen3")
    maps = random_maps(model)
    docs = [prompt(16)]
    cand = {0.1: (maps.A, maps.b)}
    on = heldout_cosines(model, docs, SPLIT, cand, map_split=True)[0.1]
    off = heldout_cosines(model, docs, SPLIT, cand)[0.1]
    late = model.config.num_hidden_layers - SPLIT
    assert on[1] == 16 * late and off[1] == 16 * (late - 1)
    assert on[0] < off[0] + 16  # layer S's rows score below 1 each under a non-identity map


def test_fit_records_map_split(tiny_model_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river stone and the quiet market, seven blue lamps. " * 4)
    for flag, want in (([], "false"), (["--map-split"], "true")):
        out = tmp_path / f"maps{want}"
        assert main(["fit", "--model", tiny_model_dir("llama"), "--splits", str(SPLIT), "--calibration",
                     str(corpus), "--out", str(out), "--device", "cpu", "--no-progress", *flag]) == 0
        assert load_maps(out, SPLIT).metadata["map_split"] == want
