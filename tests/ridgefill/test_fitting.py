"""Fitting maps end to end on a tiny model: files, lambda choice, refits, errors, distributed sums."""

import json

import pytest
import torch

from rf_eval.cli import main
from rf_eval.ridge.maps import MapError, RidgeMaps, load_maps, quantize_int8
from rf_eval.ridgefill.fitting import fit_maps, refit_from_sums
from rf_eval.ridgefill.method import RidgeFill


def write_corpus(path, n_docs, seed):
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "1234", "north", "seven", "quiet"]
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as fh:
        for _ in range(n_docs):
            idx = torch.randint(0, len(words), (40,), generator=g).tolist()
            fh.write(json.dumps({"text": " ".join(words[i] for i in idx)}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return write_corpus(d / "calib.jsonl", 6, 0), write_corpus(d / "held.jsonl", 2, 1)


@pytest.fixture(scope="module")
def fitted(tiny_model, corpus, tmp_path_factory):
    model, tok = tiny_model("qwen3")
    out = tmp_path_factory.mktemp("maps")
    result = fit_maps(model, tok, splits=[2, 4], calibration=[corpus[0]], heldout=[corpus[1]],
                      lambdas=[1e-3, 1e-1], out=out, progress=False)
    return out, result


def test_fit_writes_one_file_per_split_with_metadata(fitted, tiny_model):
    out, result = fitted
    model, _ = tiny_model("qwen3")
    for split in (2, 4):
        maps = load_maps(out, split)
        assert maps.layers == list(range(split, 6))
        assert maps.A[split].shape == (64, 64) and maps.b[split].shape == (64,)
        meta = maps.metadata
        assert float(meta["lambda"]) == result.chosen[split]
        assert int(meta["rows"]) == result.rows > 0
        assert len(meta["calibration_sha256"]) == 64
        scores = json.loads(meta["lambda_scores"])
        assert set(scores) == {"0.001", "0.1"} and max(scores.values()) == scores[meta["lambda"]]
        maps.check_model(model.config)


def test_refit_from_sums_equals_fresh_fit(fitted, tiny_model, corpus, tmp_path):
    out, _ = fitted
    model, tok = tiny_model("qwen3")
    refit = refit_from_sums(out, out=tmp_path / "refit", lambdas=[0.3], progress=False)
    fresh = fit_maps(model, tok, splits=[2, 4], calibration=[corpus[0]], lambdas=[0.3],
                     out=tmp_path / "fresh", progress=False)
    assert refit.chosen == fresh.chosen == {2: 0.3, 4: 0.3}
    for split in (2, 4):
        a, b = load_maps(tmp_path / "refit", split), load_maps(tmp_path / "fresh", split)
        for layer in a.layers:
            assert torch.equal(a.A[layer], b.A[layer]) and torch.equal(a.b[layer], b.b[layer])


def test_ridge_arm_uses_maps_and_differs_from_identity(fitted, tiny_model):
    out, _ = fitted
    model, _ = tiny_model("qwen3")
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(0))
    ridge = RidgeFill(model, maps=out, split=4, tail=8, fill="ridge").prefill(ids)
    ident = RidgeFill(model, split=4, tail=8, fill="identity").prefill(ids)
    assert not torch.equal(ridge.logits, ident.logits)
    full_tail = RidgeFill(model, maps=out, split=4, tail=40, fill="ridge").prefill(ids)
    exact = RidgeFill(model, split=4, tail=1, fill="exact").prefill(ids)
    assert torch.equal(full_tail.logits, exact.logits)


def test_fit_int8_writes_the_release_format_and_its_fill_is_within_the_quantization_error(
        fitted, tiny_model_dir, corpus, tmp_path, capsys):
    """`rf-eval fit --int8` stores each A.{l} as int8 with one bf16 scale per 128 weights of a row and a bf16
    bias (App. F); per output, the fill differs from the fp32 maps' by at most sum over the row's groups
    of scale/2 x |x| (each weight is rounded to the nearest multiple of its scale) plus the bias's bf16
    rounding, and a refit from the sums writes fp32 again."""
    from safetensors import safe_open

    model_dir = tiny_model_dir("qwen3")
    args = ["fit", "--model", model_dir, "--splits", "4", "--calibration", corpus[0], "--lambdas", "1e-3",
            "--device", "cpu", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "fp32")]) == 0
    assert main([*args, "--out", str(tmp_path / "int8"), "--int8"]) == 0
    capsys.readouterr()
    file = tmp_path / "int8" / "ridgefill_split4.safetensors"
    with safe_open(str(file), "pt") as f:
        assert f.metadata()["storage"] == "int8"
        assert f.get_tensor("A.5").dtype == torch.int8 and f.get_tensor("b.5").dtype == torch.bfloat16
        scales = {layer: f.get_tensor(f"A.{layer}.scales").float() for layer in (4, 5)}
        assert f.get_tensor("A.5.scales").dtype == torch.bfloat16
    full, packed = load_maps(tmp_path / "fp32", 4), load_maps(tmp_path / "int8", 4)
    x = torch.randn(1, 7, full.A[5].shape[1], generator=torch.Generator().manual_seed(0))
    exact_fill, int8_fill = full.fill_fn(torch.float32, "cpu"), packed.fill_fn(torch.float32, "cpu")
    for layer in (4, 5):
        d, count = x.shape[-1], scales[layer].shape[1]  # the tiny model's 64 inputs are one (padded) group
        groups = torch.nn.functional.pad(x.abs()[0], (0, count * 128 - d)).reshape(7, count, 128).sum(-1)
        bias_error = (full.b[layer] - full.b[layer].to(torch.bfloat16).float()).abs()
        bound = groups @ (scales[layer] / 2).T + bias_error + 1e-5
        diff = (int8_fill(layer, x) - exact_fill(layer, x)).abs()[0]
        assert (diff <= bound).all() and diff.max() > 0
    model = RidgeFill.from_pretrained(model_dir, maps=tmp_path / "int8", fill="ridge", tail=8, device="cpu")
    assert model.provenance()["maps_metadata"]["storage"] == "int8"
    assert main(["fit", "--from-sums", str(tmp_path / "int8"), "--lambdas", "1e-3", "--out", str(tmp_path / "again"),
                 "--no-progress"]) == 0
    again = load_maps(tmp_path / "again", 4)
    assert again.metadata["storage"] == "float32" and torch.equal(again.A[5], full.A[5])


@pytest.mark.parametrize("side_dtype", [torch.bfloat16, torch.float32], ids=["release-bf16", "older-fp32"])
def test_int8_map_files_load_with_bf16_or_fp32_scales_and_biases(fitted, tmp_path, side_dtype):
    """The release's bf16 scales and biases load, and so do the fp32 ones rf-eval wrote before: A is the
    codes times their group's scale, exactly, within 1/127 of the fp32 map's largest weight."""
    out, _ = fitted
    maps = load_maps(out, 4)
    from safetensors.torch import save_file

    tensors = {}
    for layer in maps.layers:
        q, scales = quantize_int8(maps.A[layer])
        tensors[f"A.{layer}"], tensors[f"A.{layer}.scales"] = q, scales.to(side_dtype)
        tensors[f"b.{layer}"] = maps.b[layer].to(side_dtype)
    meta = {k: v for k, v in maps.metadata.items() if k != "file_sha256"}
    save_file(tensors, str(tmp_path / "ridgefill_split4.safetensors"), metadata=meta)
    q = load_maps(tmp_path, 4)
    for layer in maps.layers:
        codes, scales = tensors[f"A.{layer}"], tensors[f"A.{layer}.scales"]
        assert torch.equal(q.A[layer], codes.float() * scales.float())  # 64 inputs: one group per row
        assert torch.equal(q.b[layer], tensors[f"b.{layer}"].float())
        err = (q.A[layer] - maps.A[layer]).abs().max() / maps.A[layer].abs().max()
        assert 0 < err < 1 / 127
        assert q.A[layer].dtype == torch.float32


def test_map_errors_are_clear(fitted, tiny_model, tmp_path):
    out, _ = fitted
    llama, _ = tiny_model("llama")
    with pytest.raises(MapError, match="fitted for another model"):
        RidgeFill(llama, maps=out, split=4, fill="ridge")
    with pytest.raises(MapError, match="no maps for split 3 .* available: ridgefill_split2"):
        load_maps(out, 3)
    with pytest.raises(MapError, match="holds maps for split 4, not 2"):
        load_maps(out / "ridgefill_split4.safetensors", 2)
    bad = tmp_path / "ridgefill_split4.safetensors"
    bad.write_bytes((out / "ridgefill_split4.safetensors").read_bytes()[:200])
    with pytest.raises(MapError, match="cannot read map file"):
        load_maps(bad)
    with pytest.raises(MapError, match="does not exist"):
        load_maps(tmp_path / "nope")
    model, _ = tiny_model("qwen3")
    with pytest.raises(ValueError, match="split=2 contradicts the maps, fitted for split 4"):
        RidgeFill(model, maps=load_maps(out, 4), split=2, fill="ridge")
    maps = load_maps(out, 4)
    partial = RidgeMaps(4, {4: maps.A[4]}, {4: maps.b[4]}, maps.metadata)
    with pytest.raises(MapError, match="expected"):
        partial.check_model(model.config)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--splits", "6"], "split 6 is outside 1..5"),
        (["--splits", "0"], "argument --splits: '0' must be an integer >= 1"),
        (["--splits", "3", "--lambdas", "0"], "argument --lambdas: '0' must be a number > 0"),
        (["--splits", "3", "--lambdas", "-0.5", "0.1"], "argument --lambdas: '-0.5' must be a number > 0"),
        (["--splits", "3", "--lambdas", "0.1", "0.2"], "needs held-out documents"),
    ],
)
def test_cli_bad_input_names_the_value_and_writes_nothing(tiny_model_dir, corpus, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    code = main(["fit", "--model", tiny_model_dir("llama"), "--calibration", corpus[0], "--out", str(out),
                 "--no-progress", *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    ("\n\n", "calibration input is empty"),
    (None, "missing.txt does not exist"),
    # documents that give no row (one token each), issue #54, item 5
    ('{"text": "a"}\n{"text": "b"}\n', "is shorter than 2 tokens under the model's tokenizer"),
])  # fmt: skip
def test_calibration_that_gives_no_row_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys,
                                                                         monkeypatch, text, message):
    from rf_eval.ridgefill import fit_run

    monkeypatch.setattr(fit_run, "load_fit_model", lambda *a, **k: pytest.fail("the model loaded"))
    calibration = tmp_path / ("missing.txt" if text is None else "calibration.jsonl")
    if text is not None:
        calibration.write_text(text)
    out = tmp_path / "out"
    assert main(["fit", "--model", tiny_model_dir("llama"), "--splits", "3", "--calibration", str(calibration),
                 "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_two_gloo_processes_give_the_one_process_maps(tiny_model_dir, corpus, tmp_path, run_in_gloo_processes):
    model_dir = tiny_model_dir("llama")
    args = ["fit", "--model", model_dir, "--splits", "3", "--calibration", corpus[0], "--lambdas", "0.01",
            "--no-progress", "--device", "cpu", "--dtype", "float32"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    run_in_gloo_processes([*args, "--out", str(tmp_path / "two")])
    one, two = load_maps(tmp_path / "one", 3), load_maps(tmp_path / "two", 3)
    assert one.metadata["rows"] == two.metadata["rows"]
    for layer in one.layers:
        torch.testing.assert_close(two.A[layer], one.A[layer], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(two.b[layer], one.b[layer], rtol=1e-6, atol=1e-7)


def test_maps_kept_in_host_memory_stream_one_layer_ahead_and_fill_bitwise_as_resident(fitted, tiny_model):
    """maps_device=cpu: each layer's map reaches the device when its layer asks, the next one's copy already
    issued (on CUDA a side stream overlaps it with the layer), and the prefill is the resident maps', bitwise."""
    from rf_eval.ridge.maps import StreamedMaps

    out, _ = fitted
    model, tok = tiny_model("qwen3")
    maps = load_maps(out, 2)
    streamed = StreamedMaps(maps, torch.float32)
    x = torch.randn(1, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    resident = maps.fill_fn(torch.float32, "cpu")
    for layer in maps.layers:
        assert torch.equal(streamed.fill(layer, x), resident(layer, x))
        upcoming = layer + 1 if layer + 1 in maps.layers else maps.layers[0]  # then the next prompt's first
        assert list(streamed.ahead) == [upcoming]  # one map ahead, no more
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(2))
    on_model = RidgeFill(model, tok, fill="ridge", maps=out, split=2, tail=6)
    on_host = RidgeFill(model, tok, fill="ridge", maps=out, split=2, tail=6, maps_device="cpu")
    assert torch.equal(on_host.prefill(ids).logits, on_model.prefill(ids).logits)
    assert on_host.provenance()["maps_device"] == "cpu" and "maps_device" not in on_model.provenance()
