"""RaReCache transfer-map files (paper section 3.1 and appendix A).

One safetensors file, `rarecache_maps.safetensors`. For each target layer l
and side s in {key, value}:

- `{s}.{l}.weight` (d_s x d_t): W of eq. 1, rows in the order of the chosen
  source layers (ascending layer index), each block n_kv^s * d_h^s wide;
- `{s}.{l}.bias` (d_t): b = ȳ - x̄ W;
- `{s}.{l}.basis` (d_t x r): V_r, the top-r eigenvectors of the covariance
  of the calibration predictions (appendix A), columns by decreasing eigenvalue;
- `{s}.{l}.eigenvalues` (r): their eigenvalues;

and per source layer j, `{s}.source_mean.{j}` (x̄ of that layer's block:
the same for every target layer that reads it). String metadata: format,
both models' config hashes, the tokenizer's vocabulary hash, K, rank,
lambda, stride, calibration row count and sha256, the chosen source layers
and R² values (JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rf_eval.files.tensor_files import read_tensors, save_tensors
from rf_eval.integrity.hashing import file_sha256
from rf_eval.integrity.tokenizers import TokenizerMismatch, tokenizer_hash
from rf_eval.rarecache.cost import probe_parameters
from rf_eval.ridge.maps import MapError, config_hash

FORMAT = "rf-eval-rarecache-maps/1"
FILENAME = "rarecache_maps.safetensors"
SIDES = ("key", "value")


@dataclass
class SideMap:
    """One target layer's map for one side: ŷ = x W + b, and its well-described basis V_r."""

    source_layers: list[int]
    weight: torch.Tensor  # (d_s, d_t)
    bias: torch.Tensor  # (d_t,)
    basis: torch.Tensor  # (d_t, r)
    eigenvalues: torch.Tensor  # (r,)


@dataclass
class TransferMaps:
    """All maps of one source -> target pair; `maps[(side, target_layer)]`."""

    maps: dict[tuple[str, int], SideMap]
    source_mean: dict[tuple[str, int], torch.Tensor]  # (side, source layer) -> x̄ block
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def target_layers(self) -> list[int]:
        return sorted({layer for _, layer in self.maps})

    def sha256(self) -> str:
        return self.metadata.get("file_sha256", "")

    def parameter_counts(self, probe_count: str = "basis") -> tuple[int, int]:
        """(P_map, P_probe) of eq. 11: map weights and biases, and the probe as `probe_count` counts it
        (`rf_eval.rarecache.cost.PROBE_COUNTS`)."""

        p_map = sum(m.weight.numel() + m.bias.numel() for m in self.maps.values())
        p_probe = sum(probe_parameters(m.weight.shape[0], m.basis.shape[0], m.basis.shape[1], probe_count)
                      for m in self.maps.values())
        return p_map, p_probe

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, torch.Tensor] = {}
        chosen: dict[str, dict[str, list[int]]] = {s: {} for s in SIDES}
        for (side, layer), m in sorted(self.maps.items()):
            chosen[side][str(layer)] = m.source_layers
            for name in ("weight", "bias", "basis", "eigenvalues"):
                tensors[f"{side}.{layer}.{name}"] = getattr(m, name).float().contiguous()
        for (side, j), mean in sorted(self.source_mean.items()):
            tensors[f"{side}.source_mean.{j}"] = mean.float().contiguous()
        meta = {k: str(v) for k, v in self.metadata.items() if k != "file_sha256"}
        meta.update(format=FORMAT, source_layers=json.dumps(chosen))
        path = out / FILENAME
        save_tensors(tensors, path, meta)
        self.metadata["file_sha256"] = file_sha256(path)
        return path

    def check_pair(self, source_config, target_config) -> None:
        """Refuse maps fitted for another source or target (by config hash)."""
        for role, config in (("source", source_config), ("target", target_config)):
            want = self.metadata.get(f"{role}_config_hash")
            have = config_hash(config)
            if want != have:
                raise MapError(
                    f"these maps were fitted for another {role} model (config hash {str(want)[:12]}..., "
                    f"this {role} {have[:12]}...); fit maps for this pair with `rf-eval fit-transfer`"
                )
        expected = list(range(target_config.num_hidden_layers))
        if self.target_layers != expected:
            raise MapError(f"maps hold target layers {self.target_layers}, expected {expected}")

    def check_weights(self, source_fingerprint: str, target_fingerprint: str) -> None:
        """Refuse maps fitted on other weights, or for the pair the other way round (two checkpoints of one
        architecture share a config hash: only the weights tell source from target). Maps written before
        rf-eval recorded the fingerprints pass with the config check alone."""
        want = (self.metadata.get("source_weights_sha256"), self.metadata.get("target_weights_sha256"))
        if want == (None, None):
            return
        have = (source_fingerprint, target_fingerprint)
        if want == have[::-1] and have[0] != have[1]:
            raise MapError("these maps were fitted for this pair the other way round (their source is this "
                           "target and their target this source); swap source= and pretrained=, or fit "
                           "maps for this direction with `rf-eval fit-transfer`")
        for role, fitted, this in zip(("source", "target"), want, have, strict=True):
            if fitted != this:
                raise MapError(f"these maps were fitted on other {role} weights (weights fingerprint "
                               f"{str(fitted)[:12]}..., this {role} {this[:12]}...); fit maps for this pair with "
                               "`rf-eval fit-transfer`")

    def check_tokenizer(self, tokenizer) -> None:
        want = self.metadata.get("tokenizer_sha256")
        if want and tokenizer is not None and tokenizer_hash(tokenizer) != want:
            raise TokenizerMismatch("the tokenizer differs from the one these maps were fitted with")


def resolve(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / FILENAME
    if not p.is_file():
        raise MapError(f"no RaReCache map file at {path} (expected {FILENAME}, written by `rf-eval fit-transfer`)")
    return p


def load_transfer_maps(path: str | Path) -> TransferMaps:
    """Load a map file (or a folder holding one); a clear MapError for anything else."""
    file = resolve(path)
    tensors, meta = read_tensors(file, MapError, "map file")
    if meta.get("format") != FORMAT:
        raise MapError(f"{file} is not a RaReCache map file (format {meta.get('format')!r}, expected {FORMAT})")
    chosen = json.loads(meta["source_layers"])
    maps, means = {}, {}
    for side in SIDES:
        for layer, source_layers in chosen[side].items():
            key = f"{side}.{layer}"
            maps[(side, int(layer))] = SideMap(
                source_layers=list(source_layers),
                **{n: tensors[f"{key}.{n}"] for n in ("weight", "bias", "basis", "eigenvalues")},
            )
    for name, t in tensors.items():
        side, kind, rest = name.split(".", 2)
        if kind == "source_mean":
            means[(side, int(rest))] = t
    meta["file_sha256"] = file_sha256(file)
    return TransferMaps(maps=maps, source_mean=means, metadata=meta)
