"""Typed, validated model_args for the rf-eval lm-eval adapters.

lm-eval hands an adapter its `--model_args` (a dict, values already typed by
`simple_parse_args_string`, or JSON) plus `batch_size`, `max_batch_size` and
`device` from its own flags. `parse_model_args` turns both into one frozen
dataclass, once, before any model is loaded: unknown keys, missing required
keys, values of the wrong type and contradictions are a `ModelArgsError` that
names the key and lists the valid ones. A new adapter (e.g. `rarecache`)
subclasses `ModelArgs` with its own fields and `check()`.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

FILLS = ("exact", "nofill", "identity", "ridge")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
REFERENCES = ("exact",)


class ModelArgsError(ValueError):
    """Bad model_args: the message names the key and the valid choices."""


@dataclass(frozen=True, kw_only=True)
class ModelArgs:
    """model_args every rf-eval adapter accepts (the `hf` model's names where they overlap)."""

    pretrained: str
    tokenizer: str | None = None
    device: str | None = None
    dtype: str = "auto"
    batch_size: int | str = 1
    max_batch_size: int | None = None  # as `hf`: the ceiling of batch_size=auto
    max_length: int | None = None
    seed: int | None = None
    trust_remote_code: bool = False
    add_bos_token: bool | None = None

    @classmethod
    def apply_defaults(cls, args: dict[str, Any]) -> dict[str, Any]:
        """Defaults that depend on other keys, applied before the required-key check."""
        return args

    def check(self) -> None:
        if self.dtype not in DTYPES:
            raise ModelArgsError(f"dtype={self.dtype!r} is not valid; valid dtypes: {', '.join(DTYPES)}")
        if isinstance(self.batch_size, str) and not _is_auto_batch(self.batch_size):
            raise ModelArgsError(f"batch_size={self.batch_size!r}: give an integer >= 1, 'auto' or 'auto:N'")
        if isinstance(self.batch_size, int) and self.batch_size < 1:
            raise ModelArgsError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_length is not None and self.max_length < 2:
            raise ModelArgsError(f"max_length must be >= 2, got {self.max_length}")

    @property
    def continuation_batch(self) -> int:
        """batch_size as a number ('auto' means 1: prompts are prefilled one at a time anyway)."""
        return self.batch_size if isinstance(self.batch_size, int) else 1


@dataclass(frozen=True, kw_only=True)
class RidgeFillConfig(ModelArgs):
    """model_args of `--model ridgefill`; see model_adapters/ridgefill.py."""

    fill: str
    maps: str | None = None
    split: int | None = None
    tail: int = 1024

    @classmethod
    def apply_defaults(cls, args: dict[str, Any]) -> dict[str, Any]:
        """`pretrained=demo`, or no pretrained: the embedded demo model (and its maps for fill=ridge)."""
        from rf_eval.demo import demo_defaults

        return demo_defaults(args)
    chunk_size: int | None = None
    reference: str | None = None
    # The engine's pluggable parts, as one-line specs (rf_eval.spec): passed to rf_eval.RidgeFill.
    selector: str | None = None  # e.g. attention(share=0.1), random(seed=3;of=attention), probe+special
    corrections: str | None = None  # e.g. value_rescale(c=512)+terminal_state(path=F)
    splice: str | None = None  # keys | values | both
    cost_match: str | None = None  # nofill control: ridge(tail=4096;exact_share=0.1)
    unigram: str | None = None  # unigram.safetensors for the protected-token selector

    def check(self) -> None:
        super().check()
        if self.fill not in FILLS:
            raise ModelArgsError(f"fill={self.fill!r} is not valid; valid fills: {', '.join(FILLS)}")
        if self.fill == "ridge" and self.maps is None:
            raise ModelArgsError("fill=ridge needs maps= (a folder or file written by `rf-eval fit`)")
        self._check_parts()
        if self.reference is not None and self.reference not in REFERENCES:
            raise ModelArgsError(f"reference={self.reference!r} is not valid; valid: {', '.join(REFERENCES)}")
        for name in ("tail", "split", "chunk_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ModelArgsError(f"{name} must be >= 1, got {value}")
        if self.maps is not None:
            self._check_maps()

    def _check_parts(self) -> None:
        """Selector, corrections, splice and cost match: parsed by the engine's own registries."""
        from rf_eval.arm import cost_match_from
        from rf_eval.corrections import SPLICES, corrections_from
        from rf_eval.selectors import selector_from

        for name, build in (("selector", selector_from), ("corrections", corrections_from),
                            ("cost_match", cost_match_from)):
            value = getattr(self, name)
            if value is not None:
                try:
                    build(value)
                except (ValueError, TypeError, OSError) as err:
                    raise ModelArgsError(f"{name}={value!r}: {err}") from err
        if self.splice is not None and self.splice not in SPLICES:
            raise ModelArgsError(f"splice={self.splice!r} is not valid; valid splices: {', '.join(SPLICES)}")
        if (self.corrections or self.splice) and self.fill not in ("identity", "ridge"):
            raise ModelArgsError(f"corrections and splice change filled rows: they need fill=identity or ridge, "
                                 f"not fill={self.fill}")
        if self.cost_match is not None and self.fill != "nofill":
            raise ModelArgsError(f"cost_match lengthens a nofill arm's tail: it needs fill=nofill, not fill={self.fill}")
        if self.unigram is not None and not Path(self.unigram).is_file():
            raise ModelArgsError(f"unigram={self.unigram!r}: no such file")

    def _check_maps(self) -> None:
        """The maps file exists, is readable, and agrees with `split` (metadata only, no tensors)."""
        from safetensors import safe_open

        from rf_eval.maps import MapError, resolve_map_file

        try:
            file = resolve_map_file(self.maps, self.split)
            with safe_open(str(file), framework="pt") as f:
                meta = f.metadata() or {}
        except MapError as err:
            raise ModelArgsError(f"maps={self.maps!r}: {err}") from err
        except Exception as err:  # safetensors raises several types for unreadable files
            raise ModelArgsError(f"maps={self.maps!r}: cannot read {err}") from err
        if "split" not in meta:
            raise ModelArgsError(f"maps={self.maps!r}: {file} is not an rf-eval map file (no split metadata)")
        if self.split is not None and int(meta["split"]) != self.split:
            raise ModelArgsError(f"split={self.split} contradicts the maps, fitted for split {meta['split']} ({file})")


C = TypeVar("C", bound=ModelArgs)


def parse_model_args(cls: type[C], model_args: dict[str, Any] | str | None, lm_eval_kwargs: dict | None = None) -> C:
    """Build and check `cls` from model_args and lm-eval's extra kwargs (model_args win on a clash)."""
    from lm_eval.utils import simple_parse_args_string

    args = simple_parse_args_string(model_args) if isinstance(model_args, str) else dict(model_args or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    valid = ", ".join(fields)
    unknown = [k for k in args if k not in fields]
    if unknown:
        raise ModelArgsError(f"unknown model_args key(s): {', '.join(map(repr, unknown))}; valid keys: {valid}")
    for key, value in (lm_eval_kwargs or {}).items():
        if value is None or key not in fields:
            continue
        if key in args and args[key] != value:
            log.warning("model_args %s=%r overrides lm-eval's --%s %r", key, args[key], key, value)
            continue
        args.setdefault(key, value)
    args = cls.apply_defaults(args)
    missing = [n for n, f in fields.items() if _required(f) and args.get(n) is None]
    if missing:
        raise ModelArgsError(f"missing required model_args key(s): {', '.join(missing)}; valid keys: {valid}")
    hints = typing.get_type_hints(cls)
    typed = {k: _coerce(k, v, hints[k]) for k, v in args.items()}
    config = cls(**typed)
    config.check()
    return config


def as_dict(config: ModelArgs) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _is_auto_batch(value: str) -> bool:
    head, _, tail = value.partition(":")
    return head == "auto" and (not tail or _is_number(tail))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` as one of the types in `hint` (int | str | None ...), or a ModelArgsError."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ModelArgsError(f"{key} may not be None")
    for kind in (bool, int, float, str):  # most specific first: bool is an int, anything is a str
        if kind not in options:
            continue
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                return int(value)
        elif kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str) and _is_number(value):
                return float(value)
        elif isinstance(value, (str, Path)):
            return str(value)
    names = " or ".join("None" if o is type(None) else o.__name__ for o in options)
    raise ModelArgsError(f"{key}={value!r} has the wrong type; expected {names}")
