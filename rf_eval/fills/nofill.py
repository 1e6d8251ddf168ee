"""`nofill`: filled rows are absent from the late layers (RidgeFill paper section 2.1, the no-fill control)."""

from __future__ import annotations

from rf_eval.fills.base import Fill


class NoFill(Fill):
    name = "nofill"
    summary = "filled rows are absent from late layers; exact rows attend to exact rows only"
    strategy = "absent"
    source = "RidgeFill §2.1, §3.3 (the compute-matched control)"
