"""`rf-eval ttft`: the paper's protocol (warm-up, alternating timed requests, medians, ratio of medians) on one server."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from rf_eval.cli import main
from rf_eval.cost.mac_model import ceiling_r

# Same-arm tolerance. The ratio of two medians of the same arm measures only noise. On the 2-core
# machines this project runs on, other jobs often oversubscribe the cores several times over (load
# average 10 was seen while writing this test); a 1-thread server then still sees scheduling stalls of
# tens of milliseconds against ~50-100 ms prompts. Over repeated runs at that load, same-arm ratios
# ranged from 0.93 to 1.45 with 5 requests per arm. On a faster 2-core machine (~30 ms prompts) beside
# the floors job of .ci/run, 4 of 7 requests of one arm stalled (ratio 1.61), so the test times 15
# alternating requests per arm: the median absorbs up to 7 stalled requests of either arm, and a
# factor of 1.6 either way is the bound. It still catches what the protocol must prevent: a cold first
# request (no warm-up) or an order effect, each of which shows up as a factor of 2 or more on this model.
SAME_ARM_TOLERANCE = 1.6


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    rng = random.Random(7)
    words = "harbor ledger signal copper meadow lantern orchard window candle thunder bridge canvas".split()
    path = tmp_path_factory.mktemp("ttft") / "prompt.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(400)))  # ~2,800 byte-level tokens
    return path


def run_ttft(server, prompt_file, out, *args):
    code = main(["ttft", "--base-url", server.url + "/v1", "--prompt", str(prompt_file), "--out", str(out), "--quiet",
                 *args])
    assert code == 0
    return json.loads(out.read_text())


def test_two_arms_medians_and_their_ratio(exact_server, prompt_file, tmp_path, capsys):
    result = run_ttft(exact_server, prompt_file, tmp_path / "ttft.json", "--arm-b", '{"fill": "identity", "tail": 64}',
                      "--lengths", "256", "1024", "--repeats", "3", "--warmup", "1")
    assert result["arms"] == {"a": "fill=exact", "b": "fill=identity,tail=64"}
    assert [row["length"] for row in result["lengths"]] == [256, 1024]
    for row in result["lengths"]:
        for side in "ab":
            times = row[side]["client_seconds"]
            assert len(times) == 3 and all(t > 0 for t in times)
            assert row[side]["median_client_seconds"] == statistics.median(times)
            assert row[side]["median_server_seconds"] == statistics.median(row[side]["server_seconds"])
        assert row["speedup_client"] == row["a"]["median_client_seconds"] / row["b"]["median_client_seconds"]
        assert row["speedup_server"] == row["a"]["median_server_seconds"] / row["b"]["median_server_seconds"]
        assert row["b"]["server_arm"] == {"method": "ridgefill", "fill": "identity", "tail": 64, "split": 3, "map_split": False, "layers": 6}
        assert (row["L"], row["S"], row["T"], row["N"]) == (6, 3, 64, row["length"])
        assert row["ceiling"] == pytest.approx(1 / ceiling_r(6, 3, 64, row["length"]))
    (speed_256, speed_1024) = result["speed"]
    assert speed_1024["arm"] == "fill=identity,tail=64" and speed_1024["timing"] == "client"
    assert speed_1024["speedup"] == result["lengths"][1]["speedup_client"]
    assert speed_1024["share"] == pytest.approx(speed_1024["speedup"] / speed_1024["ceiling"])
    from rf_eval.reports.charts import speed_chart  # the speed rows have the shape the report's chart takes

    assert len(speed_chart(result["speed"])["bars"]) == 2
    # as the server saw it, per length: a warm-up of each arm, then 3 timed requests of each, alternating
    arms = [r["arm"]["fill"] for r in exact_server.records() if r.get("stream") and r["status"] == 200][-16:]
    assert arms == ["exact", "identity"] * 8
    assert "A/B" in capsys.readouterr().out


def test_same_arm_ratio_is_within_noise_of_one(exact_server, prompt_file, tmp_path):
    result = run_ttft(exact_server, prompt_file, tmp_path / "same.json", "--arm-a", "fill=exact",
                      "--arm-b", "fill=exact", "--lengths", "1024", "--repeats", "15", "--warmup", "1")
    (row,) = result["lengths"]
    assert row["ceiling"] == 1.0
    for key in ("speedup_client", "speedup_server"):
        assert 1 / SAME_ARM_TOLERANCE <= row[key] <= SAME_ARM_TOLERANCE, (key, row)


def test_bad_input_is_a_clear_error(exact_server, prompt_file, tmp_path, capsys):
    assert main(["ttft", "--base-url", exact_server.url, "--prompt", str(prompt_file), "--lengths", "999999"]) == 2
    assert "--lengths asks for 999999" in capsys.readouterr().err
    assert main(["ttft", "--base-url", exact_server.url, "--prompt", str(prompt_file), "--lengths", "64",
                 "--arm-b", "fill=bogus"]) == 2
    assert "valid fills" in capsys.readouterr().err
