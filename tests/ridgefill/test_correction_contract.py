"""Every registered correction keeps the correction contract (kvpress's `default_presses` idea, issue #39
item 3).

The list is the registry's (`rf_eval.ridgefill.corrections.CORRECTIONS`), so a new correction, in the package
or in a folder on RF_EVAL_CORRECTION_PATH, is tested here the moment it is found (tests/test_plugins.py runs
a throwaway one). Each is built by name with its defaults (or the arguments `ARGS` gives), rebuilt from its
constructor's parameters with the same description, and run inside a RidgeFill arm on the tiny hybrid model
(attention and Gated DeltaNet layers): every hook it defines is called, gives back tensors of the shapes and
dtypes it was handed, and the prefill's cache has the shapes of the arm without it.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from rf_eval.plugins import param_values
from rf_eval.ridge.maps import config_hash
from rf_eval.ridgefill.corrections import CORRECTIONS, HOOKS, make_correction
from rf_eval.ridgefill.method import RidgeFill

FAMILY, SPLIT, TAIL, N = "qwen3_5", 3, 8, 40


@pytest.fixture(scope="module")
def state_table(tiny_model, tmp_path_factory):
    """A Delta-M table for the tiny hybrid model at SPLIT (its one late Gated DeltaNet layer, 4)."""
    model, _ = tiny_model(FAMILY)
    path = tmp_path_factory.mktemp("state_table") / "dm.safetensors"
    delta = torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(0)) * 0.01
    save_file({"dM.4": delta}, str(path),
              metadata={"split": str(SPLIT), "fill": "identity", "config_hash": config_hash(model.config)})
    return path


#: arguments for the corrections that need some (from the fixtures above)
ARGS = {"terminal_state": lambda table: {"path": str(table)}}


def checked(correction, called: list[str]):
    """`correction` with each hook it defines wrapped: the tensors it gives back keep their shapes and dtypes."""
    for hook in HOOKS:
        own = getattr(correction, hook, None)
        if own is None:
            continue

        def wrapped(view, *tensors, _own=own, _hook=hook):
            shapes = [(t.shape, t.dtype) for t in tensors]
            out = _own(view, *tensors)
            got = out if isinstance(out, tuple) else (out,)
            assert [(t.shape, t.dtype) for t in got] == shapes, (_hook, view.index)
            called.append(_hook)
            return out

        setattr(correction, hook, wrapped)
    return correction


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_every_correction_keeps_the_contract(tiny_model, state_table, name):
    correction = make_correction(name, **(ARGS[name](state_table) if name in ARGS else {}))
    described = correction.describe()
    assert correction.name == name and described["name"] == name
    assert type(correction)(**param_values(correction)).describe() == described

    model, tok = tiny_model(FAMILY)
    ids = torch.randint(3, 250, (1, N), generator=torch.Generator().manual_seed(1))
    plain = RidgeFill(model, tok, split=SPLIT, tail=TAIL, fill="identity").prefill(ids)
    called: list[str] = []
    rf = RidgeFill(model, tok, split=SPLIT, tail=TAIL, fill="identity", corrections=[checked(correction, called)])
    got = rf.prefill(ids)
    assert called and set(called) <= set(HOOKS)
    assert got.logits.shape == plain.logits.shape and torch.isfinite(got.logits).all()
    for mine, theirs in zip(got.cache.layers, plain.cache.layers, strict=True):
        for part in ("keys", "values"):
            if isinstance(getattr(theirs, part, None), torch.Tensor):
                assert getattr(mine, part).shape == getattr(theirs, part).shape, (name, part)
    assert rf.provenance()["corrections"][0]["name"] == name
