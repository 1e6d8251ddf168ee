"""Fit RaReCache's source -> target cache maps into a folder: what `rf-eval fit-transfer` runs.

`fit_transfer_file` refuses what it can before a tokenizer or weights load (the numbers, `out`, both model
folders, the device and dtype, `k` against the source's layers), checks the two tokenizers agree, loads
both models and fits (`rf_eval.rarecache.fit.fit_transfer`, paper section 3.1, appendix A). Its refusals
are `UserError`s naming the `rf-eval fit-transfer` option at fault (`--k`, `--out`, ...). Under
`torchrun --nproc_per_node K` the documents are sharded across processes and the sums all-reduced; rank 0
writes the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rf_eval.devices import check_device, check_model_source, default_device, init_distributed, parse_dtype
from rf_eval.errors import UserError
from rf_eval.integrity.tokenizers import check_tokenizers
from rf_eval.rarecache.fit import TransferSettings, fit_transfer
from rf_eval.rarecache.maps import FILENAME
from rf_eval.ridge.calibration import CalibrationError, check_nonempty

__all__ = ["TransferFit", "TransferOptions", "check_transfer_inputs", "fit_transfer_file"]


@dataclass(frozen=True)
class TransferFit:
    """A finished transfer fit: the maps, the file written (None on a rank that writes nothing), and the
    settings it ran with (for its summary line)."""

    maps: Any
    path: Any  # as `fit_transfer` returned it
    k: int
    rank: int
    lam: float

    def summary(self) -> str | None:
        """The line `rf-eval fit-transfer` prints: rows, settings, mean in-sample R² per side, the file."""
        if self.path is None:
            return None
        r2 = json.loads(self.maps.metadata["r2"])
        means = {s: sum(v["r2_k"] for v in r2[s].values()) / len(r2[s]) for s in r2}
        return (f"{self.maps.metadata['rows']} calibration rows, k={self.k}, rank={self.rank}, lambda={self.lam:g}; "
                f"mean in-sample R²_K key {means['key']:.4f}, value {means['value']:.4f} -> {self.path}")


@dataclass(frozen=True)
class TransferOptions:
    """`rf-eval fit-transfer`'s options but the pair, its calibration and `--out`, each field the option of the
    same name (`lam`: `--lambda`; `progress`: not `--no-progress`): what the command gives `fit_transfer_file`."""

    k: int = 8
    rank: int = 128
    lam: float = 0.01
    stride: int = 1
    max_tokens: int = 32768
    device: str | None = None
    sums_device: str | None = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    overwrite: bool = False
    progress: bool = True

    def settings(self) -> TransferSettings:
        """The fit's own settings (`rf_eval.rarecache.fit.fit_transfer`)."""
        return TransferSettings(k=self.k, rank=self.rank, lam=self.lam, stride=self.stride,
                                max_tokens=self.max_tokens, progress=self.progress, sums_device=self.sums_device)


def check_transfer_inputs(source: str, target: str, out: str, options: TransferOptions) -> None:
    """What can be refused before a tokenizer or weights load: the numbers, `out`, both model folders, the
    device and dtype, and `k` against the source model's layers (from its config)."""
    from transformers import AutoConfig

    if options.k < 1 or options.rank < 0 or options.stride < 1 or not options.lam > 0:
        raise UserError("need --k >= 1, --rank >= 0, --stride >= 1 and --lambda > 0")
    if options.max_tokens < 2:
        raise UserError(f"--max-tokens {options.max_tokens}: a document needs at least 2 tokens")
    folder = Path(out)
    if folder.is_file():
        raise UserError(f"--out {out} is a file; give a folder for {FILENAME}")
    if (folder / FILENAME).exists() and not options.overwrite:
        raise UserError(f"--out {out} already holds {FILENAME}; choose a new folder, or pass --overwrite "
                        "to replace it")
    for option, check in (("--source", lambda: check_model_source(source)),
                          ("--target", lambda: check_model_source(target)),
                          ("--device", lambda: check_device(options.device)),
                          ("--sums-device", lambda: check_device(options.sums_device) if options.sums_device else None),
                          ("--dtype", lambda: parse_dtype(options.dtype, check_device(options.device)))):
        try:
            check()
        except ValueError as err:
            raise UserError(f"{option}: {err}") from None
    try:
        layers = AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code
                                            ).get_text_config().num_hidden_layers
    except (OSError, ValueError):
        return  # the model's own loading says why
    if options.k > layers:
        raise UserError(f"--k {options.k}: must be in 1..{layers} (the source's layer count)")


def fit_transfer_file(
    source: str,
    target: str,
    calibration: Sequence[str | Path],
    out: str | Path,
    options: TransferOptions | None = None,
) -> TransferFit:
    """Fit the maps that predict `target`'s cache from `source`'s on the `calibration` documents, into
    `out`/rarecache_maps.safetensors. Each parameter, and each field of `options` (`TransferOptions`), is the
    `rf-eval fit-transfer` option of the same name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = options or TransferOptions()
    out = str(out)
    calibration = [str(c) for c in calibration]
    remote = dict(trust_remote_code=options.trust_remote_code)
    check_transfer_inputs(source, target, out, options)
    try:
        check_nonempty(calibration)
        source_tok = AutoTokenizer.from_pretrained(source, **remote)
        target_tok = AutoTokenizer.from_pretrained(target, **remote)
        check_tokenizers(source_tok, target_tok)  # before any weights load
        init_distributed()
        device = options.device or default_device()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch_dtype = parse_dtype(options.dtype, device)
        source_model, target_model = (
            AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, **remote).to(device).eval()
            for p in (source, target)
        )
        maps, path = fit_transfer(source_model, target_model, source_tok, target_tok, calibration, out=out,
                                  settings=options.settings())
    except (ValueError, CalibrationError, OSError) as err:
        raise UserError(str(err)) from err
    return TransferFit(maps, path, options.k, options.rank, options.lam)
