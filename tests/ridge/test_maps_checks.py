"""Maps are checked when they load (issue #15, cases 3, 4, 5): finite, well-formed, for these weights."""

from __future__ import annotations

import copy
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.ridge.maps import MapError, RidgeMaps, config_hash, load_maps, quantize_int8
from rf_eval.ridgefill.fitting import fit_maps
from rf_eval.ridgefill.method import RidgeFill


@pytest.fixture(scope="module")
def fitted(tiny_model, tmp_path_factory):
    """Maps fitted on the tiny llama at split 3 (a folder, as `rf-eval fit` writes it)."""
    model, tok = tiny_model("llama")
    out = tmp_path_factory.mktemp("fitted")
    cal = out / "cal.txt"
    cal.write_text("the cat sat on the mat and the dog ran to the red house by the river " * 8)
    fit_maps(model, tok, splits=[3], calibration=[str(cal)], lambdas=[0.03], out=out / "maps", progress=False)
    return out / "maps"


def _edit(src, dst, change) -> None:
    """Copy map file `src` to `dst` with its tensors changed by `change(tensors)`."""
    from safetensors import safe_open

    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
    tensors = load_file(str(src))
    change(tensors)
    save_file(tensors, str(dst), metadata=meta)


def test_fit_records_the_weights_and_loads_on_them(fitted, tiny_model):
    model, tok = tiny_model("llama")
    maps = load_maps(fitted, 3)
    assert maps.metadata["weights_sha256"] == weights_fingerprint(model)
    rf = RidgeFill(model, tok, maps=maps, fill="ridge", tail=4)
    assert rf.provenance()["weights_sha256"] == weights_fingerprint(model)


def test_maps_for_other_weights_are_refused_unless_allowed(fitted, tiny_model, caplog):
    """Case 3: the old check compared config hashes only, and these weights share the config."""
    model, tok = tiny_model("llama")
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.01)
    assert config_hash(other.config) == config_hash(model.config)
    with pytest.raises(MapError) as err:
        RidgeFill(other, tok, maps=fitted, fill="ridge", tail=4)
    message = str(err.value)
    assert "fitted on other weights" in message and "allow_other_weights=true" in message
    assert weights_fingerprint(model)[:12] in message and weights_fingerprint(other)[:12] in message
    rf = RidgeFill(other, tok, maps=fitted, fill="ridge", tail=4, allow_other_weights=True)
    assert rf.provenance()["allow_other_weights"] is True


def test_maps_without_a_fingerprint_load_with_a_warning(fitted, tiny_model, tmp_path, caplog):
    model, tok = tiny_model("llama")
    old = load_maps(fitted, 3)
    meta = {k: v for k, v in old.metadata.items() if k not in ("weights_sha256", "file_sha256")}
    path = RidgeMaps(split=3, A=old.A, b=old.b, metadata=meta).save(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rf_eval.ridge.maps"):
        RidgeFill(model, tok, maps=path, fill="ridge", tail=4)
    assert "records no weights fingerprint" in caplog.text


def _int8(t, keep_scales=True, scales_shape=None):
    q, scales = quantize_int8(t["A.4"])
    t["A.4"] = q
    if keep_scales:
        t["A.4.scales"] = scales if scales_shape is None else torch.ones(scales_shape)


def _set(t, name, value):
    t[name] = value


def _drop(t, name):
    del t[name]


# (how the fitted split-3 file is changed, message fragment); every row is a MapError at load or on the model
BAD_MAPS = [
    (lambda t: t["A.4"].view(-1).__setitem__(5, float("nan")), r"tensor A.4 holds 1 non-finite value\(s\)"),
    (lambda t: t["b.5"].__setitem__(0, float("inf")), r"tensor b.5 holds 1 non-finite value\(s\)"),
    (lambda t: _int8(t, keep_scales=False), "int8 tensor A.4 without A.4.scales"),
    (lambda t: _int8(t, scales_shape=(64, 7)), r"A.4.scales has shape \(64, 7\), expected \(64, 1\)"),
    (lambda t: _int8(t) or t["A.4.scales"].__setitem__((0, 0), float("nan")), "tensor A.4.scales holds 1 non-finite"),
    (lambda t: _int8(t) or t["A.4.scales"].zero_(), r"tensor A.4.scales holds 64 scale\(s\) <= 0"),
    (lambda t: _int8(t) or t["A.4.scales"].__setitem__((3, 0), -0.5), r"tensor A.4.scales holds 1 scale\(s\) <= 0"),
    (lambda t: _set(t, "A.4", t["A.4"][:, :32].contiguous()), r"A.4 has shape \(64, 32\), expected \(64, 64\)"),
    (lambda t: _set(t, "b.4", torch.zeros(63)), r"b.4 has shape \(63,\), expected \(64,\)"),
    (lambda t: _drop(t, "b.5"), "A and b tensors do not cover the same layers"),
    (lambda t: (_drop(t, "A.5"), _drop(t, "b.5")), r"maps hold layers \[3, 4\], expected \[3, 4, 5\]"),
    (lambda t: _set(t, "A.x", torch.zeros(2, 2)), "tensor 'A.x' is not A.<layer>"),
]  # fmt: skip


@pytest.mark.parametrize("change, message", BAD_MAPS)
def test_bad_maps_are_a_map_error_naming_the_tensor(fitted, tiny_model, tmp_path, change, message):
    """Cases 5 and 3's shape side: the old loader took NaN maps (NaN logits) and maps of the wrong shape."""
    model, tok = tiny_model("llama")
    bad = tmp_path / "ridgefill_split3.safetensors"
    _edit(fitted / "ridgefill_split3.safetensors", bad, change)
    with pytest.raises(MapError, match=message):
        RidgeFill(model, tok, maps=load_maps(bad), fill="ridge", tail=4)


def test_int8_maps_with_their_scales_load(fitted, tmp_path):
    good = tmp_path / "good.safetensors"
    _edit(fitted / "ridgefill_split3.safetensors", good, _int8)
    assert torch.isfinite(load_maps(good).A[4]).all()


def test_use_cache_empties_a_database_of_weights_changed_in_place(tiny_model_dir, tmp_path, one_torch_thread, caplog):
    """Case 4 (and #24 item 8): the arm fingerprint holds the weights, not only their path; a cache of old
    weights at the same path is dropped, so its results are computed again instead of served."""
    from lm_eval.api.model import CachingLM
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.request_cache import ARM_KEY
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    db = str(tmp_path / "cache" / "rf.db")
    first = prefill_lm.ridgefill(pretrained=str(folder), fill="identity", tail=8, device="cpu")
    cached = CachingLM(first, db)
    assert first.arm_fingerprint()["weights"] == weights_fingerprint(first.model)
    cached.dbdict["a request"] = "its result"
    cached.dbdict.close()
    again = CachingLM(prefill_lm.ridgefill(pretrained=str(folder), fill="identity", tail=8, device="cpu"), db)
    assert again.dbdict["a request"] == "its result"  # the same weights: the database is this arm's
    again.dbdict.close()
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(0.5)
    model.save_pretrained(folder)  # the weights change in place, at the same path
    changed = prefill_lm.ridgefill(pretrained=str(folder), fill="identity", tail=8, device="cpu")
    with caplog.at_level(logging.WARNING):
        stale = CachingLM(changed, db)
    assert list(stale.dbdict.keys()) == [ARM_KEY] and "a request" not in stale.dbdict
    assert "holds this arm's results from other weights: its 1 entries are dropped" in caplog.text


def test_use_cache_reruns_after_maps_are_refitted_in_place(fitted, tiny_model_dir, tmp_path, one_torch_thread,
                                                            caplog):
    """#24 item 8: maps refitted under a finished study used to make the rerun fail on its request cache."""
    from lm_eval.api.model import CachingLM

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.config import ModelArgsError
    from rf_eval.model_adapters.request_cache import ARM_KEY
    maps = tmp_path / "maps"
    shutil.copytree(fitted, maps)
    db = str(tmp_path / "cache.db")

    def arm(**extra):
        return prefill_lm.ridgefill(pretrained=tiny_model_dir("llama"), fill="ridge", split=3, tail=4, maps=str(maps),
                           device="cpu", **extra)

    cached = CachingLM(arm(), db)
    cached.dbdict["a request"] = "its result"
    cached.dbdict.close()
    for path in maps.glob("*.safetensors"):  # refit in place: same file names, other maps
        _edit(path, path, lambda t: [v.mul_(0.9) for v in t.values() if v.is_floating_point()])
    with caplog.at_level(logging.WARNING):
        stale = CachingLM(arm(), db)
    assert list(stale.dbdict.keys()) == [ARM_KEY]
    assert "from other maps: its 1 entries are dropped and recomputed" in caplog.text
    stale.dbdict["another"] = "result"
    stale.dbdict.close()
    with pytest.raises(ModelArgsError, match="holds results of another arm"):  # other settings: still refused
        CachingLM(arm(chunk_size=64), db)


def test_the_adapter_refuses_maps_of_other_weights_after_loading_them(fitted, tiny_model_dir, tmp_path,
                                                                       one_torch_thread):
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.config import ModelArgsError
    folder = tmp_path / "finetuned"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    shutil.copytree(tiny_model_dir("llama"), folder)  # tokenizer and config as they are...
    model.save_pretrained(folder)  # ...and fine-tuned weights of the same config
    with pytest.raises(ModelArgsError, match=f"maps='{fitted}': .* was fitted on other weights"):
        prefill_lm.ridgefill(pretrained=str(folder), fill="ridge", maps=str(fitted), tail=8, device="cpu")
    lm = prefill_lm.ridgefill(pretrained=str(folder), fill="ridge", maps=str(fitted), tail=8, device="cpu",
                     allow_other_weights="true")
    assert lm.arm_info()["allow_other_weights"] is True
