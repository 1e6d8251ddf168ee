"""RidgeFill map files: one safetensors file per split.

Tensors `A.{l}` (d_out x d_in) and `b.{l}` (d_out) for every late layer l
(the split's own layer included), with string metadata: the model config's
hash, the fingerprint of the weights they were fitted on (`weights_sha256`,
`rf_eval.integrity.weights`), split, lambda, calibration row count and the sha256 of the
calibration inputs. The paper's release format (App. F: "int8, with one bf16 scale per
128 weights of each row and a bf16 bias"), `A.{l}` as int8 codes with `A.{l}.scales`
(bf16, d_out x ceil(d_in/128)) and `b.{l}` in bf16, is dequantized on load; fp32
scales and biases (files rf-eval wrote before it followed the release) load too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rf_eval.files.tensor_files import read_tensors, save_tensors
from rf_eval.integrity.hashing import file_sha256
from rf_eval.ridge.targets import target_width

log = logging.getLogger(__name__)

FORMAT = "rf-eval-ridgefill-maps/1"
INT8_GROUP = 128
#: how a map file stores `A.{l}`: fp32, or the release's int8 with one scale per `INT8_GROUP` weights
STORAGES = ("float32", "int8")

# Config fields that fix the shapes and meaning of hidden states.
_HASHED_FIELDS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "layer_types",
    "rope_theta",
    "rope_parameters",
)


class MapError(ValueError):
    """A map file that is missing, corrupt, or made for another model or split."""


def config_hash(config) -> str:
    """sha256 of the config fields that fix what a hidden state means."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    picked = {k: cfg.get(k) for k in _HASHED_FIELDS if k in cfg}
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()


def map_filename(split: int) -> str:
    return f"ridgefill_split{split}.safetensors"


@dataclass
class RidgeMaps:
    """Fitted maps for one split: x̂_l = A[l] @ x_S + b[l] for l in A."""

    split: int
    A: dict[int, torch.Tensor]
    b: dict[int, torch.Tensor]
    metadata: dict[str, str]
    #: the file the maps were read from (None for maps built in memory)
    path: Path | None = None
    #: True: `fill_fn` keeps the maps in host memory and streams each layer's to its device (`on_host`)
    host: bool = False

    def on_host(self) -> RidgeMaps:
        """These maps kept in host memory: `fill_fn` copies each layer's map to the device when the layer
        asks, the next layer's copy issued ahead on a side stream (CUDA, from pinned memory) so it overlaps
        this layer's work; the values are the resident maps', bitwise (the paper's streamed deployment)."""
        return dataclasses.replace(self, host=True)

    @property
    def layers(self) -> list[int]:
        return sorted(self.A)

    def sha256(self) -> str:
        return self.metadata.get("file_sha256", "")

    def save(self, out_dir: str | Path) -> Path:
        """Write the map file atomically; with metadata `storage` "int8", in the release format (`A.{l}` as
        int8 codes with bf16 `A.{l}.scales`, `quantize_int8`, and a bf16 bias)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        storage = self.metadata.get("storage", "float32")
        if storage not in STORAGES:
            raise ValueError(f"storage {storage!r} is not one of {', '.join(STORAGES)}")
        tensors = {}
        for layer in self.layers:
            if storage == "int8":
                tensors[f"A.{layer}"], tensors[f"A.{layer}.scales"] = quantize_int8(self.A[layer].float())
            else:
                tensors[f"A.{layer}"] = self.A[layer].float().contiguous()
            bias_dtype = torch.bfloat16 if storage == "int8" else torch.float32
            tensors[f"b.{layer}"] = self.b[layer].to(bias_dtype).contiguous()
        meta = {k: str(v) for k, v in self.metadata.items() if k != "file_sha256"}
        meta.update(format=FORMAT, split=str(self.split))
        path = out / map_filename(self.split)
        return save_tensors(tensors, path, meta)

    def check_model(self, config) -> None:
        """Refuse maps fitted for another model (by config hash) or with the wrong layer set."""
        want = self.metadata.get("config_hash")
        have = config_hash(config)
        if want != have:
            raise MapError(
                f"maps were fitted for another model (config hash {str(want)[:12]}..., "
                f"this model {have[:12]}...)"
            )
        n_layers = config.num_hidden_layers
        expected = list(range(self.split, n_layers))
        if self.layers != expected:
            raise MapError(f"maps hold layers {self.layers}, expected {expected} for split {self.split}")
        d = int(config.hidden_size)
        target = self.metadata.get("target", "inputs")
        for layer in self.layers:
            d_out = target_width(config, layer, target)  # `rf_eval.ridge.targets`
            what = f"hidden size {d}" if d_out == d else f"2 x kv heads x head dim {d_out}, hidden size {d}"
            for name, tensor, shape in ((f"A.{layer}", self.A[layer], (d_out, d)), (f"b.{layer}", self.b[layer],
                                                                                     (d_out,))):
                if tuple(tensor.shape) != shape:
                    raise MapError(f"{self.where()}: {name} has shape {tuple(tensor.shape)}, expected {shape} "
                                   f"({what})")

    def where(self) -> str:
        return str(self.path) if self.path is not None else "maps"

    def check_weights(self, fingerprint: str, *, allow_other_weights: bool = False) -> None:
        """Refuse maps fitted on other weights (`rf_eval.integrity.weights.weights_fingerprint`), unless allowed."""
        fitted = self.metadata.get("weights_sha256")
        if not fitted:
            why = ("converted from a released projector" if self.metadata.get("release_manifest_sha256")
                   else "written before rf-eval recorded one")
            log.warning("%s records no weights fingerprint (%s): cannot check that it was fitted on these "
                        "weights", self.where(), why)
            return
        if fitted != fingerprint and not allow_other_weights:
            raise MapError(
                f"{self.where()} was fitted on other weights (weights fingerprint {fitted[:12]}..., "
                f"this model {fingerprint[:12]}...); refit the maps, or pass allow_other_weights=true "
                "to transfer them deliberately"
            )

    def fill_fn(self, dtype: torch.dtype, device: torch.device | str):
        """The engine's fill function: x̂_l = x_S A_l^T + b_l, in the model's dtype on its device (with
        `host`, streamed there layer by layer: `StreamedMaps`)."""
        if self.host:
            return StreamedMaps(self, dtype).fill
        weights = {layer: self.A[layer].to(device=device, dtype=dtype).t().contiguous() for layer in self.A}
        biases = {layer: self.b[layer].to(device=device, dtype=dtype) for layer in self.b}

        def fill(layer: int, x_split: torch.Tensor) -> torch.Tensor:
            if weights[layer].device != x_split.device:  # a model placed across devices: follow the layer's input
                weights[layer], biases[layer] = weights[layer].to(x_split.device), biases[layer].to(x_split.device)
            return affine(x_split, weights[layer], biases[layer])

        return fill


class StreamedMaps:
    """Maps in host memory, each layer's copied to the layer's device when the engine asks for it.

    The copy of the next late layer's map (after the last layer, the first one's, for the next prompt) is
    issued as soon as one layer's is taken: on CUDA from pinned memory on a side stream (the layer's own
    stream waits for it only where it uses it), so the transfer overlaps the layer in between; elsewhere
    the copy is synchronous. One layer's map (plus the next one in flight) is on the device at a time.
    """

    def __init__(self, maps: RidgeMaps, dtype: torch.dtype):
        pin = torch.cuda.is_available()
        self.layers = maps.layers
        self.host = {layer: (self._pinned(maps.A[layer].to(dtype).t().contiguous(), pin),
                             self._pinned(maps.b[layer].to(dtype).contiguous(), pin)) for layer in maps.layers}
        self.ahead: dict[int, tuple[torch.Tensor, torch.Tensor, Any]] = {}
        self._streams: dict[torch.device, Any] = {}

    @staticmethod
    def _pinned(t: torch.Tensor, pin: bool) -> torch.Tensor:
        return t.pin_memory() if pin else t

    def _copy(self, layer: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, Any]:
        weight, bias = self.host[layer]
        if device.type != "cuda":
            return weight.to(device), bias.to(device), None
        if device not in self._streams:  # one side stream per device, made once
            self._streams[device] = torch.cuda.Stream(device)
        stream = self._streams[device]
        with torch.cuda.stream(stream):
            copied = weight.to(device, non_blocking=True), bias.to(device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return (*copied, event)

    def take(self, layer: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s (A^T, b) on `device`, and the next layer's copy issued."""
        weight, bias, event = self.ahead.pop(layer, None) or self._copy(layer, device)
        if weight.device != device:  # prefetched to another layer's device (a model across devices)
            weight, bias, event = self._copy(layer, device)
        if event is not None:
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            weight.record_stream(current)
            bias.record_stream(current)
        following = [later for later in self.layers if later > layer]
        upcoming = following[0] if following else self.layers[0]  # after the last layer: the next prompt's first
        if upcoming != layer and upcoming not in self.ahead:
            self.ahead[upcoming] = self._copy(upcoming, device)
        return weight, bias

    def fill(self, layer: int, x_split: torch.Tensor) -> torch.Tensor:
        return affine(x_split, *self.take(layer, x_split.device))


def affine(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x A^T + b for rows x (..., d_in), given A^T (d_in, d_out); also for no rows: (1, 0, d_out)."""
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight_t).view(*x.shape[:-1], weight_t.shape[1])


def identity_fill(layer: int, x_split: torch.Tensor) -> torch.Tensor:
    """POP's fill: every late layer's input is the split state itself."""
    return x_split


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 weights from int8 codes (d_out x d_in) and their per-group scales (d_out x ceil(d_in/128))."""
    d_in = codes.shape[1]
    expanded = scales.float().repeat_interleave(INT8_GROUP, dim=1)[:, :d_in]
    return codes.float() * expanded


def quantize_int8(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The release format's rule (App. F): for each 128 weights of a row, the scale is absmax/127 rounded
    to bf16 (1 for an all-zero group) and the codes are the weights over that rounded scale, rounded half
    to even and clamped to +-127; returns (int8 codes d_out x d_in, bf16 scales d_out x groups)."""
    d_out, d_in = a.shape
    groups = math.ceil(d_in / INT8_GROUP)
    padded = torch.zeros(d_out, groups * INT8_GROUP, dtype=torch.float32)
    padded[:, :d_in] = a.float()
    blocks = padded.view(d_out, groups, INT8_GROUP)
    absmax = blocks.abs().amax(-1)
    scales = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax)).to(torch.bfloat16)
    codes = torch.round(blocks / scales.float()[..., None]).clamp(-127, 127).to(torch.int8)
    return codes.view(d_out, -1)[:, :d_in].contiguous(), scales


def resolve_map_file(path: str | Path, split: int | None) -> Path:
    """A map file from a file path, or from a folder plus a split."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        files = sorted(p.glob("ridgefill_split*.safetensors"))
        if not files:
            raise MapError(f"no map files (ridgefill_split*.safetensors) in {p}")
        if split is None:
            if len(files) == 1:
                return files[0]
            raise MapError(f"{p} holds maps for several splits ({', '.join(f.name for f in files)}); give split=")
        wanted = p / map_filename(split)
        if not wanted.is_file():
            have = ", ".join(f.name for f in files)
            raise MapError(f"no maps for split {split} in {p}; available: {have}")
        return wanted
    if p.is_symlink():  # it is there (ls lists it), but leads nowhere: say so, not "does not exist"
        raise MapError(f"map path {p} is a link that leads to no file (to itself, in a loop, or to a removed "
                       "file); give the maps file or folder itself")
    raise MapError(f"map path {p} does not exist")


def _layer(file: Path, name: str, rest: str) -> int:
    if not rest.isdigit():
        raise MapError(f"{file}: tensor {name!r} is not A.<layer>, A.<layer>.scales or b.<layer>")
    return int(rest)


def _check_finite(file: Path, name: str, tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise MapError(f"{file}: tensor {name} holds {bad} non-finite value(s) (NaN or inf); refit the maps")


def int8_weights(where: str | Path, name: str, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 weights of int8 `codes` and their `scales`, checked: one scale per 128 weights of each row, every
    scale finite and positive (a scale is absmax/127, 1 for an all-zero group: a zero scale would leave the
    fill its bias alone); a MapError naming `where` and the tensor otherwise."""
    want = (codes.shape[0], math.ceil(codes.shape[1] / INT8_GROUP)) if codes.dim() == 2 else None
    if want is None or tuple(scales.shape) != want:
        raise MapError(f"{where}: {name}.scales has shape {tuple(scales.shape)}, expected {want} "
                       f"for int8 {name} of shape {tuple(codes.shape)}")
    _check_finite(Path(where), f"{name}.scales", scales)
    if bool((scales <= 0).any()):
        bad = int((scales <= 0).sum())
        raise MapError(f"{where}: tensor {name}.scales holds {bad} scale(s) <= 0 (each is its group's absmax/127, "
                       "1 for an all-zero group); re-quantize or refit the maps")
    return dequantize_int8(codes, scales)


def load_arm_maps(path: str | Path, split: int | None) -> RidgeMaps:
    """An arm's maps: from a folder, the file of `split`; a file as it is (the arm checks its split)."""
    return load_maps(path, split if Path(path).is_dir() else None)


def load_maps(path: str | Path, split: int | None = None) -> RidgeMaps:
    """Load maps (float or int8 release format); a clear MapError for any bad file."""
    file = resolve_map_file(path, split)
    tensors, meta = read_tensors(file, MapError, "map file")
    if "split" not in meta:
        raise MapError(f"{file} has no 'split' metadata: not an rf-eval map file")
    file_split = int(meta["split"])
    if split is not None and file_split != split:
        raise MapError(f"{file} holds maps for split {file_split}, not {split}")
    A, b = {}, {}
    for name, t in tensors.items():
        kind, _, rest = name.partition(".")
        if kind == "A" and not rest.endswith("scales"):
            layer = _layer(file, name, rest)
            scales = tensors.get(f"A.{layer}.scales")
            if t.dtype == torch.int8:
                if scales is None:
                    raise MapError(f"{file}: int8 tensor A.{layer} without A.{layer}.scales")
                A[layer] = int8_weights(file, f"A.{layer}", t, scales)
            else:
                A[layer] = t.float()
            _check_finite(file, name, A[layer])
        elif kind == "b":
            b[_layer(file, name, rest)] = t.float()
            _check_finite(file, name, t)
    if not A or set(A) != set(b):
        raise MapError(f"{file}: A and b tensors do not cover the same layers")
    meta["file_sha256"] = file_sha256(file)
    return RidgeMaps(split=file_split, A=A, b=b, metadata=meta, path=file)
