"""rf-eval: evaluate approximate prefill (RidgeFill, RaReCache) under lm-eval."""

from __future__ import annotations

from rf_eval.version import __version__

__all__ = ["RaReCache", "RidgeFill", "__version__"]


def __getattr__(name: str):
    # Lazy: `import rf_eval` must stay cheap (the lm-eval startup hook imports it).
    if name in ("RidgeFill", "RaReCache"):
        from rf_eval.methods import method_class

        return method_class(name.lower())
    raise AttributeError(f"module 'rf_eval' has no attribute {name!r}")
