"""Model families, found by themselves and chosen by the HF config's `model_type`.

Every module of this package except `base` (and names starting with `_`) is
one family, named after its module (`qwen3_5`), and defines one `Family`
subclass that describes itself (see `rf_eval.families.base`). Nothing lists
the families: `registered_families()` reads the package's folders, so a new
family is one new module.

Folders named in the environment variable `RF_EVAL_FAMILY_PATH` (separated
like PATH) are searched too, read once when this package is first imported:
their modules import as `rf_eval.families.<name>`. This is how a family is
tried out, or tested, without writing into the installed package.

Family modules import only when needed (each pulls in a `transformers`
modeling file): `registered_families()` imports none, `family_class(name)`
one, and the first `family_for(config)` all of them, to map model types.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from functools import cache

from rf_eval.errors import UserError
from rf_eval.families.base import Family, execution_device

FAMILY_PATH_ENV = "RF_EVAL_FAMILY_PATH"
_NOT_FAMILIES = frozenset({"base"})

__path__ = [*__path__, *(p for p in os.environ.get(FAMILY_PATH_ENV, "").split(os.pathsep) if p)]


@cache
def _scan(path: tuple[str, ...]) -> tuple[str, ...]:
    where: dict[str, str] = {}
    for folder in path:
        for info in pkgutil.iter_modules([folder]):
            if info.name.startswith("_") or info.name in _NOT_FAMILIES:
                continue
            if info.name in where:
                raise ValueError(f"family {info.name!r} is defined twice: in {where[info.name]} and in {folder}")
            where[info.name] = folder
    return tuple(sorted(where))


def registered_families() -> tuple[str, ...]:
    """The names of every family (its module's name), sorted; imports no family module."""
    return _scan(tuple(__path__))


def family_class(name: str) -> type[Family]:
    """The `Family` subclass that the module `rf_eval.families.<name>` defines."""
    if name not in registered_families():
        raise UserError(f"unknown family {name!r}; valid families: {', '.join(registered_families())}")
    module = importlib.import_module(f"{__name__}.{name}")
    found = [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Family) and value.__module__ == module.__name__
        and value.model_types
    ]  # fmt: skip
    if len(found) != 1:
        raise TypeError(
            f"family module {module.__name__} must define exactly one Family subclass that sets model_types; "
            f"it defines {[cls.__name__ for cls in found]}"
        )
    return found[0]


@cache
def _model_types(path: tuple[str, ...]) -> dict[str, str]:
    families: dict[str, str] = {}
    for name in _scan(path):
        for model_type in family_class(name).model_types:
            if model_type in families:
                raise ValueError(f"model_type {model_type!r} is claimed by families {families[model_type]!r} "
                                 f"and {name!r}")
            families[model_type] = name
    return families


def supported_model_types() -> dict[str, str]:
    """Every supported `model_type` -> the name of the family that serves it (imports every family)."""
    return dict(_model_types(tuple(__path__)))


def family_class_for(config) -> type[Family]:
    """The family class of a config's `model_type`; a clear error for unsupported types."""
    model_type = getattr(config, "model_type", None)
    families = _model_types(tuple(__path__))
    if model_type not in families:
        raise UserError(
            f"model_type {model_type!r} has no rf-eval family; supported: {', '.join(sorted(families))}. "
            "Add one module under rf_eval/families/ (see README, 'Adding a model family')."
        )
    return family_class(families[model_type])


def family_for(config) -> Family:
    """The family object for a model config; a clear error for unsupported types.

    Sliding-window layers are served: the engine's exact rows attend inside
    each layer's window (`Family.sliding_window`) and the cache is the model's
    own (`DynamicSlidingWindowLayer` where the config says so).
    """
    cls = family_class_for(config)
    cls.check_config(config)
    return cls()


def sliding_window(config) -> int | None:
    """The window of a config whose attention layers slide over fewer rows than its context, else None.

    Qwen3 keeps `sliding_window` None unless `use_sliding_window`; Mistral-style
    configs set it directly; hybrid configs name `sliding_attention` layers.
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or []
    if window is None or (types and "sliding_attention" not in types):
        return None
    limit = getattr(config, "max_position_embeddings", None)
    return None if limit is not None and window >= limit else int(window)


__all__ = [
    "FAMILY_PATH_ENV", "Family", "execution_device", "family_class", "family_class_for", "family_for",
    "registered_families", "sliding_window", "supported_model_types",
]  # fmt: skip


def _register_checkpoint_types() -> None:
    """Checkpoint layouts `transformers` lacks, read with its own classes (`rf_eval.checkpoints`), registered
    with `AutoConfig` wherever a model is loaded: everything that loads one imports this package first."""
    from rf_eval.checkpoints import register_checkpoint_types

    register_checkpoint_types()


_register_checkpoint_types()
