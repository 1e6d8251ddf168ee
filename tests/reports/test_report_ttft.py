"""`rf-eval report --ttft FILE`: serving timings join the speed table."""

import json

import pytest

from rf_eval.cli import UserError
from rf_eval.reports.build import ttft_speed_rows


def test_ttft_rows_are_read_and_other_files_refused(tmp_path):
    row = {"arm": "fill=identity", "reference": "fill=exact", "length": 1024, "n": 5, "arm_seconds": 0.5,
           "ref_seconds": 0.8, "speedup": 1.6, "ceiling": 1.7, "share": 1.6 / 1.7, "timing": "client"}
    good = tmp_path / "ttft.json"
    good.write_text(json.dumps({"kind": "rf-eval-ttft", "version": 1, "speed": [row]}))
    assert ttft_speed_rows([str(good), str(good)]) == [{**row, "above_ceiling": False}] * 2
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(UserError, match="not an `rf-eval ttft` result"):
        ttft_speed_rows([str(bad)])
    with pytest.raises(UserError, match="missing.json"):
        ttft_speed_rows([str(tmp_path / "missing.json")])
