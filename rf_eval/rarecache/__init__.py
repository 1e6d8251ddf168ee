"""RaReCache: cross-model KV-cache transfer with rank-disagreement selective recomputation.

The paper is `shared/seeds/002_54f3fbfe8c9ddaae.txt` (section 3; appendix A, B).
Modules: `features` (cache entries, RoPE undone/redone), `fit` (streaming
map fit), `maps` (the file format and pair checks), `transfer` (mapping and
the rank-disagreement score), `budget` (ceil(rho * T)), `method` (`RaReCache`), `cost` (eq. 11);
its row selectors are `rf_eval.selectors.mapped_cache`.
Imports are lazy so that `import rf_eval.rarecache` stays cheap.

Choices the paper leaves open (each also stated where it is made):

- Sides: a target key map reads source keys, a value map source values.
- R² (layer choice): in-sample, pooled over the d_t outputs (1 - SSE/SST of
  the whole entry), each single-source fit least squares as section 3.1
  says (minimum-norm where the Gram is singular); the top K (ties: lower layer) are concatenated in ascending layer order.
- Lambda is added to the centred Gram as eq. 1 writes it (not rescaled by
  its trace, unlike RidgeFill's maps).
- The basis: eigenvectors of W^T (X^T X) W / N, exactly the covariance of the
  calibration predictions, from the fit's sums (no second pass); r = min(rank, d_t).
- Stride: positions 0, s, 2s, ... of each calibration document.
- RoPE inverse: rotation by -theta, divided by the squared `attention_scaling`
  where it is not 1 (YaRN).
- Budget: ceil(rho * T) positions, exact for decimal rho, the last prompt row
  included (the engine needs it exact for the logits); at rho = 0 that row runs
  over the pure mapped cache like a first decoding step; rho = 1 is the plain
  target prefill. Layer-prefix: ceil(rho * L) layers.
- Selectors (`rf_eval.selectors.mapped_cache`): `source-attention` sums softmax weights from the last 32 prompt rows over
  heads and the last max(1, L // 4) layers (sink included); `random-positions` seeds from
  sha256(seed, prompt tokens); `oracle-l2` ranks by the relative error
  ||mapped - true||² / ||true||², keys and values of a layer together,
  averaged over layers (appendix C, figure 13; keys compared rotated).
- Pair checks: one token -> id vocabulary (sha256); both configs' hashes (the
  shape fields of `rf_eval.ridge.maps.config_hash`: two checkpoints of one
  architecture are not told apart).
- Eq. 11's P_T: decoder layers and final norm (no embedding lookup, and the
  prefill's LM head runs on the last row only).
"""

from __future__ import annotations

__all__ = ["RaReCache", "TransferMaps", "fit_transfer", "load_transfer_maps"]


def __getattr__(name: str):
    if name == "RaReCache":
        from rf_eval.rarecache.method import RaReCache

        return RaReCache
    if name == "fit_transfer":
        from rf_eval.rarecache.fit import fit_transfer

        return fit_transfer
    if name in ("TransferMaps", "load_transfer_maps"):
        from rf_eval.rarecache import maps

        return getattr(maps, name)
    raise AttributeError(f"module 'rf_eval.rarecache' has no attribute {name!r}")
