"""Fit RidgeFill map files into a folder: what `rf-eval fit` and a study's `fit:` block both run.

`fit_map_files` checks its inputs before any model loads (an `out` that is a file or a non-empty folder
without `overwrite`, a `device` this machine lacks, a local `model` path that does not exist, splits and
fill against the model's config), captures and solves (or solves again from saved sums), and writes the
files into `.<out>.partial` beside `out`, moved into it only when the fit is complete, so a failed or
killed fit leaves `out` as it was. Its refusals are `UserError`s naming the `rf-eval fit` option at fault
(`--out`, `--model`, ...), the names a study's `fit:` block shares.

Under `torchrun --nproc_per_node K` the documents are sharded across the K processes and the sums
all-reduced (gloo on CPU, NCCL on CUDA); rank 0 writes the files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rf_eval.devices import check_device, check_model_source, init_distributed, parse_dtype, rank_and_world
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT
from rf_eval.errors import UserError
from rf_eval.families import family_class_for
from rf_eval.files.tensor_files import read_metadata
from rf_eval.fills import FILL_OFF, fill_named
from rf_eval.fills.loading_report import check_loaded, recording_missing_keys
from rf_eval.fills.ridge import Ridge
from rf_eval.ridge.calibration import CalibrationError, check_disjoint, check_has_rows, check_nonempty
from rf_eval.ridge.fit_memory import parse_heldout_memory
from rf_eval.ridge.lambdas import check_lambdas
from rf_eval.ridge.maps import config_hash
from rf_eval.ridgefill.fitting import FitResult, FitSettings, fit_maps, fit_target, refit_from_sums
from rf_eval.ridgefill.fitting import check_splits as splits_in_range

__all__ = ["FitOptions", "fit_map_files", "fit_summary", "load_fit_model"]


def load_fit_model(model: str, *, device: str | None = None, dtype: str = "auto", trust_remote_code: bool = False,
                   fill: str | None = None) -> tuple[Any, Any]:
    """The model (in eval mode, on `device`; a torchrun rank's own GPU) and its tokenizer, refused when
    transformers initialised any tensor `fill` reads at random (a fit on them would write maps of noise)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = check_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    with recording_missing_keys():
        loaded = AutoModelForCausalLM.from_pretrained(
            model, dtype=parse_dtype(dtype, device), trust_remote_code=trust_remote_code
        ).to(device)
    try:
        check_loaded(loaded, fill or FILL_OFF)
    except ValueError as err:
        raise UserError(f"--model {model}: {err}") from None
    return loaded.eval(), AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)


def check_out(out: str, overwrite: bool) -> None:
    """`out` is a folder (or new) in a writable place, empty unless `overwrite`."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the map files")
    folder = path.resolve().parent  # where the staging folder and --out are made: a file written there now
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise UserError(f"--out {out}: cannot write in {folder} ({err.strerror or err})") from None
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise UserError(f"--out {out} is not empty; choose a new folder, or pass --overwrite to replace "
                        "the files of the same name in it")


def check_fill(fill: str, model: str | None, *, from_sums: bool, trust_remote_code: bool) -> None:
    """`fill` names a fill with maps to fit, for a model it can be fitted on (from its config)."""
    from transformers import AutoConfig

    if from_sums and fill != Ridge.name:
        raise UserError("--fill: --from-sums refits the fill its sums were captured for; leave --fill out")
    try:
        fit_target(fill)
    except ValueError as err:
        raise UserError(f"--fill: {err}") from None
    if not model:
        return
    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return
    try:  # the capture reads the layers through the model's family: none, and it cannot run
        family_class_for(config)
    except ValueError as err:
        raise UserError(f"--model {model}: {err}") from None
    try:
        fill_named(fill).check_fit(config)
    except ValueError as err:
        raise UserError(f"--fill {fill}: {err}") from None


def check_sums(folder: str, model: str | None) -> None:
    """`folder` holds saved sums, captured from a model of `model`'s config (read from the file headers and
    the model's config; the weights fingerprint is compared once the weights load)."""
    from transformers import AutoConfig

    files = sorted(Path(folder).glob("sums_split*.safetensors"))
    if not Path(folder).is_dir() or not files:
        raise UserError(f"--from-sums {folder}: no saved sums (sums_split*.safetensors) there; "
                        "`rf-eval fit` writes them beside the maps it fits")
    if not model:
        return
    try:
        expected = config_hash(AutoConfig.from_pretrained(model))
    except (OSError, ValueError):
        return  # left to the model's own loading, which says why
    for file in files:
        captured = read_metadata(file, UserError, "--from-sums file").get("config_hash")
        if captured not in (None, "", expected):
            raise UserError(f"--from-sums {file} was captured from another model than --model {model} "
                            f"(config hash {captured[:12]}..., the model's {expected[:12]}...)")


def check_splits(model: str, splits: Sequence[int]) -> None:
    """Each split in 1..L-1 of the model's L layers, read from its config (no weights); a config that cannot
    be read here is left to the model's own loading, which says why."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return
    try:
        splits_in_range(list(splits), config.get_text_config().num_hidden_layers)
    except ValueError as err:
        raise UserError(f"--splits: {err}") from None


def staging_folder(out: str) -> Path:
    """Where a fit into `out` writes until it is complete: `.<out>.partial` beside it."""
    final = Path(out)
    return final.parent / f".{final.name}.partial"


def publish(result: FitResult, out: str) -> None:
    """Move a complete fit from its staging folder into `out` (rank 0; the others wrote nothing)."""
    staging, final = staging_folder(out), Path(out)
    if rank_and_world()[0] != 0 or not staging.is_dir():
        return
    final.mkdir(parents=True, exist_ok=True)
    for file in sorted(staging.iterdir()):
        os.replace(file, final / file.name)
    shutil.rmtree(staging, ignore_errors=True)
    result.paths = {split: final / Path(path).name for split, path in result.paths.items()}


@dataclass(frozen=True)
class FitOptions:
    """`rf-eval fit`'s options but `--out`, each field the option of the same name (`progress`: not
    `--no-progress`): what the command and a study's `fit:` block give `fit_map_files`."""

    model: str | None = None
    splits: Sequence[int] | None = None
    fill: str | None = None
    calibration: Sequence[str | Path] = ()
    heldout: Sequence[str | Path] = ()
    lambdas: Sequence[float] | None = None
    from_sums: str | Path | None = None
    overwrite: bool = False
    max_tokens: int = 32768
    device: str | None = None
    dtype: str = "auto"
    map_split: bool = DEFAULT_MAP_SPLIT
    sums_device: str = "auto"
    heldout_memory: str = "auto"
    int8: bool = False
    trust_remote_code: bool = False
    progress: bool = True

    def settings(self) -> FitSettings:
        """The options `fit_maps` and `refit_from_sums` read (`FitSettings`), the fill defaulting to ridge."""
        return FitSettings(heldout=[str(h) for h in self.heldout], max_tokens=self.max_tokens,
                           progress=self.progress, map_split=self.map_split, sums_device=self.sums_device,
                           heldout_memory=self.heldout_memory, fill=self.fill or Ridge.name, int8=self.int8)


def check_before_loading(out: str, options: FitOptions) -> None:
    """What `fit_map_files` refuses before any model loads (`--out`, `--device`, `--model`, `--splits`, `--fill`,
    `--from-sums`, `--heldout-memory`)."""
    model, from_sums = options.model, options.from_sums
    check_out(out, options.overwrite)
    try:
        check_device(options.device)
        if model:
            check_model_source(model)
    except ValueError as err:
        raise UserError(f"--{'device' if 'device' in str(err).split(':')[0] else 'model'}: {err}") from None
    if model and options.splits:
        check_splits(model, options.splits)
    check_fill(options.fill or Ridge.name, model, from_sums=bool(from_sums),
               trust_remote_code=options.trust_remote_code)
    if from_sums:
        if not options.lambdas:
            raise UserError("--from-sums needs --lambdas")
        check_sums(str(from_sums), model)
    try:
        parse_heldout_memory(options.heldout_memory)
    except ValueError as err:
        raise UserError(f"--heldout-memory: {err}") from None


def _fit_into(staging: Path, options: FitOptions) -> FitResult:
    """Load the model and fit (or solve again from saved sums) into `staging`; ValueError on bad inputs."""
    model, settings = options.model, options.settings()
    lambdas = list(options.lambdas) if options.lambdas is not None else None
    loading = dict(device=options.device, dtype=options.dtype, trust_remote_code=options.trust_remote_code,
                   fill=settings.fill)
    if options.from_sums:
        loaded = tokenizer = None
        if model:
            loaded, tokenizer = load_fit_model(model, **loading)
        return refit_from_sums(str(options.from_sums), out=staging, lambdas=lambdas, model=loaded,
                               tokenizer=tokenizer, settings=settings)
    if not model or not options.splits:
        raise UserError("fit needs --model and --splits (or --from-sums)")
    calibration = [str(c) for c in options.calibration]
    check_lambdas(lambdas, bool(settings.heldout))  # fail before loading the model
    check_nonempty(calibration)
    if settings.heldout:
        check_nonempty(settings.heldout)
        check_disjoint(calibration, settings.heldout)
    from transformers import AutoTokenizer

    check_has_rows(calibration, AutoTokenizer.from_pretrained(model, trust_remote_code=options.trust_remote_code))
    init_distributed()
    loaded, tokenizer = load_fit_model(model, **loading)
    return fit_maps(loaded, tokenizer, splits=list(options.splits), calibration=calibration, out=staging,
                    lambdas=lambdas, settings=settings)


def fit_map_files(out: str | Path, options: FitOptions | None = None, **given: Any) -> FitResult:
    """Capture `model`'s hidden states on `calibration` and fit the maps of `fill` (default ridge) at each of
    `splits` into `out`, λ chosen on `heldout` from `lambdas` (`rf_eval.ridgefill.fitting.fit_maps`); or,
    with `from_sums`, solve again from sums a fit saved (`refit_from_sums`). `options` (`FitOptions`) are
    the `rf-eval fit` options, `given` any of them by name over `options` (`fit_map_files(out, model=...,
    splits=[16])`, as a study's `fit:` block gives them). Returns the fit's result, its paths in `out`."""
    out = str(out)
    options = replace(options or FitOptions(), **given)
    check_before_loading(out, options)
    staging = staging_folder(out)
    if int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a killed fit's leftovers
    try:
        result = _fit_into(staging, options)
    except (ValueError, CalibrationError) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(str(err)) from err
    except OSError as err:  # e.g. a hub id that cannot be fetched offline
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"--model {options.model}: {err}") from err
    publish(result, out)
    return result


def fit_summary(result: FitResult) -> list[str]:
    """What a fit prints: where its sums lived, then each split's λ (and held-out cosine) and map file."""
    lines = [f"sums: {result.sums_device}"] if result.sums_device else []
    for split, path in sorted(result.paths.items()):
        scores = result.scores[split]
        extra = f" (held-out cosine {scores[result.chosen[split]]:.4f})" if scores else ""
        lines.append(f"split {split}: lambda {result.chosen[split]:g}{extra}, {result.rows} rows -> {path}")
    return lines
