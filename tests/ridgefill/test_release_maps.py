"""The release formats (issue #42, item 5): the int8 rule of App. F, and released projector folders converted
to rf-eval map files whose fill is exactly the released values."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rf_eval.cli import main
from rf_eval.ridge.maps import dequantize_int8, load_maps, quantize_int8
from rf_eval.ridgefill.method import RidgeFill

SPLIT, LAYERS = 3, 6  # the tiny llama: 6 layers, hidden size 64


def test_quantize_int8_is_the_release_rule():
    """scale = absmax/127 rounded to bf16 (1 for an all-zero group); codes = weight / rounded scale, rounded
    half to even, clamped to +-127; every dequantized weight within half its scale."""
    w = torch.randn(8, 300, generator=torch.Generator().manual_seed(3))
    w[2, 128:256] = 0
    w[5, :128] = 0
    w[5, 0], w[5, 1], w[5, 2] = 127.0, 2.5, 3.5  # scale exactly 1: ties go to the even code
    codes, scales = quantize_int8(w)
    assert codes.dtype == torch.int8 and codes.shape == (8, 300)
    assert scales.dtype == torch.bfloat16 and scales.shape == (8, 3)
    padded = torch.nn.functional.pad(w, (0, 84)).view(8, 3, 128)
    want = (padded.abs().amax(-1) / 127).to(torch.bfloat16)
    want[2, 1] = 1.0
    assert torch.equal(scales, want)
    expect = torch.round(padded / want.float()[..., None]).clamp(-127, 127).view(8, -1)[:, :300]
    assert torch.equal(codes.float(), expect)
    assert codes[5, :3].tolist() == [127, 2, 4] and codes[2, 128:256].eq(0).all()
    err = (dequantize_int8(codes, scales) - w).abs()
    assert (err <= scales.float().repeat_interleave(128, 1)[:, :300] / 2 + 1e-7).all()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _release(folder, dtype="i8", split=SPLIT, layers=range(SPLIT, LAYERS), d_out=64, d_in=64, seed=0):
    """A projector folder in the release layout (the model card's file table), random maps."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    files, listed = {}, {}
    for layer in layers:
        weight, bias = torch.randn(d_out, d_in, generator=gen) * 0.1, torch.randn(d_out, generator=gen) * 0.1
        if dtype == "i8":
            codes, scale = quantize_int8(weight)
            tensors, name = {"codes": codes, "scale": scale, "bias": bias.bfloat16()}, f"proj8.L{layer}.safetensors"
        else:
            tensors, name = {"weight": weight.bfloat16(), "bias": bias.bfloat16()}, f"proj.L{layer}.safetensors"
        save_file({f"proj.{layer}.{k}": v for k, v in tensors.items()}, str(folder / name))
        files[str(layer)], listed[name] = name, _sha(folder / name)
    manifest = {"format": 1, "name": "test-projector", "split": split,
                "projector": {"dtype": dtype, "files": files}, "files": listed}
    (folder / "ridgefill.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("dtype", ["i8", "bf16"])
def test_a_released_folder_converts_to_maps_that_fill_with_the_released_values(
        dtype, tiny_model_dir, tiny_model, tmp_path, capsys, caplog):
    release = _release(tmp_path / "release", dtype)
    out = tmp_path / "maps"
    assert main(["convert-projector", str(release), "--model", tiny_model_dir("llama"), "--out", str(out)]) == 0
    assert f"split {SPLIT}: layers {SPLIT}..{LAYERS - 1}" in capsys.readouterr().out
    maps = load_maps(out, SPLIT)
    storage = "int8" if dtype == "i8" else "float32"
    assert maps.metadata["storage"] == storage and maps.metadata["target"] == "inputs"
    assert maps.metadata["release_manifest_sha256"] == _sha(release / "ridgefill.json")
    name = "proj8.L{}.safetensors" if dtype == "i8" else "proj.L{}.safetensors"
    with safe_open(str(out / f"ridgefill_split{SPLIT}.safetensors"), "pt") as f:
        for layer in maps.layers:
            with safe_open(str(release / name.format(layer)), "pt") as r:
                bias = r.get_tensor(f"proj.{layer}.bias")
                if dtype == "i8":  # the released tensors, unchanged
                    codes, scale = r.get_tensor(f"proj.{layer}.codes"), r.get_tensor(f"proj.{layer}.scale")
                    assert torch.equal(f.get_tensor(f"A.{layer}"), codes)
                    assert torch.equal(f.get_tensor(f"A.{layer}.scales"), scale)
                    assert torch.equal(f.get_tensor(f"b.{layer}"), bias)
                    assert torch.equal(maps.A[layer], dequantize_int8(codes, scale))
                else:
                    assert torch.equal(maps.A[layer], r.get_tensor(f"proj.{layer}.weight").float())
                assert torch.equal(maps.b[layer], bias.float())
    model, tok = tiny_model("llama")
    with caplog.at_level(logging.WARNING, logger="rf_eval.ridge.maps"):
        rf = RidgeFill(model, tok, maps=out, fill="ridge", tail=4)
    assert "converted from a released projector" in caplog.text
    assert rf.provenance()["maps_metadata"]["release_manifest_sha256"] == maps.metadata["release_manifest_sha256"]


def _manifest_edit(folder, change):
    path = folder / "ridgefill.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _corrupt(folder, name):
    path = folder / name
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def _rename_tensor(folder, layer):
    path = folder / f"proj8.L{layer}.safetensors"
    with safe_open(str(path), "pt") as f:
        tensors = {k.replace("codes", "weights"): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(path))
    _manifest_edit(folder, lambda m: m["files"].__setitem__(path.name, _sha(path)))


def _retensor(folder, layer, part, change):
    path = folder / f"proj8.L{layer}.safetensors"
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    change(tensors[f"proj.{layer}.{part}"])
    save_file(tensors, str(path))
    _manifest_edit(folder, lambda m: m["files"].__setitem__(path.name, _sha(path)))


# (how a good release folder is changed, message fragment); each is refused before anything is written
BAD_RELEASES = [
    (lambda f: (f / "ridgefill.json").unlink(), "holds no ridgefill.json"),
    (lambda f: (f / "ridgefill.json").write_text("{not json"), "cannot read"),
    (lambda f: _manifest_edit(f, lambda m: m.__setitem__("format", 2)), "manifest format 2"),
    (lambda f: _manifest_edit(f, lambda m: m["projector"].__setitem__("dtype", "q4")),
     "projector dtype 'q4' is not one of i8, bf16"),
    (lambda f: _manifest_edit(f, lambda m: m.pop("split")), "no integer split"),
    (lambda f: (f / "proj8.L4.safetensors").unlink(), "lists proj8.L4.safetensors for layer 4, but the file is missing"),
    (lambda f: _manifest_edit(f, lambda m: m["files"].pop("proj8.L5.safetensors")),
     "proj8.L5.safetensors has no sha256"),
    (lambda f: _corrupt(f, "proj8.L3.safetensors"), "does not match its sha256"),
    (lambda f: _rename_tensor(f, 4), "no tensor proj.4.codes"),
    (lambda f: _manifest_edit(f, lambda m: m["projector"]["files"].pop("5")), "maps hold layers [3, 4], expected [3, 4, 5]"),
    (lambda f: _retensor(f, 4, "scale", lambda t: t.zero_()), "proj.4.scales holds 64 scale(s) <= 0"),
    (lambda f: _retensor(f, 5, "bias", lambda t: t.fill_(float("nan"))), "proj.5.bias hold non-finite values"),
]


@pytest.mark.parametrize(("change", "message"), BAD_RELEASES)
def test_bad_release_folders_are_refused_by_name(change, message, tiny_model_dir, tmp_path, capsys):
    release = _release(tmp_path / "release")
    change(release)
    out = tmp_path / "maps"
    assert main(["convert-projector", str(release), "--model", tiny_model_dir("llama"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (out / f"ridgefill_split{SPLIT}.safetensors").exists()


def test_a_projector_for_another_model_or_an_existing_file_is_refused(tiny_model_dir, tmp_path, capsys,
                                                                      monkeypatch):
    model = tiny_model_dir("llama")
    wide = _release(tmp_path / "wide", d_in=128)
    assert main(["convert-projector", str(wide), "--model", model, "--out", str(tmp_path / "a")]) == 2
    assert "A.3 has shape (64, 128), expected (64, 64)" in capsys.readouterr().err
    good = _release(tmp_path / "good")
    assert main(["convert-projector", str(good), "--model", model, "--out", str(tmp_path / "b")]) == 0
    assert main(["convert-projector", str(good), "--model", model, "--out", str(tmp_path / "b")]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["convert-projector", str(good), "--model", model, "--out", str(tmp_path / "b"), "--overwrite"]) == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["convert-projector", str(good), "--model", "nobody/no-such-model", "--out", str(tmp_path / "c")]) == 2
    assert "offline, give the model's local folder" in capsys.readouterr().err
