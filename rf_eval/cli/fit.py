"""`rf-eval fit`: capture + ridge fit of RidgeFill maps (or new solves from saved sums).

Under `torchrun --nproc_per_node K -m rf_eval fit ...` the documents are
sharded across the K processes and the sums all-reduced (gloo on CPU, NCCL
on CUDA); rank 0 writes the files.

Inputs are checked before the model loads: a local `--model` path that does
not exist, an `--out` that is a file or a non-empty folder (without
`--overwrite`), a `--device` this machine lacks. The files are written into
`.<out>.partial` beside `--out` and moved into it only when the fit is
complete, so a failed or killed fit leaves `--out` as it was.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from rf_eval.cli import UserError
from rf_eval.cli.values import positive_float, positive_int
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="HF model folder or id (required unless --from-sums with one lambda)")
    p.add_argument("--splits", type=positive_int, nargs="+", help="split layers S (one capture pass serves all)")
    p.add_argument("--fill", default=None, metavar="FILL",
                   help="the fill method the maps serve (default ridge; `rf-eval fills` lists those with maps)")
    p.add_argument("--calibration", nargs="+", default=[], help="plain-text files or JSONL with a 'text' field")
    p.add_argument("--heldout", nargs="+", default=[], help="held-out documents for choosing lambda")
    p.add_argument("--lambdas", type=positive_float, nargs="+", default=None,
                   help="lambda grid (default: nine values 1e-4..1 with --heldout, else 0.03)")
    p.add_argument("--from-sums", dest="from_sums", help="folder of saved sums: new solves, no capture")
    p.add_argument("--out", required=True, help="folder for the map files (and the sums); must be empty or new")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out, replacing files of the same name")
    p.add_argument("--max-tokens", type=positive_int, default=32768, help="truncate documents to this many tokens")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--map-split", dest="map_split", action=argparse.BooleanOptionalAction,
                   default=DEFAULT_MAP_SPLIT,
                   help="the arms read layer S's own map (the paper's released maps and MAC accounting): the "
                        "held-out lambda choice scores layer S too. Default --no-map-split: layer S reads x_S "
                        "(exact), not scored")
    p.add_argument("--sums-device", dest="sums_device", choices=("auto", "cpu", "model"), default="auto",
                   help="where the fp64 running sums live: auto (the model's GPU if they fit there with a margin, "
                        "else CPU memory), cpu, model")
    p.add_argument("--heldout-memory", dest="heldout_memory", default="auto", metavar="GIB",
                   help="GiB of maps one held-out lambda pass may hold: the grid is scored in passes that fit "
                        "(auto, default: half the available CPU memory, where the maps live)")
    p.add_argument("--int8", action="store_true",
                   help="store the maps in the paper's release format: int8 with one bf16 scale per 128 weights of each "
                        "row and a bf16 bias (the sums stay fp64, so --from-sums can write fp32 maps again)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")


def load_model(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.devices import check_device, parse_dtype
    from rf_eval.fills import FILL_OFF
    from rf_eval.loading_report import check_loaded, recording_missing_keys

    device = check_device(args.device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    with recording_missing_keys():
        model = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=parse_dtype(args.dtype, device), trust_remote_code=args.trust_remote_code
        ).to(device)
    try:  # a fit on tensors transformers initialised at random would write maps of noise
        check_loaded(model, getattr(args, "fill", None) or FILL_OFF)
    except ValueError as err:
        raise UserError(f"--model {args.model}: {err}") from None
    return model.eval(), AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)


def init_distributed() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def check_inputs(args: argparse.Namespace) -> None:
    """What can be checked before a model loads: --out, --device, a local --model path, --splits against the
    model's config."""
    from rf_eval.devices import check_device, check_model_source

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {args.out} is a file; give a folder for the map files")
    folder = out.resolve().parent  # where the staging folder and --out are made: a file written there now
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise UserError(f"--out {args.out}: cannot write in {folder} ({err.strerror or err})") from None
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UserError(f"--out {args.out} is not empty; choose a new folder, or pass --overwrite to replace "
                        "the files of the same name in it")
    try:
        check_device(args.device)
        if args.model:
            check_model_source(args.model)
    except ValueError as err:
        raise UserError(f"--{'device' if 'device' in str(err).split(':')[0] else 'model'}: {err}") from None
    if args.model and args.splits:
        check_splits(args.model, args.splits)
    check_fill(args)
    if args.from_sums:
        if not args.lambdas:
            raise UserError("--from-sums needs --lambdas")
        check_sums(args.from_sums, args.model)


def check_fill(args: argparse.Namespace) -> None:
    """--fill names a fill method with maps to fit, for a model it can be fitted on (from its config)."""
    from rf_eval.fills.ridge import Ridge
    from rf_eval.ridgefill.fitting import fit_target

    args.fill = args.fill or Ridge.name
    if args.from_sums and args.fill != Ridge.name:
        raise UserError("--fill: --from-sums refits the fill its sums were captured for; leave --fill out")
    try:
        fit_target(args.fill)
    except ValueError as err:
        raise UserError(f"--fill: {err}") from None
    if args.model:
        from transformers import AutoConfig

        from rf_eval.fills import fill_method

        try:
            config = AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError):
            return
        from rf_eval.families import family_class_for

        try:  # the capture reads the layers through the model's family: none, and it cannot run
            family_class_for(config)
        except ValueError as err:
            raise UserError(f"--model {args.model}: {err}") from None
        try:
            fill_method(args.fill).check_fit(config)
        except ValueError as err:
            raise UserError(f"--fill {args.fill}: {err}") from None


def check_sums(folder: str, model: str | None) -> None:
    """--from-sums holds saved sums, captured from a model of --model's config (read from the file headers and
    the model's config; the weights fingerprint is compared once the weights load)."""
    from transformers import AutoConfig

    from rf_eval.ridge.maps import config_hash
    from rf_eval.tensor_files import read_metadata

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


def check_splits(model: str, splits: list[int]) -> None:
    """Each split in 1..L-1 of the model's L layers, read from its config (no weights); a config that cannot
    be read here is left to the model's own loading, which says why."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return
    from rf_eval.ridgefill.fitting import check_splits as in_range

    try:
        in_range(splits, config.get_text_config().num_hidden_layers)
    except ValueError as err:
        raise UserError(f"--splits: {err}") from None


def _staging(out: str) -> Path:
    final = Path(out)
    return final.parent / f".{final.name}.partial"


def _publish(result, out: str) -> None:
    """Move a complete fit from its staging folder into --out (rank 0; the others wrote nothing)."""
    from rf_eval.devices import rank_and_world

    staging, final = _staging(out), Path(out)
    if rank_and_world()[0] != 0 or not staging.is_dir():
        return
    final.mkdir(parents=True, exist_ok=True)
    for file in sorted(staging.iterdir()):
        os.replace(file, final / file.name)
    shutil.rmtree(staging, ignore_errors=True)
    result.paths = {split: final / Path(path).name for split, path in result.paths.items()}


def run(args: argparse.Namespace) -> int:
    from rf_eval.ridge.calibration import CalibrationError
    from rf_eval.ridge.fit_memory import parse_heldout_memory
    from rf_eval.ridgefill.fitting import fit_maps, refit_from_sums

    check_inputs(args)
    try:
        parse_heldout_memory(args.heldout_memory)
    except ValueError as err:
        raise UserError(f"--heldout-memory: {err}") from None
    staging = _staging(args.out)
    if int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a killed fit's leftovers
    try:
        if args.from_sums:
            model = tokenizer = None
            if args.model:
                model, tokenizer = load_model(args)
            result = refit_from_sums(args.from_sums, out=staging, lambdas=args.lambdas, model=model,
                                     tokenizer=tokenizer, heldout=args.heldout, max_tokens=args.max_tokens,
                                     progress=not args.no_progress, map_split=args.map_split,
                                     heldout_memory=args.heldout_memory, int8=args.int8)
        else:
            if not args.model or not args.splits:
                raise UserError("fit needs --model and --splits (or --from-sums)")
            from rf_eval.ridge.calibration import check_disjoint, check_nonempty
            from rf_eval.ridgefill.fitting import check_lambdas

            check_lambdas(args.lambdas, bool(args.heldout))  # fail before loading the model
            check_nonempty(args.calibration)
            if args.heldout:
                check_nonempty(args.heldout)
                check_disjoint(args.calibration, args.heldout)
            init_distributed()
            model, tokenizer = load_model(args)
            result = fit_maps(model, tokenizer, splits=args.splits, calibration=args.calibration,
                              heldout=args.heldout, lambdas=args.lambdas, out=staging,
                              max_tokens=args.max_tokens, progress=not args.no_progress,
                              map_split=args.map_split, sums_device=args.sums_device,
                              heldout_memory=args.heldout_memory, fill=args.fill, int8=args.int8)
    except (ValueError, CalibrationError) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(str(err)) from err
    except OSError as err:  # e.g. a hub id that cannot be fetched offline
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"--model {args.model}: {err}") from err
    _publish(result, args.out)
    if result.sums_device:
        print(f"sums: {result.sums_device}")
    for split, path in sorted(result.paths.items()):
        scores = result.scores[split]
        extra = f" (held-out cosine {scores[result.chosen[split]]:.4f})" if scores else ""
        print(f"split {split}: lambda {result.chosen[split]:g}{extra}, {result.rows} rows -> {path}")
    return 0
