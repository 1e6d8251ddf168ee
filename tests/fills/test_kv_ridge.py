"""`kv_ridge` (#25 item 3): ridge maps from x_S to late layers' keys and values, fitted as RidgeFill fits."""

from __future__ import annotations

import pytest
import torch
from filled_reference import FLOOR, assert_matches, reference
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rf_eval.cli import main
from rf_eval.cost.mac_model import layer_costs, prefill_macs
from rf_eval.engine import Plan, prefill
from rf_eval.fields import ArmError
from rf_eval.fills import fill_named
from rf_eval.ridge.maps import load_maps
from rf_eval.ridgefill.fitting import fit_maps
from rf_eval.ridgefill.method import RidgeFill

SPLIT, LAM = 3, 0.1
TEXTS = ["the cat sat on the mat and the dog ran to the red house by the river " * 6,
         "numbers one two three four five six seven eight nine ten and back again " * 5,
         "a quick brown fox jumps over the lazy dog while the bird sings in the tree " * 5]


def fit_kv(tiny_model, out, family: str):
    """kv_ridge maps of a tiny model fitted at SPLIT on TEXTS (one file each): (maps folder, files)."""
    model, tok = tiny_model(family)
    files = []
    for i, text in enumerate(TEXTS):
        files.append(out / f"cal{i}.txt")
        files[-1].write_text(text)
    fit_maps(model, tok, splits=[SPLIT], calibration=[str(f) for f in files], lambdas=[LAM], out=out / "maps",
             progress=False, fill="kv_ridge")
    return out / "maps", files


@pytest.fixture(scope="module")
def kv_maps(tiny_model, tmp_path_factory):
    return fit_kv(tiny_model, tmp_path_factory.mktemp("kv"), "llama")


def test_the_streaming_fit_equals_a_one_shot_least_squares_solve(tiny_model, kv_maps):
    """Each late layer's [keys before RoPE; values] regressed on x_S, solved at once from stacked rows (the
    stock forward's hidden states and the layers' own projections, no rf-eval capture code)."""
    model, tok = tiny_model("llama")
    folder, files = kv_maps
    maps = load_maps(folder, SPLIT)
    assert (maps.metadata["fill"], maps.metadata["target"]) == ("kv_ridge", "kv")
    xs, ys = [], {layer: [] for layer in maps.layers}
    with torch.no_grad():
        for f in files:
            ids = tok(f.read_text(), return_tensors="pt").input_ids
            hidden = model(ids, output_hidden_states=True).hidden_states
            xs.append(hidden[SPLIT][0].double())
            for layer in maps.layers:
                block = model.model.layers[layer]
                h = block.input_layernorm(hidden[layer])
                ys[layer].append(torch.cat([block.self_attn.k_proj(h), block.self_attn.v_proj(h)], -1)[0].double())
    x = torch.cat(xs)
    xc = x - x.mean(0)
    gram = xc.T @ xc
    ridged = gram + LAM * torch.trace(gram) / x.shape[1] * torch.eye(x.shape[1], dtype=torch.float64)
    for layer in maps.layers:
        y = torch.cat(ys[layer])
        a_t = torch.linalg.solve(ridged, xc.T @ (y - y.mean(0)))
        torch.testing.assert_close(maps.A[layer].double(), a_t.T, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(maps.b[layer].double(), y.mean(0) - x.mean(0) @ a_t, rtol=1e-4, atol=1e-5)
    assert maps.A[SPLIT + 1].shape == (2 * model.config.num_key_value_heads * 16, model.config.hidden_size)


def test_filled_rows_hold_the_maps_keys_and_values(tiny_model, kv_maps):
    """The stock forward, its late attention layers' filled-row K/V replaced by the maps' prediction (keys
    rotated at their positions; layer S's own, from the exact x_S), computes the engine's cache and logits."""
    model, tok = tiny_model("llama")
    maps = load_maps(kv_maps[0], SPLIT)
    n, tail = 36, 5
    ids = torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(2))
    got = RidgeFill(model, tok, fill="kv_ridge", maps=maps, tail=tail).prefill(ids)
    filled = torch.arange(n - tail)
    with torch.no_grad():
        x_split = model(ids, output_hidden_states=True).hidden_states[SPLIT][:, filled]
        cos, sin = model.model.rotary_emb(x_split, filled[None])
    heads, dim = model.config.num_key_value_heads, 16

    def kv(layer, k, v):
        if layer > SPLIT:
            flat = x_split @ maps.A[layer].T + maps.b[layer]
            pk, pv = (t.reshape(1, len(filled), heads, dim).transpose(1, 2) for t in flat.chunk(2, -1))
            k[:, :, filled] = apply_rotary_pos_emb(pk, pk, cos, sin)[0]
            v[:, :, filled] = pv
        return k, v

    logits, cache = reference(model, ids, SPLIT, filled, None, kv=kv)
    assert_matches(got.cache, got.logits, cache, logits[:, -1], filled, SPLIT, bitwise=False, atol=FLOOR)
    plain = prefill(model, ids, Plan(SPLIT, tail=n, fill="kv_ridge"), fill=maps.fill_fn(torch.float32, "cpu"))
    assert not torch.equal(plain.logits, got.logits)


def test_maps_of_one_target_are_refused_by_the_other_fill(tiny_model, kv_maps, tmp_path):
    model, tok = tiny_model("llama")
    kv = load_maps(kv_maps[0], SPLIT)
    with pytest.raises(ArmError, match="fill=ridge reads maps of late layers' inputs; .* holds maps of target 'kv'"):
        RidgeFill(model, tok, fill="ridge", maps=kv)
    cal = tmp_path / "cal.txt"
    cal.write_text(TEXTS[0])
    fit_maps(model, tok, splits=[SPLIT], calibration=[str(cal)], lambdas=[LAM], out=tmp_path / "ridge", progress=False)
    with pytest.raises(ArmError, match="fill=kv_ridge reads maps of keys and values"):
        RidgeFill(model, tok, fill="kv_ridge", maps=tmp_path / "ridge")


@pytest.fixture(scope="module")
def hybrid_maps(tiny_model, tmp_path_factory):
    folder, files = fit_kv(tiny_model, tmp_path_factory.mktemp("kv_hybrid"), "qwen3_5")
    return load_maps(folder, SPLIT), files


def test_a_gated_deltanet_layers_map_predicts_its_normed_input(tiny_model, hybrid_maps):
    """On a hybrid model each Gated DeltaNet layer's map is the ridge solve of its normed input (what its
    stock mixer reads) on x_S, from the stock forward's hidden states; attention layers keep K/V maps."""
    model, tok = tiny_model("qwen3_5")
    maps, files = hybrid_maps
    types = model.config.get_text_config().layer_types
    recurrent = [layer for layer in maps.layers if types[layer] == "linear_attention"]
    assert recurrent and len(recurrent) < len(maps.layers)
    xs, ys = [], {layer: [] for layer in recurrent}
    with torch.no_grad():
        for f in files:
            ids = tok(f.read_text(), return_tensors="pt").input_ids
            hidden = model(ids, output_hidden_states=True).hidden_states
            xs.append(hidden[SPLIT][0].double())
            for layer in recurrent:
                ys[layer].append(model.model.layers[layer].input_layernorm(hidden[layer])[0].double())
    x = torch.cat(xs)
    xc = x - x.mean(0)
    gram = xc.T @ xc
    ridged = gram + LAM * torch.trace(gram) / x.shape[1] * torch.eye(x.shape[1], dtype=torch.float64)
    for layer in recurrent:  # (attention layers' K/V maps: the llama test above)
        y = torch.cat(ys[layer])
        a_t = torch.linalg.solve(ridged, xc.T @ (y - y.mean(0)))
        torch.testing.assert_close(maps.A[layer].double(), a_t.T, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(maps.b[layer].double(), y.mean(0) - x.mean(0) @ a_t, rtol=1e-4, atol=1e-5)


def test_on_a_hybrid_model_the_kv_strategy_with_the_layers_own_writes_is_the_identity_fill(tiny_model, hybrid_maps):
    """A K/V map that returns what the identity fill writes (the layers' own K/V of x_S; a Gated DeltaNet
    layer's own norm of x_S) makes the K/V strategy compute the identity fill: its scan of Gated DeltaNet
    layers is checked against the predicted-input strategy's, through the engine and with fitted maps."""
    from rf_eval.engine import PredictedKV
    from rf_eval.families import family_for
    from rf_eval.ridge.targets import kv_rows

    model, tok = tiny_model("qwen3_5")
    family, layers = family_for(model.config), model.model.layers
    n, tail = 36, 5
    ids = torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(3))

    def own_writes(layer, x):
        if family.is_recurrent(layers[layer]):
            return family.input_norm(layers[layer], x)
        return kv_rows(family, layers[layer], x)[None]

    plan = Plan(SPLIT, tail=tail, fill="kv_ridge")
    got = prefill(model, ids, plan, fill=PredictedKV(own_writes))
    identity = prefill(model, ids, Plan(SPLIT, tail=tail, fill="identity"), fill=lambda layer, x: x)
    assert (got.logits - identity.logits).abs().max() < 1e-5
    fitted = RidgeFill(model, tok, fill="kv_ridge", maps=hybrid_maps[0], tail=tail).prefill(ids)
    assert torch.isfinite(fitted.logits).all() and (fitted.logits - identity.logits).abs().max() > 1e-4


@pytest.mark.parametrize("args, message", [
    (["--fill", "nofill", "--model", "{llama}"], "--fill: fill 'nofill' has no maps to fit; fills with maps: kv_ridge, ridge"),
    (["--fill", "kv_rdige", "--model", "{llama}"], "--fill: unknown fill 'kv_rdige'"),
])  # fmt: skip
def test_fit_refuses_a_fill_it_cannot_fit_before_the_model_loads(tiny_model_dir, tmp_path, capsys, args, message):
    values = {"hybrid": tiny_model_dir("qwen3_5"), "llama": tiny_model_dir("llama")}
    cal = tmp_path / "cal.txt"
    cal.write_text(TEXTS[0])
    capsys.readouterr()
    argv = [a.format(**values) for a in args]
    assert main(["fit", *argv, "--splits", "2", "--calibration", str(cal), "--out", str(tmp_path / "m"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Loading weights" not in err and not (tmp_path / "m").exists()


def test_the_cost_model_charges_the_kv_map_in_place_of_the_projections(tiny_model):
    model, _ = tiny_model("llama")
    config, n, tail = model.config, 64, 8
    kv_width = 2 * config.num_key_value_heads * 16
    mapped_layers = config.num_hidden_layers - SPLIT - 1  # layer S reads x_S: its own projections
    writes = sum(c.write for c in layer_costs(config)[SPLIT + 1:])
    kv = prefill_macs(config, n, split=SPLIT, tail=tail, fill="kv_ridge")
    identity = prefill_macs(config, n, split=SPLIT, tail=tail, fill="identity")
    assert kv - identity == (n - tail) * (mapped_layers * config.hidden_size * kv_width - writes)
    assert not fill_named("kv_ridge").supports_corrections


def test_lambda_is_chosen_on_held_out_text_over_attention_and_gated_deltanet_layers(tiny_model, tmp_path):
    """The held-out cosine scores a Gated DeltaNet layer's predicted normed input by the state-update
    projections it drives, beside attention layers' keys and values; a tiny lambda fits the calibration text
    more closely than a huge one, and held-out text that repeats it says so."""
    model, tok = tiny_model("qwen3_5")
    cal, held = tmp_path / "cal.txt", tmp_path / "held.txt"
    cal.write_text(TEXTS[0] + TEXTS[1])
    held.write_text(TEXTS[1])
    result = fit_maps(model, tok, splits=[SPLIT], calibration=[str(cal)], heldout=[str(held)], lambdas=[1e-3, 1e3],
                      out=tmp_path / "maps", progress=False, fill="kv_ridge")
    scores = result.scores[SPLIT]
    assert all(0.0 < s <= 1.0 + 1e-6 for s in scores.values()) and scores[1e-3] > scores[1e3]
    assert result.chosen[SPLIT] == 1e-3


def test_a_projector_trained_elsewhere_loads_from_the_documented_format(tiny_model, tmp_path):
    """The README's recipe: RidgeMaps with target kv and the model's config hash, saved, read by maps=;
    the filled rows' keys and values are then the file's A x_S + b (checked at the last layer's values)."""
    from rf_eval.ridge.maps import RidgeMaps, config_hash

    model, tok = tiny_model("llama")
    d, width = model.config.hidden_size, 2 * model.config.num_key_value_heads * 16
    g = torch.Generator().manual_seed(5)
    layers = range(SPLIT, model.config.num_hidden_layers)
    A = {layer: 0.1 * torch.randn(width, d, generator=g) for layer in layers}
    b = {layer: 0.1 * torch.randn(width, generator=g) for layer in layers}
    RidgeMaps(SPLIT, A, b, {"target": "kv", "config_hash": config_hash(model.config)}).save(tmp_path / "mine")
    n, tail = 30, 4
    ids = torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(6))
    got = RidgeFill(model, tok, fill="kv_ridge", maps=tmp_path / "mine", tail=tail).prefill(ids)
    with torch.no_grad():
        x_split = model(ids, output_hidden_states=True).hidden_states[SPLIT][0, : n - tail]
    last = model.config.num_hidden_layers - 1
    values = (x_split @ A[last].T + b[last])[:, width // 2:].reshape(n - tail, -1, 16).transpose(0, 1)
    torch.testing.assert_close(got.cache.layers[last].values[0, :, : n - tail], values, rtol=1e-4, atol=1e-5)
