"""reference=exact runs record the engine floor (paper sections 4.3, 9) in their results' `rf_eval`."""

from __future__ import annotations

import json

from adapter_helpers import lm

from rf_eval.model_adapters.run_records import FLOOR_PROBE_TOKENS


def test_reference_exact_records_the_engine_floor(tiny_model_dir):
    filled = lm(tiny_model_dir("qwen3_5"), fill="identity", tail=4, split=2, reference="exact")
    floor = filled.get_model_info()["rf_eval"]["engine_floor"]
    assert floor["bitwise"] is True and floor["max_abs"] == 0.0 and floor["kl"] == 0.0
    assert floor["probe_tokens"] == FLOOR_PROBE_TOKENS and floor["split"] == 2
    kernel = floor["filled_kernel"]
    assert 0 < kernel["max_abs"] <= 1e-5 and 0 <= kernel["kl"] <= 1e-10 and "is_causal" in kernel["why"]
    json.dumps(floor)
    # measured once, at start; the --use_cache fingerprint does not carry it
    assert "engine_floor" not in json.dumps(filled.arm_fingerprint())


def test_no_reference_no_floor(tiny_model_dir):
    plain = lm(tiny_model_dir("llama"), fill="identity", tail=4)
    assert plain.engine_floor is None and "engine_floor" not in plain.get_model_info()["rf_eval"]
