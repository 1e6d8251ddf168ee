"""`rf-eval fit-state-correction`: Delta-M for the terminal-state correction (paper 2.3, appendix H).

Runs the unmodified model over calibration prompts kept apart from the maps'
text, reads each late Gated DeltaNet layer's state every `--every` (2,048)
tokens from the true inputs and from the fill's predicted inputs, and saves
the mean difference per layer and value head beside `--out`. The file
records the model, split, fill, maps and `--map-split` it was fitted for; `RidgeFill(...,
corrections="terminal_state(path=FILE)")` refuses any other combination. An `--out FILE.safetensors` that
exists is replaced only with `--overwrite` (refused before the model loads).
"""

from __future__ import annotations

import argparse

from rf_eval.cli import UserError
from rf_eval.cli.values import positive_int
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT
from rf_eval.files.outputs import check_output
from rf_eval.fills import fill_named, predicting_fills
from rf_eval.fills.ridge import Ridge
from rf_eval.integrity.hashing import sha256_of_files
from rf_eval.ridge.calibration import CalibrationError, check_nonempty, tokenized
from rf_eval.ridge.maps import load_maps
from rf_eval.ridge.state_correction import fit_delta, save_table, table_metadata
from rf_eval.ridgefill.fit_run import load_fit_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF model folder or id")

    p.add_argument("--maps", help="maps folder or file (for a fill that reads maps); omit for one that does not")
    p.add_argument("--fill", default=Ridge.name, choices=predicting_fills(), help="the fill the arm uses")
    p.add_argument("--split", type=positive_int, help="split layer (default: the maps' split)")
    p.add_argument("--calibration", nargs="+", required=True,
                   help="prompts kept apart from the maps' calibration text (text files or JSONL 'text')")
    p.add_argument("--out", required=True, help="output folder (or .safetensors file)")
    p.add_argument("--overwrite", action="store_true", help="replace the .safetensors file --out names")
    p.add_argument("--every", type=positive_int, default=2048, help="read the state every this many tokens")
    p.add_argument("--max-tokens", type=positive_int, default=131072, help="truncate prompts to this many tokens")
    p.add_argument("--map-split", dest="map_split", action=argparse.BooleanOptionalAction,
                   default=DEFAULT_MAP_SPLIT,
                   help="the arm's layer S reads its own map (as the arm's map_split; default: no, it reads x_S)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.every < 1:
        raise UserError("--every must be >= 1")
    if str(args.out).endswith(".safetensors"):  # a file the user names: never replaced unasked (`rf_eval.files.outputs`)
        check_output("--out", args.out, overwrite=args.overwrite)

    method = fill_named(args.fill)
    if method.needs_maps and not args.maps:
        raise UserError(f"--fill {args.fill} needs --maps")
    if not method.needs_maps and args.split is None:
        raise UserError(f"--fill {args.fill} needs --split")
    try:
        check_nonempty(args.calibration)
        model, tokenizer = load_fit_model(args.model, device=args.device, dtype=args.dtype, fill=args.fill)
        maps = load_maps(args.maps, args.split) if args.maps else None
        if maps is not None:
            maps.check_model(model.config)
        split = maps.split if maps is not None else args.split
        param = next(model.parameters())
        fill = method.bind(model, maps)
        docs = tokenized(tokenizer, args.calibration, param.device, args.max_tokens, "state correction",
                         not args.no_progress)
        delta, states = fit_delta(model, docs, split, fill, every=args.every, map_split=args.map_split)
    except (ValueError, CalibrationError) as err:
        raise UserError(str(err)) from err
    meta = table_metadata(model, args.fill, maps.sha256() if maps is not None else "", args.every, states,
                          sha256_of_files(args.calibration), args.map_split)
    path = save_table(delta, meta, args.out, split)
    print(f"split {split}: Delta-M for {len(delta)} Gated DeltaNet layers from {states} states -> {path}")
    return 0
