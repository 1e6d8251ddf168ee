"""`rf-eval convert-projector`: a released RidgeFill projector folder as an rf-eval map file.

The layout it reads is stated in `rf_eval.ridgefill.release_maps`. Only the model's config is read (no
weights): the map file records its config hash, so `maps=OUT` is refused on any other model. Released
projectors carry no rf-eval weights fingerprint; the arm says it cannot check which weights they were
fitted on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rf_eval.cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="the released projector folder (ridgefill.json and one file per late layer)")
    p.add_argument("--model", required=True, help="the model the projector was released for: HF id or local folder")
    p.add_argument("--revision", default=None, help="the model's hub revision (as lm-eval's revision=)")
    p.add_argument("--out", required=True, help="folder for ridgefill_split{S}.safetensors (created if new)")
    p.add_argument("--overwrite", action="store_true", help="replace a map file of the same split in --out")
    p.add_argument("--trust-remote-code", action="store_true")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from rf_eval.ridge.maps import MapError, map_filename
    from rf_eval.ridgefill.release_maps import convert_release, read_manifest

    try:
        split = read_manifest(args.folder)["split"]
    except MapError as err:
        raise UserError(str(err)) from None
    target = Path(args.out) / map_filename(split)
    if Path(args.out).is_file():
        raise UserError(f"--out {args.out} is a file; give a folder")
    if target.exists() and not args.overwrite:
        raise UserError(f"--out already holds {target.name}; pass --overwrite to replace it, or another --out")
    try:
        config = AutoConfig.from_pretrained(args.model, revision=args.revision,
                                            trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as err:  # e.g. a hub id offline
        raise UserError(f"--model {args.model}: cannot read its config ({err}); offline, give the model's "
                        "local folder") from None
    try:
        maps = convert_release(args.folder, config, args.out)
    except MapError as err:
        raise UserError(str(err)) from None
    storage = maps.metadata["storage"]
    print(f"split {maps.split}: layers {maps.layers[0]}..{maps.layers[-1]} ({storage}) -> {maps.path}")
    return 0
