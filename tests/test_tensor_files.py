"""The one safetensors writer and reader: atomic writes, damaged files named in the caller's error type."""

from __future__ import annotations

import pytest
import torch

from rf_eval.files import tensor_files
from rf_eval.ridge.maps import MapError
from rf_eval.ridge.state_correction import load_table, save_table


def test_round_trip_keeps_tensors_and_stringifies_metadata(tmp_path):
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    path = tensor_files.save_tensors({"a": t}, tmp_path / "x.safetensors", {"split": 3})
    tensors, meta = tensor_files.read_tensors(path)
    assert torch.equal(tensors["a"], t) and meta == {"split": "3"}
    assert tensor_files.read_metadata(path) == {"split": "3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]  # no .tmp left behind


def test_a_crash_while_writing_leaves_the_old_file(tmp_path, monkeypatch):
    path = tensor_files.save_tensors({"a": torch.ones(2)}, tmp_path / "x.safetensors", {})
    before = path.read_bytes()

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(tensor_files, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        tensor_files.save_tensors({"a": torch.zeros(2)}, path, {})
    assert path.read_bytes() == before


@pytest.mark.parametrize("reader", [tensor_files.read_tensors, tensor_files.read_metadata])
def test_a_damaged_file_raises_the_callers_error_naming_it(tmp_path, reader):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(MapError, match=f"cannot read map file {bad}"):
        reader(bad, MapError, "map file")


def test_state_correction_tables_are_written_through_it(tmp_path, monkeypatch):
    written = []
    real = tensor_files.save_tensors
    monkeypatch.setattr("rf_eval.ridge.state_correction.save_tensors",
                        lambda *a, **k: written.append(a[1]) or real(*a, **k))
    path = save_table({4: torch.ones(2, 3, 3)}, {"kind": "dM"}, tmp_path, 3)
    delta, meta = load_table(path)
    assert written == [path] and torch.equal(delta[4], torch.ones(2, 3, 3)) and meta["split"] == "3"
