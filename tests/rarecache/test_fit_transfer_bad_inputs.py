"""`rf-eval fit-transfer` refuses bad input in one line before any weights load (#24 items 4, 6, 8, 9)."""

from __future__ import annotations

import pytest

from rf_eval.cli import main

# (arguments replacing or joining the defaults, with {source}, {target}, {tmp}, {cal} filled in; message)
BAD_FIT_TRANSFER = [
    (["--k", "0"], "argument --k: '0' must be an integer >= 1"),
    (["--rank", "-1"], "argument --rank: '-1' must be an integer >= 0"),
    (["--lambda", "0"], "argument --lambda: '0' must be a number > 0"),
    (["--lambda", "nan"], "argument --lambda: 'nan' is not a finite number"),
    (["--stride", "0"], "argument --stride: '0' must be an integer >= 1"),
    (["--max-tokens", "1"], "--max-tokens 1: a document needs at least 2 tokens"),
    (["--k", "99"], "--k 99: must be in 1..4 (the source's layer count)"),
    (["--source", "./no-source"], "--source: model './no-source': no such local folder"),
    (["--target", "{cal}"], "--target: model '{cal}' is a file; give the model's folder"),
    (["--device", "gpu9"], "--device: device 'gpu9' is not a device name"),
    (["--sums-device", "cuda:7"], "--sums-device: device 'cuda:7'"),
    (["--dtype", "fp9"], "--dtype: unknown dtype 'fp9'"),
    (["--out", "{cal}"], "is a file; give a folder for rarecache_maps.safetensors"),
    (["--calibration", "{tmp}/none.txt"], "none.txt does not exist"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", BAD_FIT_TRANSFER)
def test_fit_transfer_bad_inputs(tiny_pair_dirs, calibration, tmp_path, capsys, monkeypatch, args, message):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    source, target = tiny_pair_dirs("llama")
    values = {"source": str(source), "target": str(target), "tmp": str(tmp_path), "cal": calibration[0]}
    given = dict(zip(args[::2], (a.format(**values) for a in args[1::2])))
    defaults = {"--source": str(source), "--target": str(target), "--out": str(tmp_path / "maps"), "--device": "cpu",
                "--k": "2"}
    argv = [x for k, v in {**defaults, **given}.items() for x in (k, v)]
    if "--calibration" not in given:
        argv += ["--calibration", *calibration]
    capsys.readouterr()
    assert main(["fit-transfer", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message.format(**values) in err and len(err.strip().splitlines()) == 1
    assert "Loading weights" not in err and not (tmp_path / "maps").exists()
