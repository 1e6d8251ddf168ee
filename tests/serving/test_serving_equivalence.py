"""`rf-eval check-equivalence --base-url A --base-url B`: identical greedy outputs and top-k log-probabilities."""

from __future__ import annotations

import pytest
from serving_helpers import start_server

from rf_eval.cli import main


@pytest.fixture(scope="module")
def filled_server(serve_model_dir, serve_env, tmp_path_factory):
    """A second server start whose own arm fills (identity fill, 64-token tail)."""
    served = start_server(serve_model_dir, tmp_path_factory.mktemp("filled_server"), serve_env,
                          "--fill", "identity", "--tail", "64")
    yield served
    served.stop()


def test_fill_off_on_two_servers_is_identical(exact_server, filled_server, capsys):
    # the filled server with its fill switched off for these requests (the paper's check against stock)
    code = main(["check-equivalence", "--base-url", exact_server.url, "--base-url", filled_server.url + "/v1",
                 "--arm", "none", "--arm", '{"fill": "exact"}'])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("OK   prompt") == 3 and "0 of 3 prompts differ" in out


def test_fill_off_against_a_filled_arm_fails(exact_server, filled_server, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"' + "river stone lantern " * 40 + '"\n{"prompt": "' + "copper window " * 30 + '"}\n')
    code = main(["check-equivalence", "--base-url", exact_server.url, "--base-url", filled_server.url,
                 "--prompts", str(prompts), "--max-tokens", "4", "--top-logprobs", "5"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert out.count("FAIL prompt") == 2 and "2 of 2 prompts differ" in out


def test_local_mode_still_needs_a_model(capsys):
    assert main(["check-equivalence"]) == 2
    assert "give --model" in capsys.readouterr().err
    assert main(["check-equivalence", "--base-url", "http://127.0.0.1:9"]) == 2
    assert "needs two --base-url" in capsys.readouterr().err
