"""The paper's published projector folders, converted to rf-eval map files.

The layout, as the release's model card and its plugin's folder reader state it (App. F): a folder
holding a manifest `ridgefill.json` (format 1) and one safetensors file per late layer l, l = S..L-1:

- the int8 release (`projector.dtype` "i8", encoding "i8*bf16[1x128]"): `proj.{l}.codes` int8
  (d_out x d_in), `proj.{l}.scale` bf16 (d_out x ceil(d_in/128)), `proj.{l}.bias` bf16 (d_out);
- the bf16 fit the int8 maps were quantized from (`projector.dtype` "bf16"): `proj.{l}.weight`
  (d_out x d_in) and `proj.{l}.bias`.

The manifest's `split`, `projector.files` ({layer: file name}) and `files` ({file name: sha256}) are
read, and every map file's hash is checked against it. Each map predicts late layer l's input from
layer S's state (rf-eval's `inputs` target, layer S's own map included: `map_split`). The folder's
other files (Gated DeltaNet state corrections, token-frequency tables, templates) are not maps and are
not converted. The int8 tensors are written unchanged (`A.{l}`, `A.{l}.scales`, `b.{l}`): a converted
file fills with exactly the released values.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rf_eval.files.tensor_files import read_tensors, save_tensors
from rf_eval.fills.ridge import Ridge
from rf_eval.integrity.hashing import file_sha256
from rf_eval.ridge.maps import FORMAT, MapError, RidgeMaps, config_hash, int8_weights, map_filename
from rf_eval.version import __version__

MANIFEST = "ridgefill.json"
#: `projector.dtype` -> the tensors each layer's file holds, after `proj.{l}.`
LAYOUTS = {"i8": ("codes", "scale", "bias"), "bf16": ("weight", "bias")}


def read_manifest(folder: str | Path) -> dict:
    """The folder's `ridgefill.json`, checked for what the conversion reads; a MapError naming what is wrong."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise MapError(f"{folder} holds no {MANIFEST}: not a released RidgeFill projector folder "
                       "(rf-eval's own map files load with maps= directly)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MapError(f"cannot read {path}: {err}") from err
    if manifest.get("format") != 1:
        raise MapError(f"{path}: manifest format {manifest.get('format')!r}, this converter reads format 1")
    projector = manifest.get("projector") or {}
    dtype = projector.get("dtype")
    if dtype not in LAYOUTS:
        raise MapError(f"{path}: projector dtype {dtype!r} is not one of {', '.join(LAYOUTS)}")
    if not isinstance(projector.get("files"), dict) or not projector["files"]:
        raise MapError(f"{path}: no projector.files (layer -> file) listed")
    if not isinstance(manifest.get("split"), int):
        raise MapError(f"{path}: no integer split")
    return manifest


def _layer_tensors(folder: Path, manifest: dict, layer: int, name: str) -> dict[str, torch.Tensor]:
    file = folder / name
    listed = (manifest.get("files") or {}).get(name)
    if not file.is_file():
        raise MapError(f"{folder}: the manifest lists {name} for layer {layer}, but the file is missing")
    if listed is None:
        raise MapError(f"{folder}: {name} has no sha256 in the manifest's files; refusing an unchecked map")
    if file_sha256(file) != listed:
        raise MapError(f"{file} does not match its sha256 in {MANIFEST} (download it again)")
    tensors, _ = read_tensors(file, MapError, "projector file")
    want = [f"proj.{layer}.{part}" for part in LAYOUTS[manifest["projector"]["dtype"]]]
    missing = [w for w in want if w not in tensors]
    if missing:
        raise MapError(f"{file}: no tensor {', '.join(missing)} (holds {', '.join(sorted(tensors))})")
    return {w.rsplit(".", 1)[1]: tensors[w] for w in want}


def read_release(folder: str | Path) -> tuple[RidgeMaps, dict[str, torch.Tensor]]:
    """The folder's maps (dequantized, fp32) and the tensors an rf-eval file stores for them (the int8
    codes, scales and biases as released; fp32 from a bf16 fit, lossless)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    dtype, split = manifest["projector"]["dtype"], manifest["split"]
    files = {int(layer): name for layer, name in manifest["projector"]["files"].items()}
    A, b, stored = {}, {}, {}
    for layer, name in sorted(files.items()):
        parts = _layer_tensors(folder, manifest, layer, name)
        if dtype == "i8":
            codes, scales = parts["codes"], parts["scale"]
            if codes.dtype != torch.int8:
                raise MapError(f"{folder / name}: proj.{layer}.codes is {codes.dtype}, expected int8")
            A[layer] = int8_weights(folder / name, f"proj.{layer}", codes, scales)
            stored.update({f"A.{layer}": codes, f"A.{layer}.scales": scales})
        else:
            A[layer] = parts["weight"].float()
            stored[f"A.{layer}"] = A[layer]
        b[layer] = parts["bias"].float()
        for what, values in ((f"proj.{layer} weights", A[layer]), (f"proj.{layer}.bias", b[layer])):
            if not bool(torch.isfinite(values).all()):
                raise MapError(f"{folder / name}: {what} hold non-finite values (NaN or inf)")
        stored[f"b.{layer}"] = parts["bias"] if dtype == "i8" else b[layer]
    meta = {"storage": "int8" if dtype == "i8" else "float32", "target": "inputs", "fill": Ridge.name,
            "map_split": "true", "release_manifest_sha256": file_sha256(folder / MANIFEST),
            "release_name": str(manifest.get("name", "")), "release_doi": str(manifest.get("doi", ""))}
    return RidgeMaps(split=split, A=A, b=b, metadata=meta, path=folder), stored


def convert_release(folder: str | Path, config, out_dir: str | Path) -> RidgeMaps:
    """Write the released projector in `folder` as an rf-eval map file for the model of `config` (its
    config hash recorded; refused with a MapError when the layers or shapes do not fit that model); the
    maps, with `path` the file written."""
    maps, stored = read_release(folder)
    maps.metadata["config_hash"] = config_hash(config)
    maps.metadata["model"] = str(getattr(config, "_name_or_path", ""))
    maps.check_model(config)  # before anything is written
    meta = {**maps.metadata, "format": FORMAT, "split": str(maps.split), "rf_eval_version": __version__}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    maps.path = save_tensors(stored, out / map_filename(maps.split), meta)
    return maps
