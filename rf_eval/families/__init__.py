"""Model families, found by themselves and chosen by the HF config's `model_type`.

Every module of this package except `base` (and names starting with `_`) is
one family, named after its module (`qwen3_5`), and defines one `Family`
subclass that describes itself (see `rf_eval.families.base`). Nothing lists
the families: `registered_families()` reads the package's folders, so a new
family is one new module.

Folders named in the environment variable `RF_EVAL_FAMILY_PATH` (separated
like PATH) are searched too, read once when this package is first imported:
their modules import as `rf_eval.families.<name>`. This is how a family is
tried out, or tested, without writing into the installed package. Installed
packages add families through the `rf_eval.families` entry-point group (the
entry point's name is the family's), and `register_family` adds one at run
time: the one plug-in pattern of `rf_eval.plugins`.

Family modules import only when needed (each pulls in a `transformers`
modeling file): `registered_families()` imports none, `family_class(name)`
one, and the first `family_for(config)` all of them, to map model types.
"""

from __future__ import annotations

from functools import cache

from rf_eval.errors import UserError
from rf_eval.families.base import Family, execution_device
from rf_eval.files.checkpoints import register_checkpoint_types
from rf_eval.plugins import Discovery, Registry

FAMILY_PATH_ENV = "RF_EVAL_FAMILY_PATH"
ENTRY_POINTS = "rf_eval.families"
#: every family by name (`rf_eval.plugins.Registry`; a family's module names it and is imported when looked up)
FAMILIES: Registry[Family] = Registry("family", Family, __name__,
                                      Discovery(env=FAMILY_PATH_ENV, group=ENTRY_POINTS, marker="model_types",
                                                by_module=True))


def registered_families() -> tuple[str, ...]:
    """The names of every family (its module's name), sorted; imports no family module."""
    return tuple(sorted(FAMILIES))


def family_class(name: str) -> type[Family]:
    """The `Family` subclass that the module `rf_eval.families.<name>` defines."""
    if name not in FAMILIES:
        raise UserError(f"unknown family {name!r}; valid families: {', '.join(registered_families())}")
    return FAMILIES[name]


def register_family(cls: type[Family], name: str) -> type[Family]:
    """Add a family class at run time under `name` (a test's, a notebook's). Returns `cls`."""
    return FAMILIES.register(cls, name)


def unregister_family(name: str) -> None:
    """Remove a family `register_family` added."""
    FAMILIES.unregister(name)


@cache
def _model_types(version: object) -> dict[str, str]:
    families: dict[str, str] = {}
    for name in registered_families():
        for model_type in family_class(name).model_types:
            if model_type in families:
                raise ValueError(f"model_type {model_type!r} is claimed by families {families[model_type]!r} "
                                 f"and {name!r}")
            families[model_type] = name
    return families


def supported_model_types() -> dict[str, str]:
    """Every supported `model_type` -> the name of the family that serves it (imports every family)."""
    return dict(_model_types(FAMILIES.version()))


def family_class_for(config) -> type[Family]:
    """The family class of a config's `model_type`; a clear error for unsupported types."""
    model_type = getattr(config, "model_type", None)
    families = _model_types(FAMILIES.version())
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


def attention_shape(config) -> tuple[int, int, int]:
    """(query heads, key-value heads, head dim) of a config's attention layers."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(config, "head_dim", None) or config.hidden_size // heads


__all__ = [
    "FAMILIES", "FAMILY_PATH_ENV", "Family", "attention_shape", "execution_device", "family_class",
    "family_class_for", "family_for",
    "register_family", "registered_families", "sliding_window", "supported_model_types", "unregister_family",
]  # fmt: skip


def _register_checkpoint_types() -> None:
    """Checkpoint layouts `transformers` lacks, read with its own classes (`rf_eval.files.checkpoints`), registered
    with `AutoConfig` wherever a model is loaded: everything that loads one imports this package first."""

    register_checkpoint_types()


_register_checkpoint_types()
