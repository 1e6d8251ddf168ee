"""Fit memory: the sums' byte formula, where the sums live (`--sums-device`), one capture pass for all splits."""

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from rf_eval.ridgefill.capture import capture_sums
from rf_eval.ridgefill.fit_memory import GPU_MARGIN, choose_sums_device, sums_bytes
from rf_eval.ridgefill.fitting import fit_maps

GIB = 2**30


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    words = ["north", "river", "stone", "7", "quiet", "alpha", "the"]
    g = torch.Generator().manual_seed(3)
    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    with open(path, "w") as fh:
        for _ in range(4):
            idx = torch.randint(0, len(words), (30,), generator=g).tolist()
            fh.write(json.dumps({"text": " ".join(words[i] for i in idx)}) + "\n")
    return str(path)


def tensor_bytes(sums) -> int:
    tensors = [sums.cxx, sums.mean_x, *sums.cxy.values(), *sums.mean_y.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_sums_bytes_is_the_bytes_of_a_real_capture(tiny_model):
    model, tok = tiny_model("qwen3")
    docs = [tok("river stone north quiet " * k, return_tensors="pt").input_ids for k in (2, 3)]
    splits = [1, 2, 4]
    captured = capture_sums(model, docs, splits)
    n_layers, d = model.config.num_hidden_layers, model.config.hidden_size
    assert all(s.cxx.dtype == torch.float64 for s in captured.values())
    assert sum(tensor_bytes(s) for s in captured.values()) == sums_bytes(d, n_layers, splits)
    assert sums_bytes(d, n_layers, [4]) == 8 * (d * d + d) * (1 + n_layers - 4)


def test_sums_on_cpu_equal_sums_on_the_model_device_bitwise(tiny_model, calibration, tmp_path, caplog):
    model, tok = tiny_model("qwen3")
    saved = {}
    for choice in ("cpu", "model", "auto"):
        with caplog.at_level(logging.INFO, logger="rf_eval.ridgefill.fitting"):
            result = fit_maps(model, tok, splits=[2, 3], calibration=[calibration], out=tmp_path / choice,
                              progress=False, sums_device=choice)
        where = "cpu" if choice == "cpu" else "the model's device cpu"
        assert result.sums_device.endswith(f"GiB of fp64 sums on {where} (asked: {choice})"), result.sums_device
        assert result.sums_device in caplog.text
        saved[choice] = {s: load_file(tmp_path / choice / f"sums_split{s}.safetensors") for s in (2, 3)}
    for split in (2, 3):
        ref = saved["cpu"][split]
        assert set(ref) == {"mean_x", "cxx", *(f"{k}.{layer}" for k in ("cxy", "mean_y") for layer in range(split, 6))}
        for choice in ("model", "auto"):
            assert all(torch.equal(ref[k], saved[choice][split][k]) for k in ref), (choice, split)


def fake_gpu(monkeypatch, free: int, total: int) -> list:
    calls = []

    def mem_get_info(device=None):
        calls.append(torch.device(device))
        return free, total

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    return calls


def test_auto_keeps_sums_on_a_gpu_with_room(monkeypatch):
    calls = fake_gpu(monkeypatch, free=60 * GIB, total=80 * GIB)
    need = 60 * GIB - int(GPU_MARGIN * 80 * GIB)  # exactly the room left beside the margin
    device, why = choose_sums_device("auto", "cuda:1", need)
    assert device == torch.device("cuda:1") and calls == [torch.device("cuda:1")]
    assert why.startswith(f"{need / GIB:.2f} GiB of fp64 sums on cuda:1") and "60.00 GiB free" in why


def test_auto_moves_sums_to_cpu_when_the_gpu_is_short(monkeypatch):
    fake_gpu(monkeypatch, free=60 * GIB, total=80 * GIB)
    need = 60 * GIB - int(GPU_MARGIN * 80 * GIB) + 1
    device, why = choose_sums_device("auto", "cuda:0", need)
    assert device == torch.device("cpu")
    assert "on cpu: the GPU is short" in why and "60.00 GiB free on cuda:0" in why and "12.00 GiB kept" in why


def test_explicit_choices_ignore_the_gpu_room(monkeypatch):
    calls = fake_gpu(monkeypatch, free=0, total=80 * GIB)
    assert choose_sums_device("model", "cuda:0", GIB)[0] == torch.device("cuda:0")
    assert choose_sums_device("cpu", "cuda:0", 1)[0] == torch.device("cpu")
    assert choose_sums_device("auto", "cpu", 10**15)[0] == torch.device("cpu")  # a CPU model: no GPU asked
    assert calls == []
    with pytest.raises(ValueError, match=r"sums device 'gpu' is not one of auto, cpu, model"):
        choose_sums_device("gpu", "cuda:0", 1)


def forwards_of_a_fit(model, tok, splits, calibration, out) -> tuple[int, int]:
    """(model.model forwards, layer-0 calls) during one fit_maps."""
    calls, layer_calls = [], []
    handle = model.model.register_forward_hook(lambda *_: calls.append(1))
    first = model.model.layers[0].register_forward_hook(lambda *_: layer_calls.append(1))
    try:
        result = fit_maps(model, tok, splits=splits, calibration=[calibration], out=out, progress=False,
                          save_sums=False)
    finally:
        handle.remove()
        first.remove()
    assert sorted(result.paths) == splits
    return len(calls), len(layer_calls)


def test_more_splits_share_one_capture_pass(tiny_model, calibration, tmp_path):
    model, tok = tiny_model("qwen3")
    one = forwards_of_a_fit(model, tok, [3], calibration, tmp_path / "one")
    five = forwards_of_a_fit(model, tok, [1, 2, 3, 4, 5], calibration, tmp_path / "five")
    assert one == five == (4, 4)  # four documents: one model forward (and layer-0 call) each
