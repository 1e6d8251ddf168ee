"""`identity`: every late layer's filled rows read the split state x_S itself (RidgeFill paper section 2.1)."""

from __future__ import annotations

from typing import Any

import torch

from rf_eval.fills.base import Fill
from rf_eval.ridge.maps import identity_fill


class Identity(Fill):
    name = "identity"
    summary = "late layers' filled rows read x_S as their input, through the layers' own projections"
    source = "RidgeFill §2.1 (the identity fill)"

    def fill_fn(self, maps: Any, dtype: torch.dtype, device: torch.device) -> Any:
        return identity_fill
