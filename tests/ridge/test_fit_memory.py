"""Fit memory: the sums' byte formula, where the sums live (`--sums-device`), one capture pass for all splits,
the held-out lambda passes within a budget (`--heldout-memory`)."""

import json
import logging
import math
import sys
import types
import weakref

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from rf_eval.cli import main
from rf_eval.ridge import fit_memory
from rf_eval.ridge import lambdas as lambda_choice
from rf_eval.ridge.capture import capture_sums, heldout_cosines
from rf_eval.ridge.fit_memory import (
    GPU_MARGIN,
    HELDOUT_SHARE,
    choose_sums_device,
    fit_peak_bytes,
    heldout_budget,
    lambdas_per_pass,
    maps_bytes,
    maps_held,
    sums_bytes,
)
from rf_eval.ridge.sums import RidgeSums
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
    """(model.model forwards started, layer-0 calls) during one fit_maps."""
    calls, layer_calls = [], []
    handle = model.model.register_forward_pre_hook(lambda *_: calls.append(1))
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


# -- the held-out lambda search in passes that fit a memory budget (`--heldout-memory`) --------------------

LAMBDAS = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]


def test_lambdas_per_pass_rule():
    per = 10 * GIB
    assert lambdas_per_pass(40 * GIB, per, 9) == 3  # 4 lambdas' maps fit: a pass of 3 beside the best's
    assert lambdas_per_pass(90 * GIB, per, 9) == 9  # all nine fit: one pass, no best carried
    assert lambdas_per_pass(90 * GIB - 1, per, 9) == 7
    assert lambdas_per_pass(3 * per, per, 9) == 2
    assert [lambdas_per_pass(b, per, 9) for b in (2 * per, 2 * per - 1, 1, 0)] == [1, 1, 1, 1]  # at least one
    assert lambdas_per_pass(0, per, 1) == 1
    with pytest.raises(ValueError, match="need n_lambdas >= 1"):
        lambdas_per_pass(GIB, per, 0)


def test_maps_bytes_and_peak_formula(tiny_model):
    model, tok = tiny_model("qwen3")
    docs = [tok("river stone north quiet " * 3, return_tensors="pt").input_ids]
    sums = capture_sums(model, docs, [3])[3]
    A, b = sums.solve(0.1)
    real = sum(t.numel() * t.element_size() for t in [*A.values(), *b.values()])
    d, n_layers = model.config.hidden_size, model.config.num_hidden_layers
    assert real == maps_bytes(d, n_layers - 3)
    # 70B-like: the peak holds one pass's maps plus the best's (none carried when all fit one pass)
    one = fit_peak_bytes(8192, 80, [40])
    for group, held in ((1, 2), (3, 4), (8, 9), (9, 9), (None, 9)):
        assert fit_peak_bytes(8192, 80, [40], 9, group) - one == (held - 1) * maps_bytes(8192, 40)
        assert maps_held(9, group) == held


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    g = torch.Generator().manual_seed(11)
    words = ["seven", "alpha", "river", "north", "the", "stone"]
    path = tmp_path_factory.mktemp("held") / "held.jsonl"
    with open(path, "w") as fh:
        for _ in range(2):
            fh.write(json.dumps({"text": " ".join(words[i] for i in torch.randint(0, 6, (25,), generator=g))}) + "\n")
    return str(path)


def fit_in_passes(model, tok, calibration, heldout, out, budget_gib, monkeypatch) -> tuple:
    """fit_maps (split 3) recording each held-out pass: (its lambdas, lambdas' maps alive), and model forwards."""
    alive, passes, forwards = [], [], []
    solve = RidgeSums.solve

    def solve_and_track(self, lam):
        A, b = solve(self, lam)
        alive.append(weakref.ref(A[self.layers[0]]))
        return A, b

    def counted(model_, docs, split, candidates, map_split=False, target="inputs"):
        passes.append((tuple(candidates), sum(ref() is not None for ref in alive)))
        return heldout_cosines(model_, docs, split, candidates, map_split, target)

    monkeypatch.setattr(RidgeSums, "solve", solve_and_track)
    monkeypatch.setattr(lambda_choice, "heldout_cosines", counted)
    handle = model.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        result = fit_maps(model, tok, splits=[3], calibration=[calibration], heldout=[heldout], lambdas=LAMBDAS,
                          out=out, progress=False, save_sums=False, heldout_memory=budget_gib)
    finally:
        handle.remove()
        monkeypatch.undo()
    return result, passes, len(forwards)


def test_lambda_passes_within_a_budget_equal_one_pass_bitwise(tiny_model, calibration, heldout, tmp_path,
                                                               monkeypatch, caplog):
    model, tok = tiny_model("qwen3")
    per = maps_bytes(model.config.hidden_size, model.config.num_hidden_layers - 3)
    runs = {}
    for group, budget in ((5, 1000.0), (2, 3 * per / GIB), (1, 2 * per / GIB)):
        with caplog.at_level(logging.INFO, logger="rf_eval.ridge.lambdas"):
            runs[group] = fit_in_passes(model, tok, calibration, heldout, tmp_path / str(group), budget, monkeypatch)
        n_passes = math.ceil(len(LAMBDAS) / group)
        passes_word = "pass" if n_passes == 1 else "passes"
        assert f"held-out: 5 lambdas in {n_passes} {passes_word} of <= {group} (budget {budget:.2f} GiB as asked; " \
               f"{per / GIB:.2f} GiB of maps per lambda)" in caplog.text
        result, passes, forwards = runs[group]
        assert [lams for lams, _ in passes] == [tuple(LAMBDAS[i:i + group]) for i in range(0, 5, group)]
        assert forwards == 4 + 2 * n_passes  # 4 calibration documents once, 2 held-out documents per pass
        assert max(n for _, n in passes) == maps_held(5, group)  # one pass's maps plus the best's so far
    ref = runs[5][0]
    assert len(set(ref.scores[3].values())) > 1  # the lambdas score differently: the choice means something
    ref_tensors, ref_meta = map_file(tmp_path / "5")
    for group in (2, 1):
        result = runs[group][0]
        assert result.scores == ref.scores and list(result.scores[3]) == LAMBDAS
        assert result.chosen == ref.chosen
        tensors, meta = map_file(tmp_path / str(group))
        assert meta == ref_meta  # lambda, lambda_scores (in grid order), hashes...
        assert set(tensors) == set(ref_tensors) and all(torch.equal(tensors[k], ref_tensors[k]) for k in tensors)


def map_file(folder) -> tuple[dict, dict]:
    """A map file's tensors and metadata (safetensors orders its header keys by hash: compare contents)."""
    path = str(folder / "ridgefill_split3.safetensors")
    with safe_open(path, "pt") as fh:
        meta = fh.metadata()
    return load_file(path), meta


def test_heldout_budget_sources(monkeypatch, tmp_path):
    assert heldout_budget("2.5") == (int(2.5 * GIB), "budget 2.50 GiB as asked")
    assert heldout_budget(0.25) == (GIB // 4, "budget 0.25 GiB as asked")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 9999999 kB\nMemAvailable: 4194304 kB\n")
    monkeypatch.setattr(fit_memory, "MEMINFO", meminfo)
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    budget, why = heldout_budget("auto")
    assert budget == int(HELDOUT_SHARE * 4 * GIB)
    assert why == f"budget {budget / GIB:.2f} GiB = 50% of 4.00 GiB available ({meminfo} MemAvailable)"
    monkeypatch.setattr(fit_memory, "MEMINFO", tmp_path / "missing")
    assert heldout_budget(None) == (0, f"budget unknown (no psutil, no MemAvailable in {tmp_path / 'missing'}): "
                                       "one lambda per pass")
    monkeypatch.setitem(sys.modules, "psutil", types.SimpleNamespace(
        virtual_memory=lambda: types.SimpleNamespace(available=8 * GIB)))
    assert heldout_budget("AUTO") == (4 * GIB, "budget 4.00 GiB = 50% of 8.00 GiB available (psutil available)")


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", ""])
def test_cli_rejects_bad_heldout_memory(tiny_model_dir, calibration, heldout, tmp_path, capsys, value):
    out = tmp_path / "out"
    code = main(["fit", "--model", tiny_model_dir("llama"), "--splits", "3", "--calibration", calibration,
                 "--heldout", heldout, "--out", str(out), "--no-progress", "--heldout-memory", value])
    assert code == 2
    err = capsys.readouterr().err
    said = ("argument --heldout-memory: an empty value" if value == "" else
            f"--heldout-memory: held-out memory {value!r} is not valid: give a number of GiB > 0 or 'auto'")
    assert said in err
    assert not out.exists()


def test_fit_maps_rejects_bad_heldout_memory_before_the_capture(tiny_model, calibration, tmp_path):
    model, tok = tiny_model("qwen3")
    with pytest.raises(ValueError, match=r"held-out memory -2\.0 is not valid"):
        fit_maps(model, tok, splits=[3], calibration=[calibration], out=tmp_path / "o", heldout_memory=-2.0)
    assert not (tmp_path / "o").exists()


def test_two_gloo_processes_score_lambdas_in_the_same_passes(tiny_model_dir, calibration, heldout, tmp_path,
                                                           run_in_gloo_processes):
    from rf_eval.ridge.maps import load_maps

    args = ["fit", "--model", tiny_model_dir("llama"), "--splits", "3", "--calibration", calibration, "--heldout",
            heldout, "--lambdas", "0.001", "0.1", "1.0", "--no-progress", "--device", "cpu", "--dtype", "float32"]
    assert main([*args, "--out", str(tmp_path / "one"), "--heldout-memory", "1000"]) == 0  # one pass
    run_in_gloo_processes([*args, "--out", str(tmp_path / "two"), "--heldout-memory", "1e-9"])  # a pass per lambda
    one, two = (load_maps(tmp_path / name, 3).metadata for name in ("one", "two"))
    assert two["lambda"] == one["lambda"] and two["rows"] == one["rows"]
    scores_one, scores_two = json.loads(one["lambda_scores"]), json.loads(two["lambda_scores"])
    assert list(scores_two) == list(scores_one) == ["0.001", "0.1", "1.0"]
    assert all(math.isclose(scores_two[k], scores_one[k], rel_tol=1e-6) for k in scores_one)
