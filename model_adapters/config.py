"""model_args of the rf-eval lm-eval adapter: the method's keys, checked once; every other key is `hf`'s.

The adapter is an `HFLM` subclass, so every key lm-eval's `hf` model takes
(`revision`, `dtype`, `parallelize`, `device_map`, `peft`, `enable_thinking`,
`chat_template_args`, `think_end_token`, ...; and, as for `hf`, any other key
is passed on to `from_pretrained`) works as it does for `--model hf`.
`parse_model_args` finds the method (`method=`, else the lm-eval name's
default), takes out its keys (`ADAPTER_KEYS`: `pretrained`, `method`,
`reference`, `paired_timing`, `seed`, `name`, the arm's name in reports, a label; what the method
`loads`; its arm's fields), refuses a key that looks like a typo of a known one
or belongs to another method, and has the method check its arm against the
model's config and tokenizer (`Method.prepare`), all before anything loads.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rf_eval.demo.model import names_demo
from rf_eval.demo.study import demo_defaults
from rf_eval.devices import check_device, check_model_source
from rf_eval.errors import UserError
from rf_eval.families import family_class_for
from rf_eval.fields import ArmError, close_to
from rf_eval.methods import METHODS, Method, ModelSource, chosen_method
from rf_eval.methods.source import REMOTE_KEYS

log = logging.getLogger(__name__)

REFERENCES = ("exact",)


class ModelArgsError(ArmError):
    """Bad model_args: the message names the key and the valid choices."""


@functools.cache
def hf_keys() -> tuple[str, ...]:
    """The keyword arguments of lm-eval's `HFLM` (the `hf` model)."""
    from lm_eval.models.huggingface import HFLM

    params = inspect.signature(HFLM.__init__).parameters
    return tuple(p for p, v in params.items() if p != "self" and v.kind is not inspect.Parameter.VAR_KEYWORD)


def merge_lm_eval_flags(args: dict[str, Any], flags: dict[str, Any] | None) -> dict[str, Any]:
    """model_args plus lm-eval's `--batch_size` / `--device` flags (model_args win, with a warning). A device
    named in model_args must exist here (`hf` would run on the CPU instead); lm-eval's `--device` flag,
    whose default is cuda:0, keeps `hf`'s fallback to the CPU."""
    if args.get("device") is not None and not args.get("parallelize"):
        try:
            check_device(str(args["device"]))
        except ValueError as err:
            raise ModelArgsError(f"device={args['device']!r}: {err}") from None
    out = dict(args)
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key in out and out[key] != value:
            log.warning("model_args %s=%r overrides lm-eval's --%s %r", key, out[key], key, value)
            continue
        out[key] = value
    return out


#: the adapter's own keys beside a method's `loads` and arm fields
ADAPTER_KEYS = ("pretrained", "method", "reference", "paired_timing", "seed", "name")


def method_keys(cls: type[Method]) -> tuple[str, ...]:
    """Every model_args key a run of method `cls` reads itself (the rest are `hf`'s)."""
    return tuple(dict.fromkeys((*ADAPTER_KEYS, *cls.loads, *cls.arm_fields())))


def split_model_args(args: dict[str, Any], cls: type[Method]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the method's keys, the keys for `HFLM`); a near-miss of a known key, or a key only another method takes
    (a RaReCache `rho` in a RidgeFill run), is a ModelArgsError."""
    own = method_keys(cls)
    known = own + hf_keys()
    mine, hf = {}, {}
    for key, value in args.items():
        if key in own:
            mine[key] = value
            continue
        theirs = sorted(name for name in METHODS if key in method_keys(METHODS[name]) and key not in known)
        if theirs:
            raise ModelArgsError(f"model_args {key}={value!r} is a key of method={' or '.join(theirs)}, not of "
                                 f"method={cls.name}; its keys: {', '.join(own)} (and every key of lm-eval's `hf` "
                                 "model)")
        near = close_to(key, known) if key not in known else None
        if near is not None:
            raise ModelArgsError(
                f"unknown model_args key(s): {key!r} (did you mean {near!r}?); rf-eval keys: {', '.join(own)}; "
                "every key of lm-eval's `hf` model is accepted too"
            )
        hf[key] = value  # as for `hf`: its own keys, or keyword arguments of from_pretrained
    return mine, hf


@functools.cache
def from_pretrained_keys() -> frozenset[str] | None:
    """The keyword arguments transformers' `from_pretrained` takes itself: its parameters and every name its
    source quotes (what it pops from **kwargs, singly or from a list of names it drops; read from the
    source, so any transformers version answers, erring towards taking a key); None where its source
    cannot be read (then no key is refused for being unknown)."""
    import re

    from transformers import PreTrainedModel

    method = PreTrainedModel.from_pretrained
    try:
        quoted = re.findall(r"[\"'](\w+)[\"']", inspect.getsource(method))
    except (OSError, TypeError):
        return None
    return frozenset([*inspect.signature(method).parameters, *quoted])


def check_unknown_hf_keys(hf: dict[str, Any], config: Any) -> None:
    """Refuse, before any weights load, a key that neither `HFLM`, `from_pretrained` nor the model's config
    takes: transformers would pass it to the model's `__init__`, which fails with a TypeError after the
    config and the model class are built (`hf` ends there in a traceback)."""
    taken = from_pretrained_keys()
    if taken is None:
        return
    unknown = [k for k in hf if k not in taken and k not in hf_keys() and not hasattr(config, k)]
    if unknown:
        import difflib

        pool = sorted({*taken, *hf_keys(), *config.to_dict()} - {k for k in taken if k.startswith("_")})
        close = difflib.get_close_matches(unknown[0], pool, n=3)
        raise ModelArgsError(
            f"model_args key(s) {', '.join(map(repr, unknown))} are taken by neither lm-eval's hf model, "
            f"transformers' from_pretrained nor {type(config).__name__}"
            + (f" (closest: {', '.join(close)})" if close else "") + "; remove or correct them")


def check_hf_args(hf: dict[str, Any]) -> dict[str, Any]:
    """The `hf` keys whose bad values `HFLM` would only find after loading: refused now, as `hf` would refuse them."""
    dtype = hf.get("dtype")
    named = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if dtype is not None and dtype != "auto" and not (isinstance(named, torch.dtype) and named.is_floating_point):
        raise ModelArgsError(f"dtype={dtype!r} is not valid: the weights need a floating-point dtype; valid: auto, "
                             "float32, bfloat16, float16 (and torch's other float dtypes)")
    batch = hf.get("batch_size")
    if batch is not None:
        head, _, tail = str(batch).partition(":")
        ok = (head == "auto" and (not tail or tail.replace(".", "", 1).isdigit())) or str(batch).isdigit()
        if not ok or str(batch) == "0":
            raise ModelArgsError(f"batch_size={batch!r}: give an integer >= 1, 'auto' or 'auto:N'")
    if hf.get("max_length") is not None and int(hf["max_length"]) < 2:
        raise ModelArgsError(f"max_length must be >= 2, got {hf['max_length']}")
    gen = hf.get("max_gen_toks")
    if gen is not None and (not str(gen).isdigit() or int(gen) < 1):  # transformers fails on 0, after the load
        raise ModelArgsError(f"max_gen_toks={gen!r}: give an integer >= 1 (the generated tokens per request)")
    out = dict(hf)
    if out.get("device") is None and not out.get("parallelize"):
        # `hf` defaults to cuda; on a machine without one, the CPU (where `hf` would stop at the first request)
        out["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return out


def check_reference(value: Any) -> None:
    if value is not None and value not in REFERENCES:
        raise ModelArgsError(f"reference={value!r} is not valid; valid: {', '.join(REFERENCES)}")


def paired_timing(mine: dict[str, Any]) -> bool:
    """Whether a `reference=exact` run times the exact prefill of each scored prompt beside the arm's (the
    measured speedup paired in time, #55 item 6): on unless `paired_timing=false`, which leaves the reference's
    scores as they are and saves one exact prefill per prompt (a quality study's, whose speed is measured
    elsewhere); the report then times the arm against the exact arm's own prefills, unpaired."""
    value = mine.get("paired_timing")
    if value is None:
        return True
    flag = {"true": True, "false": False}.get(str(value).strip().lower())
    if flag is None:
        raise ModelArgsError(f"paired_timing={value!r} is not valid; valid: true, false")
    if mine.get("reference") != "exact":
        raise ModelArgsError(f"paired_timing={value!r} times the reference=exact pass; give reference=exact, "
                             "or leave paired_timing out")
    return flag


def model_config(pretrained: str, hf: dict[str, Any]):
    """The checkpoint's config (no weights), loaded as `hf` loads it; a clear error when it cannot be found,
    its family is not rf-eval's, its tokenizer does not load, or a key nothing takes is given
    (`check_unknown_hf_keys`)."""
    from transformers import AutoConfig

    remote = {k: hf[k] for k in REMOTE_KEYS if hf.get(k) is not None}
    if not str(pretrained).strip():
        raise ModelArgsError("pretrained='' names no model; give pretrained=<hub id or local folder>")
    try:
        check_model_source(pretrained)
    except ValueError as err:
        raise ModelArgsError(f"pretrained={pretrained!r}: {err}") from None
    try:
        config = AutoConfig.from_pretrained(pretrained, **remote)
    except (OSError, ValueError) as err:  # no config.json, or one without a model type transformers knows
        raise ModelArgsError(f"pretrained={pretrained!r}: {' '.join(str(err).split())}") from None

    try:  # every rf-eval model reads the layers through the model's family
        family_class_for(config)
    except ValueError as err:
        raise ModelArgsError(f"pretrained={pretrained!r}: {err}") from None
    check_unknown_hf_keys(hf, config)
    check_tokenizer(pretrained, hf, remote)
    return config


def check_tokenizer(pretrained: str, hf: dict[str, Any], remote: dict[str, Any]) -> None:
    """The run's tokenizer (`tokenizer=`, else the model's own) loads, before any weights do: a folder without
    tokenizer files otherwise fails in transformers after the model is built."""
    from transformers import AutoTokenizer

    name = hf.get("tokenizer") if isinstance(hf.get("tokenizer"), str) else pretrained
    try:
        AutoTokenizer.from_pretrained(name, **remote)
    except (OSError, ValueError, TypeError) as err:
        what = f"tokenizer={name!r}" if name != pretrained else f"pretrained={pretrained!r}"
        raise ModelArgsError(f"{what}: its tokenizer does not load ({' '.join(str(err).split())[:300]}); give "
                             "tokenizer=<a folder or hub id with tokenizer files> in model_args") from None


def required(values: dict[str, Any], names: Iterable[str], own: Iterable[str]) -> None:
    missing = [n for n in names if values.get(n) is None]
    if missing:
        raise ModelArgsError(f"missing required model_args key(s): {', '.join(missing)}; "
                             f"rf-eval keys: {', '.join(own)}")


@dataclass(frozen=True)
class RunSettings:
    """A run's model_args as the adapter runs them, resolved once before any weights load: the method, its
    arm (checked against the model's config and tokenizer: `Method.prepare`), what the method read then
    (`parts`: maps), where the model comes from, and the adapter's own keys."""

    method: type[Method]
    arm: Any
    parts: dict[str, Any]
    source: ModelSource
    reference: str | None = None
    seed: int | None = None  # sampled generation: a torch seed from (seed, prompt tokens) per request
    demo: bool = False  # the embedded demo model (no pretrained, or pretrained=demo)
    paired_timing: bool = True  # with reference=exact: each scored prompt's exact prefill timed beside the arm's

    @property
    def pretrained(self) -> str:
        return self.source.pretrained


def own_args(args: dict[str, Any], model: str, *, demo: bool = True
             ) -> tuple[type[Method], dict[str, Any], dict[str, Any]]:
    """(the method a run of the lm-eval model `model` runs, its own keys, the checked `hf` keys): the method
    found (`rf_eval.methods.chosen_method`), the embedded demo model's defaults applied where `pretrained` is
    missing or `demo` (`demo`), the keys split and the required ones present."""
    try:
        cls, args = chosen_method(args, model)
    except UserError as err:
        raise ModelArgsError(str(err)) from None
    args = {k: v for k, v in args.items() if v is not None}
    if demo and names_demo(args.get("pretrained")):
        args = demo_defaults(cls, args)
    mine, hf = split_model_args(args, cls)
    required(mine, ("pretrained", *cls.missing_fields(mine)), method_keys(cls))
    check_reference(mine.get("reference"))
    paired_timing(mine)
    seed = mine.get("seed")
    if seed is not None and not str(seed).lstrip("-").isdigit():
        raise ModelArgsError(f"seed={seed!r} is not an integer")
    return cls, mine, check_hf_args(hf)


def arm_of(cls: type[Method], mine: dict[str, Any], what: str = "model_args") -> Any:
    """The method's arm of a run's own keys, parsed once."""
    try:
        return cls.parse_arm({k: v for k, v in mine.items() if k in cls.arm_fields()}, what=what)
    except UserError as err:
        raise ModelArgsError(f"method={cls.name}: {err}") from err


def parse_model_args(args: dict[str, Any], model: str = "prefill") -> tuple[RunSettings, dict[str, Any]]:
    """(settings, HFLM keyword arguments) of `--model MODEL --model_args ...`: every check that needs no
    weights, each once."""
    demo = names_demo(args.get("pretrained"))
    cls, mine, hf = own_args(args, model)
    arm = arm_of(cls, mine)
    config = model_config(mine["pretrained"], hf)
    tokenizer = hf.get("tokenizer") if isinstance(hf.get("tokenizer"), str) else str(mine["pretrained"])
    remote = {k: hf[k] for k in REMOTE_KEYS if hf.get(k) is not None}
    files = {k: str(mine[k]) for k in cls.loads if mine.get(k) is not None}
    source = ModelSource(str(mine["pretrained"]), config, tokenizer, remote, files)
    try:
        arm, parts = cls.prepare(arm, source)
    except UserError as err:
        raise ModelArgsError(f"method={cls.name}: {err}") from err
    seed = None if mine.get("seed") is None else int(mine["seed"])
    return RunSettings(cls, arm, parts, source, mine.get("reference"), seed, demo, paired_timing(mine)), hf


def preflight(args: dict[str, Any], model: str) -> Any:
    """The arm of a study arm's model_args, checked as far as can be before a study runs (keys, method, arm;
    a ModelArgsError naming a bad value), without reading what the method loads: a study's `fit:` block may
    write its maps later."""
    cls, mine, _ = own_args(args, model, demo=False)
    return arm_of(cls, mine, what="args")
