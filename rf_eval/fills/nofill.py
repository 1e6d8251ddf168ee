"""`nofill`: filled rows are absent from the late layers (RidgeFill paper section 2.1, the no-fill control)."""

from __future__ import annotations

from typing import Any

from rf_eval.fills.base import FillMethod


class NoFill(FillMethod):
    name = "nofill"
    summary = "filled rows are absent from late layers; exact rows attend to exact rows only"
    strategy = "absent"
    source = "RidgeFill §2.1, §3.3 (the compute-matched control)"

    def check(self, model_config: Any, maps: Any) -> None:
        from rf_eval.families import sliding_window
        from rf_eval.fields import ArmError

        if sliding_window(model_config) is not None:
            raise ArmError(f"fill={self.name} leaves late layers with fewer rows than the prompt, which this "
                           "model's sliding-window layers cannot decode from (their masks assume every row); "
                           "use a fill, or a longer tail (tail >= the prompt) for the exact arm")
