"""Model families, chosen by the HF config's `model_type`."""

from __future__ import annotations

import importlib

from rf_eval.families.base import Family

# model_type -> "module:Class"; modules import lazily (each pulls in a transformers model file).
FAMILY_MODULES: dict[str, str] = {
    "llama": "rf_eval.families.llama:Llama",
    "qwen3": "rf_eval.families.qwen3:Qwen3",
    "mistral": "rf_eval.families.mistral:Mistral",
    "qwen3_5_text": "rf_eval.families.qwen3_5:Qwen3_5",
    "qwen3_5": "rf_eval.families.qwen3_5:Qwen3_5",
    "qwen3_next": "rf_eval.families.qwen3_next:Qwen3Next",
}


def family_for(config) -> Family:
    """The family object for a model config; a clear error for unsupported types."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILY_MODULES:
        raise ValueError(
            f"model_type {model_type!r} has no rf-eval family; supported: {', '.join(sorted(FAMILY_MODULES))}. "
            "Add one module under rf_eval/families/ (see README, 'Adding a model family')."
        )
    window = sliding_window(config)
    if window is not None:
        raise ValueError(
            f"this {model_type!r} model's attention uses a sliding window of {window} tokens; rf-eval's engine "
            "attends over the whole prefix, so its filled arms would not be this model: sliding-window layers "
            "are not supported (checkpoints with sliding_window null are)"
        )
    module, cls = FAMILY_MODULES[model_type].split(":")
    return getattr(importlib.import_module(module), cls)()


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


__all__ = ["FAMILY_MODULES", "Family", "family_for", "sliding_window"]
