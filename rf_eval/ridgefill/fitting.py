"""Fit the maps a fill serves: capture sums, solve per lambda, choose lambda on held-out text, save.

The algebra is `rf_eval.ridge`; what is fitted comes from the fill (its `fit_target`, `rf_eval.fills`), so
this module sits above the fills and the ridge package below them.

Under torchrun / accelerate (torch.distributed initialised) documents are
sharded by rank, the sums and held-out scores are all-reduced, and rank 0
writes the files; the maps equal a one-process fit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torch import nn

from rf_eval.devices import rank_and_world
from rf_eval.engine import num_layers
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT, check_split
from rf_eval.fills import fill_named, registered_fills
from rf_eval.fills.ridge import Ridge
from rf_eval.integrity.hashing import sha256_of_files
from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.ridge.calibration import check_disjoint, check_nonempty, tokenized
from rf_eval.ridge.capture import capture_sums
from rf_eval.ridge.fit_memory import choose_sums_device, parse_heldout_memory, sums_bytes
from rf_eval.ridge.lambdas import HeldoutScoring, Maps, check_lambdas, choose_lambda
from rf_eval.ridge.maps import RidgeMaps, config_hash
from rf_eval.ridge.sums import RidgeSums, sums_filename
from rf_eval.ridge.unigram import UnigramCounter
from rf_eval.version import __version__

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    paths: dict[int, Path]
    chosen: dict[int, float]
    scores: dict[int, dict[float, float]]
    rows: int
    sums_device: str = ""  # where the fp64 sums were kept, and why (`choose_sums_device`)


@dataclass(frozen=True)
class FitSettings:
    """How a fit scores lambdas, keeps its sums and writes its maps (`fit_maps`, `refit_from_sums`); each
    field but `save_sums` (write the sums beside the maps, for `--from-sums`) is the `rf-eval fit` option of
    the same name, and `fit_map_files` builds it once from its options (`FitOptions.settings`).

    `heldout`: the documents that choose lambda (section 2.2), none to take the one lambda given.
    `sums_device` (auto, cpu, model): where the fp64 running sums live
    (`choose_sums_device`; auto: the model's GPU if they fit there, else the CPU).
    `heldout_memory` (GiB, or auto): the budget of the held-out lambda passes' maps (`choose_lambda`).

    `map_split`: the arms these maps serve read layer S's map (the paper's
    release; default `DEFAULT_MAP_SPLIT`, no: layer S reads x_S), so the held-out
    lambda choice scores layer S too; the files record it (`map_split` metadata).
    `fill`: the fill the maps serve (`rf_eval.fills`); its `fit_target`
    says what each late layer's rows are regressed on (`rf_eval.ridge.targets`).
    `int8`: the map files store A in the paper's release format (int8, one bf16 scale
    per 128 weights of each row, a bf16 bias; `rf_eval.ridge.maps.quantize_int8`); the sums stay fp64.
    """

    heldout: Sequence[str | Path] = ()
    max_tokens: int = 32768
    progress: bool = True
    save_sums: bool = True
    map_split: bool = DEFAULT_MAP_SPLIT
    sums_device: str = "auto"
    heldout_memory: str | float = "auto"
    fill: str = Ridge.name
    int8: bool = False

    def scoring(self) -> HeldoutScoring:
        """The held-out lambda choice these settings ask for (`choose_lambda`)."""
        return HeldoutScoring(documents=self.heldout, max_tokens=self.max_tokens, progress=self.progress,
                              map_split=self.map_split, memory=self.heldout_memory)

    def storage(self) -> str:
        """The map files' `storage` metadata: int8 (the paper's release format) or float32."""
        return "int8" if self.int8 else "float32"


def fit_target(fill: str, model: nn.Module | None = None) -> str:
    """What the maps of fill `fill` regress on (its `fit_target`); ValueError for a method that fits
    nothing, or for a model it cannot be fitted on (`Fill.check_fit`)."""
    method = fill_named(fill)
    if method.fit_target is None:
        fitted = [n for n in registered_fills() if fill_named(n).fit_target is not None]
        raise ValueError(f"fill {fill!r} has no maps to fit; fills with maps: {', '.join(fitted)}")
    if model is not None:
        method.check_fit(model.config)
    return method.fit_target


def check_splits(splits: Sequence[int], n_layers: int) -> list[int]:
    if not splits:
        raise ValueError("give at least one split")
    for split in splits:
        check_split(split, n_layers)
    return sorted(set(splits))


def _write_maps(sums, maps: Maps, best, scores, meta, out: Path) -> Path:
    A, b = maps
    metadata = dict(meta)
    metadata.update(
        **{"lambda": repr(best), "rows": str(sums.count),
           "lambda_scores": json.dumps({repr(k): v for k, v in scores.items()})}
    )
    return RidgeMaps(split=sums.split, A=A, b=b, metadata=metadata).save(out)


def _check_inputs(splits: Sequence[int], calibration: Sequence[str | Path], lambdas: Sequence[float] | None,
                  settings: FitSettings, model: nn.Module) -> tuple[str, list[int], tuple[float, ...]]:
    """(what the maps regress on, the splits, the lambdas), every input refused before the capture."""
    target = fit_target(settings.fill, model)
    splits = check_splits(splits, num_layers(model))
    lambdas = check_lambdas(lambdas, bool(settings.heldout))
    parse_heldout_memory(settings.heldout_memory)  # bad values fail before the capture
    check_nonempty(calibration)
    if settings.heldout:
        check_nonempty(settings.heldout)
        check_disjoint(calibration, settings.heldout)
    return target, splits, lambdas


def _sums_device(model: nn.Module, splits: Sequence[int], requested: str) -> tuple[Any, str]:
    """Where the fp64 running sums live, and why (`choose_sums_device`), logged."""
    device = next(model.parameters()).device
    n_layers = num_layers(model)
    where, why = choose_sums_device(requested, device, sums_bytes(model.config.hidden_size, n_layers, splits))
    log.info("fit: %s", why)
    return where, why


def _capture(model: nn.Module, tokenizer, calibration: Sequence[str | Path], splits: Sequence[int], where: Any,
             target: str, settings: FitSettings) -> tuple[dict[int, RidgeSums], UnigramCounter]:
    """One pass over the calibration documents: every split's sums and the token counts, all-reduced."""
    device = next(model.parameters()).device
    unigram = UnigramCounter(max(model.config.vocab_size, len(tokenizer)))  # for the protected-token selector
    docs = unigram.wrap(tokenized(tokenizer, calibration, device, settings.max_tokens, "capture", settings.progress))
    all_sums = capture_sums(model, docs, splits, device=where, target=target)
    for sums in all_sums.values():
        sums.all_reduce()
    unigram.all_reduce()
    return all_sums, unigram


def _fit_metadata(model: nn.Module, calibration: Sequence[str | Path], target: str,
                  settings: FitSettings) -> dict[str, str]:
    """What the sums, map and token-count files record of the fit that wrote them."""
    return {
        "config_hash": config_hash(model.config),
        "weights_sha256": weights_fingerprint(model),
        "model": str(getattr(model.config, "_name_or_path", "")),
        "calibration_sha256": sha256_of_files(calibration),
        "heldout_sha256": sha256_of_files(settings.heldout) if settings.heldout else "",
        "max_tokens": str(settings.max_tokens),
        "map_split": str(bool(settings.map_split)).lower(),
        "rf_eval_version": __version__,
        "fill": settings.fill,
        "target": target,
        "storage": settings.storage(),
    }


def fit_maps(
    model: nn.Module,
    tokenizer,
    *,
    splits: Sequence[int],
    calibration: Sequence[str | Path],
    out: str | Path,
    lambdas: Sequence[float] | None = None,
    settings: FitSettings | None = None,
    **options: Any,
) -> FitResult:
    """One capture pass for every split, solves, lambda choice, and the map files in `out`.

    `settings`: held-out text, where the sums live, the fill served and the file format (`FitSettings`);
    `options`: any of its fields by name, over `settings` (`fit_maps(..., heldout=[...], progress=False)`).
    """
    settings = replace(settings or FitSettings(), **options)
    target, splits, lambdas = _check_inputs(splits, calibration, lambdas, settings, model)
    out = Path(out)
    rank, _ = rank_and_world()
    model.eval()
    where, why = _sums_device(model, splits, settings.sums_device)
    t0 = time.perf_counter()
    all_sums, unigram = _capture(model, tokenizer, calibration, splits, where, target, settings)
    capture_s = time.perf_counter() - t0
    meta = _fit_metadata(model, calibration, target, settings)
    result = FitResult(paths={}, chosen={}, scores={}, rows=0, sums_device=why)
    for split, sums in all_sums.items():
        if sums.count == 0:
            raise ValueError("the calibration documents produced no rows (all shorter than 2 tokens?)")
        best, scores, maps = choose_lambda(model, tokenizer, sums, lambdas, settings.scoring(), target)
        result.chosen[split], result.scores[split], result.rows = best, scores, sums.count
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            if settings.save_sums:
                sums.save(out / sums_filename(split), meta)
            result.paths[split] = _write_maps(sums, maps, best, scores, meta, out)
        del maps  # one split's maps at a time
    if rank == 0:
        unigram.save(out, meta)
    log.info("fit: %d rows, capture %.1fs, total %.1fs", result.rows, capture_s, time.perf_counter() - t0)
    return result


def refit_from_sums(
    sums_dir: str | Path,
    *,
    out: str | Path,
    lambdas: Sequence[float],
    model: nn.Module | None = None,
    tokenizer=None,
    settings: FitSettings | None = None,
    **options: Any,
) -> FitResult:
    """New solves from saved sums: a new lambda costs no capture pass (`settings` and `options` as in
    `fit_maps`; their `save_sums`, `sums_device` and `fill` do not apply: the sums are read, not captured,
    and record the target they were captured for)."""
    settings = replace(settings or FitSettings(), **options)
    sums_dir, out = Path(sums_dir), Path(out)
    files = sorted(sums_dir.glob("sums_split*.safetensors"))
    if not files:
        raise ValueError(f"no saved sums (sums_split*.safetensors) in {sums_dir}")
    lambdas = check_lambdas(lambdas, bool(settings.heldout))
    parse_heldout_memory(settings.heldout_memory)
    if len(lambdas) > 1 and model is None:
        raise ValueError("choosing among several lambdas needs the model (--model) to score held-out text")
    result = FitResult(paths={}, chosen={}, scores={}, rows=0)
    for file in files:
        sums, meta = RidgeSums.load(file)
        if model is not None and meta.get("config_hash") != config_hash(model.config):
            raise ValueError(f"{file} was captured from another model (config hash differs)")
        if model is not None and meta.get("weights_sha256") not in (None, "", weights_fingerprint(model)):
            raise ValueError(f"{file} was captured from other weights (weights fingerprint "
                             f"{meta['weights_sha256'][:12]}..., --model {weights_fingerprint(model)[:12]}...)")
        keep = {k: v for k, v in meta.items() if k not in ("split", "count", "layers")}
        keep["map_split"] = str(bool(settings.map_split)).lower()
        keep["storage"] = settings.storage()
        best, scores, maps = choose_lambda(model, tokenizer, sums, lambdas, settings.scoring(),
                                           meta.get("target", "inputs"))
        result.chosen[sums.split], result.scores[sums.split], result.rows = best, scores, sums.count
        result.paths[sums.split] = _write_maps(sums, maps, best, scores, keep, out)
    return result
