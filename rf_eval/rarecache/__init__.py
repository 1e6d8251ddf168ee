"""RaReCache: cross-model KV-cache transfer with rank-disagreement selective recomputation.

The paper is `shared/seeds/002_54f3fbfe8c9ddaae.txt` (section 3; appendix A, B).
Modules: `features` (cache entries, RoPE undone/redone), `fit` (streaming
map fit), `maps` (the file format and pair checks), `transfer` (mapping and
the rank-disagreement score), `selectors`, `api` (`RaReCache`), `cost` (eq. 11).
Imports are lazy so that `import rf_eval.rarecache` stays cheap.
"""

from __future__ import annotations

__all__ = ["RaReCache", "TransferMaps", "fit_transfer", "load_transfer_maps"]


def __getattr__(name: str):
    if name == "RaReCache":
        from rf_eval.rarecache.api import RaReCache

        return RaReCache
    if name == "fit_transfer":
        from rf_eval.rarecache.fit import fit_transfer

        return fit_transfer
    if name in ("TransferMaps", "load_transfer_maps"):
        from rf_eval.rarecache import maps

        return getattr(maps, name)
    raise AttributeError(f"module 'rf_eval.rarecache' has no attribute {name!r}")
