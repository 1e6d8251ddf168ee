"""Transfer-map fit: streaming = one-shot, RoPE undone/redone, R² layer choice, the two score forms, refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open

from rf_eval.cli import main
from rf_eval.integrity.tokenizers import TokenizerMismatch
from rf_eval.rarecache.cost import speedup_ceiling
from rf_eval.rarecache.features import cache_entries, prefill_cache, rope_tables, unrotate
from rf_eval.rarecache.fit import accumulate, fit_transfer, single_source_r2, top_layers
from rf_eval.rarecache.maps import SIDES, load_transfer_maps
from rf_eval.rarecache.method import RaReCache
from rf_eval.rarecache.transfer import Mapper
from rf_eval.ridge.calibration import tokenized
from rf_eval.ridge.maps import MapError
from rf_eval.testing import make_tiny_model

LAM = 0.01


def stacked(f, calibration):
    """All calibration rows at once: side -> (source entries per layer, target entries per layer), fp64."""
    src = {s: [] for s in SIDES}
    tgt = {s: [] for s in SIDES}
    for ids in tokenized(f["tokenizer"], calibration, "cpu", 32768, "", False):
        for model, out in ((f["source"], src), (f["target"], tgt)):
            from rf_eval.families import family_for

            entries = cache_entries(model, family_for(model.config), prefill_cache(model, ids))
            for side, per_layer in zip(SIDES, entries):
                out[side].append([e.double() for e in per_layer])
    cat = lambda docs: [torch.cat(layer, 0) for layer in zip(*docs)]  # noqa: E731
    return {s: (cat(src[s]), cat(tgt[s])) for s in SIDES}


@pytest.fixture(scope="module")
def data(fitted, calibration):
    return stacked(fitted("qwen3"), calibration)


def test_streaming_fit_equals_one_shot_solve(fitted, data):
    maps = fitted("qwen3")["maps"]
    for (side, layer), m in maps.maps.items():
        xs, ys = data[side]
        x = torch.cat([xs[j] for j in m.source_layers], -1)
        y = ys[layer]
        xc, yc = x - x.mean(0), y - y.mean(0)
        w = torch.linalg.solve(xc.T @ xc + LAM * torch.eye(x.shape[1], dtype=x.dtype), xc.T @ yc)
        b = y.mean(0) - x.mean(0) @ w
        torch.testing.assert_close(m.weight.double(), w, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(m.bias.double(), b, rtol=1e-3, atol=1e-4)
        # The basis: leading eigenvectors of the calibration predictions' covariance.
        pred = xc @ w
        evals = torch.linalg.eigvalsh(pred.T @ pred / x.shape[0]).flip(0)[: m.basis.shape[1]]
        torch.testing.assert_close(m.eigenvalues.double(), evals, rtol=1e-3, atol=1e-5)
        captured = (pred @ m.basis.double()).pow(2).sum() / pred.pow(2).sum()
        assert captured == pytest.approx(float(evals.sum() * x.shape[0] / pred.pow(2).sum()), rel=1e-3)


def test_r2_layer_choice_matches_direct_least_squares(fitted, calibration, data):
    f = fitted("qwen3")
    docs = tokenized(f["tokenizer"], calibration, "cpu", 32768, "", False)
    sums = accumulate(f["source"], f["target"], docs, stride=1)
    for side in SIDES:
        xs, ys = data[side]
        for layer in range(len(ys)):
            yc = ys[layer] - ys[layer].mean(0)
            direct = []
            for x in xs:
                xc = x - x.mean(0)
                coef = torch.linalg.lstsq(xc, yc).solution
                direct.append(1 - (yc - xc @ coef).pow(2).sum() / yc.pow(2).sum())
            direct = torch.stack(direct)
            ours = single_source_r2(sums, side, layer)
            torch.testing.assert_close(ours, direct, rtol=1e-4, atol=1e-4)
            assert top_layers(ours, 2) == sorted(torch.argsort(direct, descending=True)[:2].tolist())
            assert f["maps"].maps[(side, layer)].source_layers == top_layers(ours, 2)


def test_derotation_then_rerotation_is_identity_on_keys(fitted, prompt):
    from rf_eval.families import family_for

    for family in ("llama", "qwen3"):
        model = fitted(family)["target"]
        fam = family_for(model.config)
        cache = prefill_cache(model, prompt)
        n = prompt.shape[1]
        cos, sin = rope_tables(model, n, "cpu", torch.float32)
        layer = model.model.layers[1]
        h = layer.input_layernorm(_layer_input(model, prompt, 1))
        k_plain, _ = fam.project_kv(layer.self_attn, h)  # keys before RoPE, from the layer itself
        k_rot = cache.layers[1].keys
        torch.testing.assert_close(unrotate(model, fam, k_rot, cos, sin), k_plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fam.rotate(unrotate(model, fam, k_rot, cos, sin), cos, sin), k_rot,
                                   rtol=1e-5, atol=1e-5)


def _layer_input(model, ids, index):
    seen = {}

    def hook(_m, args, kwargs):
        seen["x"] = args[0] if args else kwargs["hidden_states"]

    handle = model.model.layers[index].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.model(input_ids=ids)
    finally:
        handle.remove()
    return seen["x"]


def test_scaled_rope_inverse(fitted):
    """RoPE with attention_scaling != 1 (YaRN): the inverse divides by the squared scaling."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from rf_eval.families import family_for

    model = fitted("llama")["target"]
    cfg = LlamaConfig(**{**model.config.to_dict(), "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 2048}})
    rotary = LlamaRotaryEmbedding(cfg)
    assert rotary.attention_scaling != 1.0
    original = model.model.rotary_emb
    model.model.rotary_emb = rotary
    try:
        fam = family_for(model.config)
        cos, sin = rope_tables(model, 9, "cpu", torch.float32)
        k = torch.randn(1, 2, 9, 16)
        torch.testing.assert_close(unrotate(model, fam, fam.rotate(k, cos, sin), cos, sin), k, rtol=1e-5,
                                   atol=1e-5)
    finally:
        model.model.rotary_emb = original


def test_the_two_forms_of_the_score_agree(fitted, prompt):
    """||ŷ - ŷ^(r)||² from the full and reduced-rank maps (eq. 2) = ||z||² - ||z V_r||² (eq. 9)."""
    f = fitted("llama")
    maps, source = f["maps"], f["source"]
    from rf_eval.families import family_for

    keys, values = cache_entries(source, family_for(source.config), prefill_cache(source, prompt))
    entries = dict(zip(SIDES, ([k.double() for k in keys], [v.double() for v in values])))
    mapper = Mapper(maps, f["target"], torch.float64, "cpu")
    mapped = mapper.map_prompt(entries)
    total = torch.zeros(prompt.shape[1], dtype=torch.float64)
    for (side, layer), m in maps.maps.items():
        w, b, v = m.weight.double(), m.bias.double(), m.basis.double()
        x = torch.cat([entries[side][j] for j in m.source_layers], -1)
        x_bar = torch.cat([maps.source_mean[(side, j)].double() for j in m.source_layers])
        y_hat = x @ w + b
        w_r = w @ v @ v.T
        b_r = (x_bar @ w + b) - x_bar @ w_r  # eq. 5: the reduced map's bias refit
        total += (y_hat - (x @ w_r + b_r)).pow(2).sum(-1)
        if side == "value":  # the mapped cache is ŷ = x W + b
            got = mapped.values[layer][0].transpose(0, 1).reshape(prompt.shape[1], -1)
            torch.testing.assert_close(got, y_hat, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(mapped.score.double(), total, rtol=1e-5, atol=1e-6)


def _variant(src_dir, tmp_path):
    """A copy of the source whose tokenizer has one extra token."""
    from transformers import AutoTokenizer

    copy = tmp_path / "source_other_tokenizer"
    shutil.copytree(src_dir, copy)
    tok = AutoTokenizer.from_pretrained(copy)
    tok.add_tokens(["<|extra|>"])
    tok.save_pretrained(copy)
    return copy


def test_different_tokenizers_are_refused(fitted, calibration, tmp_path, capsys):
    f = fitted("llama")
    other = _variant(f["source_dir"], tmp_path)
    with pytest.raises(TokenizerMismatch, match="share a tokenizer"):
        RaReCache.from_pretrained(f["target_dir"], source=other, maps=f["maps_dir"], device="cpu")
    from transformers import AutoTokenizer

    with pytest.raises(TokenizerMismatch, match="share a tokenizer"):
        fit_transfer(f["source"], f["target"], AutoTokenizer.from_pretrained(other), f["tokenizer"], calibration)
    code = main(["fit-transfer", "--source", str(other), "--target", f["target_dir"], "--calibration",
                 *calibration, "--k", "2", "--out", str(tmp_path / "m"), "--device", "cpu", "--no-progress"])
    assert code == 2 and "share a tokenizer" in capsys.readouterr().err


def test_maps_for_another_pair_are_refused(fitted, tmp_path):
    from transformers import AutoModelForCausalLM

    llama, qwen = fitted("llama"), fitted("qwen3")
    other_dir = make_tiny_model("llama", tmp_path / "t5", seed=4, num_hidden_layers=5)
    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    with pytest.raises(MapError, match="another target"):
        RaReCache(other, llama["tokenizer"], source=llama["source"], maps=llama["maps_dir"])
    with pytest.raises(MapError, match="another source"):
        RaReCache(llama["target"], llama["tokenizer"], source=llama["target"], maps=llama["maps_dir"])
    with pytest.raises(MapError, match="another"):
        RaReCache(llama["target"], llama["tokenizer"], source=llama["source"], maps=qwen["maps_dir"])
    with pytest.raises(MapError, match="no RaReCache map file"):
        RaReCache(llama["target"], llama["tokenizer"], source=llama["source"], maps=str(tmp_path))


def test_maps_of_one_architecture_are_told_apart_by_their_weights_and_direction(calibration, tmp_path):
    """Two checkpoints of one architecture share a config hash: the weights fingerprints recorded by the fit
    refuse the pair the other way round, and a third checkpoint of the same shape."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.rarecache.fit import fit_transfer

    a, b, c = (AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path / n, seed=s)).eval()
               for n, s in (("a", 1), ("b", 2), ("c", 3)))
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    fit_transfer(a, b, tok, tok, calibration, k=2, rank=4, lam=0.01, out=tmp_path / "maps")
    RaReCache(b, tok, source=a, maps=str(tmp_path / "maps"))  # the fitted direction: source a, target b
    with pytest.raises(MapError, match="other way round"):
        RaReCache(a, tok, source=b, maps=str(tmp_path / "maps"))
    with pytest.raises(MapError, match="other target weights"):
        RaReCache(c, tok, source=a, maps=str(tmp_path / "maps"))
    with pytest.raises(MapError, match="other source weights"):
        RaReCache(b, tok, source=c, maps=str(tmp_path / "maps"))


def test_fit_transfer_command_writes_maps_with_metadata(tiny_pair_dirs, calibration, tmp_path, capsys):
    source_dir, target_dir = tiny_pair_dirs("qwen3")
    out = tmp_path / "maps"
    code = main(["fit-transfer", "--source", str(source_dir), "--target", str(target_dir), "--calibration",
                 *calibration, "--k", "3", "--rank", "4", "--lambda", "0.02", "--stride", "2", "--out", str(out),
                 "--device", "cpu", "--no-progress"])
    assert code == 0 and "R²_K" in capsys.readouterr().out
    with safe_open(str(out / "rarecache_maps.safetensors"), framework="pt") as fh:
        meta = fh.metadata()
    for key in ("source_config_hash", "target_config_hash", "calibration_sha256", "tokenizer_sha256"):
        assert len(meta[key]) == 64
    assert (meta["k"], meta["rank"], meta["lambda"], meta["stride"]) == ("3", "4", "0.02", "2")
    chosen = json.loads(meta["source_layers"])
    assert all(len(v) == 3 for side in SIDES for v in chosen[side].values())
    maps = load_transfer_maps(out)
    assert maps.maps[("key", 0)].basis.shape == (32, 4)
    before = (out / "rarecache_maps.safetensors").read_bytes()
    again = main(["fit-transfer", "--source", str(source_dir), "--target", str(target_dir), "--calibration",
                  *calibration, "--k", "2", "--rank", "4", "--out", str(out), "--device", "cpu", "--no-progress"])
    assert again == 2 and "already holds rarecache_maps.safetensors" in capsys.readouterr().err
    assert (out / "rarecache_maps.safetensors").read_bytes() == before  # not replaced without --overwrite


def test_eq11_ceiling_reproduces_the_papers_numbers():
    """Qwen3-0.6B -> 14B (appendix B.1, B.4, C.1): k = 8 source layers of 1,024 (d_s 8,192) to d_t 1,024 over
    40 target layers, r = 128, 40 heads x 128; P_T and P_map counted exactly from the 14B's config.

    The text's probe count (one d_t x r basis per layer and side) gives 2.78 / 2.30 / 2.99; the paper prints
    2.74 / 2.28 / 2.95, which the (d_s + d_t) r count of `probe_count="reduced_map"` gives to the digit.
    """
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rf_eval.rarecache.cost import attention_alpha, probe_parameters, target_parameters

    config = Qwen3Config(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                         num_key_value_heads=8, head_dim=128, vocab_size=151936)
    with torch.device("meta"):
        p_target = target_parameters(AutoModelForCausalLM.from_config(config))
    assert round(p_target / 1e9, 1) == 13.2  # the paper's "1.3e10"
    p_map = 40 * 2 * (8192 * 1024 + 1024)  # the paper's "671M map parameters"
    assert round(p_map / 1e6) == 671

    alpha = attention_alpha(40, 40, 128)  # 40 layers, 40 query heads of 128

    def printed(probe_count: str) -> tuple[float, float, float]:
        p_probe = 40 * 2 * probe_parameters(8192, 1024, 128, probe_count)
        at = lambda T, **kw: speedup_ceiling(p_target, p_map, p_probe, T, 0.3, alpha, **kw)  # noqa: E731
        return round(at(2048), 2), round(at(32768), 2), round(at(32768, causal_skip=True), 2)

    assert printed("basis") == (2.78, 2.3, 2.99)  # the text's count (the default)
    assert printed("reduced_map") == (2.74, 2.28, 2.95)  # the paper's printed digits
    at = lambda T, **kw: speedup_ceiling(p_target, p_map, 0, T, 0.3, alpha, **kw)  # noqa: E731
    assert at(10**9) == pytest.approx(1 / 0.6, rel=1e-3)  # the asymptote 1/(2 rho)
    assert at(10**9, causal_skip=True) == pytest.approx(1 / 0.3, rel=1e-3)
    with pytest.raises(ValueError, match="probe_count='full' is not valid; valid counts: basis, reduced_map"):
        probe_parameters(8192, 1024, 128, "full")


def test_parameter_counts_of_fitted_maps_follow_the_probe_count(fitted):
    maps = fitted("llama")["maps"]
    p_map, basis = maps.parameter_counts()
    _, reduced = maps.parameter_counts("reduced_map")
    assert basis == sum(m.basis.numel() for m in maps.maps.values())
    assert reduced - basis == sum(m.weight.shape[0] * m.basis.shape[1] for m in maps.maps.values()) > 0
    assert p_map == sum(m.weight.numel() + m.bias.numel() for m in maps.maps.values())


def test_two_gloo_processes_give_the_one_process_transfer_maps(tiny_pair_dirs, calibration, tmp_path,
                                                              run_in_gloo_processes):
    """Documents sharded over two processes, sums all-reduced: the maps of one process."""
    source_dir, target_dir = tiny_pair_dirs("llama")
    args = ["fit-transfer", "--source", str(source_dir), "--target", str(target_dir), "--calibration", *calibration,
            "--k", "2", "--rank", "4", "--lambda", "0.02", "--device", "cpu", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    outputs = run_in_gloo_processes([*args, "--out", str(tmp_path / "two")])
    one, two = load_transfer_maps(tmp_path / "one"), load_transfer_maps(tmp_path / "two")
    assert one.metadata["rows"] == two.metadata["rows"] and one.metadata["source_layers"] == two.metadata["source_layers"]
    assert one.maps.keys() == two.maps.keys()
    for key, a in one.maps.items():
        b = two.maps[key]
        for name in ("weight", "bias", "eigenvalues"):
            torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-5, atol=1e-6)
        # eigenvectors are defined up to sign: compare the subspaces' projectors
        torch.testing.assert_close(b.basis @ b.basis.T, a.basis @ a.basis.T, rtol=1e-5, atol=1e-5)
    assert "R²_K" in outputs[0] and "R²_K" not in outputs[1]  # rank 0 alone reports and writes
