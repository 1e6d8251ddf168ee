"""`rf-eval load` and the server's FCFS batching scheduler (RaReCache section 4.6, appendix B.3): Poisson
arrivals, discard and percentiles, batches of at most max-batch served oldest first, an end-to-end run on a
tiny model, and bad input refused in one line."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from scipy import stats
from serving_helpers import start_server

from rf_eval.cli import main
from rf_eval.serving.load import PERCENTILE_METHOD, arrival_times, ttft_stats, wait_idle
from rf_eval.serving.scheduler import BatchScheduler, Cancelled

# ---------------------------------------------------------------------------------------------- arrivals


def test_arrival_gaps_are_exponential_at_the_rate_and_reproducible_by_seed():
    rate, n = 8.0, 20000
    times = arrival_times(rate, n, seed=3)
    gaps = np.diff(times, prepend=0.0)
    assert len(times) == n and np.all(gaps > 0)
    assert abs(gaps.mean() * rate - 1) < 0.03  # mean 1/rate: 20,000 draws put it within 3% (sd 0.7%)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01  # exponential, not just its mean
    assert np.array_equal(times, arrival_times(rate, n, seed=3))  # exactly reproducible
    assert not np.array_equal(times, arrival_times(rate, n, seed=4))
    np.testing.assert_allclose(arrival_times(2 * rate, n, seed=3), times / 2)  # one trace, scaled by 1/rate
    with pytest.raises(ValueError, match="rate"):
        arrival_times(0.0, 3, seed=0)


def test_discard_then_median_and_p99_are_numpys():
    rng = np.random.default_rng(0)
    ttfts = list(rng.lognormal(-3, 1, size=200))
    for i in (3, 60, 150):
        ttfts[i] = None  # no first token (cut): left out
    got = ttft_stats(ttfts, discard=50)
    kept = np.array([t for t in ttfts[50:] if t is not None])
    assert got["n"] == len(kept) == 148
    assert got["median_seconds"] == np.percentile(kept, 50, method=PERCENTILE_METHOD) == np.median(kept)
    assert got["p99_seconds"] == np.percentile(kept, 99, method="linear")
    assert got["mean_seconds"] == pytest.approx(kept.mean())
    assert ttft_stats([0.5, None], discard=1)["median_seconds"] is None


# ---------------------------------------------------------------------------------------------- the scheduler


def test_scheduler_serves_batches_of_at_most_max_oldest_first_each_request_once():
    served: list[list[int]] = []

    def run(jobs, finish):  # a slowed prefill: the burst queues behind the first batch
        served.append([j.payload for j in jobs])
        time.sleep(0.05)
        for j in jobs:
            finish(j, j.payload * 10)

    scheduler = BatchScheduler(run, max_batch=3)
    first = scheduler.submit(0)
    while scheduler.running is None and not first.done.is_set():
        time.sleep(0.001)
    gone = threading.Event()
    gone.set()
    jobs = [first] + [scheduler.submit(i, gone if i == 5 else None) for i in range(1, 12)]
    for job in jobs:
        assert job.done.wait(10)
    assert served[0] == [0] and all(1 <= len(b) <= 3 for b in served)
    order = [p for batch in served for p in batch]
    assert order == [i for i in range(12) if i != 5]  # oldest first; the gone client's request takes no place
    assert [len(b) for b in served[1:]] == [3, 3, 3, 1]
    for job in jobs:
        if job.payload == 5:
            assert job.cancelled and job.batch is None
        else:
            assert job.result == job.payload * 10 and job.error is None and 0 <= job.batch["position"] < 3
            assert job.batch["finished"] >= job.batch["started"]
    state = scheduler.state()
    assert (state["batches"], state["served"], state["dropped"], state["queued"]) == (5, 11, 1, 0)
    with pytest.raises(Cancelled):
        scheduler.call(99, gone)

    gate = threading.Event()

    def broken(jobs, finish):
        gate.wait(10)
        finish(jobs[0], "ok")
        raise RuntimeError("device lost")

    failing = BatchScheduler(broken, max_batch=4)
    alone = failing.submit("a")
    while failing.running is None:
        time.sleep(0.001)
    b, c = failing.submit("b"), failing.submit("c")
    gate.set()
    for job in (alone, b, c):
        assert job.done.wait(10)
    assert (alone.result, b.result) == ("ok", "ok") and "device lost" in str(c.error)  # the batch's failure
    with pytest.raises(ValueError, match="max_batch"):
        BatchScheduler(run, max_batch=0)


@pytest.fixture(scope="module")
def backend(serve_model_dir):
    pytest.importorskip("fastapi")
    from rf_eval.serving.backend import Backend

    return Backend.from_model_args({"pretrained": serve_model_dir, "fill": "exact", "tail": 1024, "device": "cpu"},
                                   max_batch=4)


def test_server_batches_share_prefills_and_generate_what_one_request_does(backend, monkeypatch, one_torch_thread):
    """A burst behind a slowed prefill: batches of at most 4, oldest first, one answer each, and each answer the
    tokens the request gets alone."""
    from rf_eval.serving.backend import GenParams

    exact, identity = backend.arm({}), backend.arm({"fill": "identity", "tail": 24})
    rng = np.random.default_rng(5)
    prompts = [rng.integers(10, 200, size=48).tolist() for _ in range(9)]
    arms = [exact if i % 2 else identity for i in range(9)]
    params = GenParams(max_tokens=4)
    alone = [backend.generate(p, a, params) for p, a in zip(prompts, arms)]  # batches of one, in turn
    assert all(g.batch["size"] == 1 for g in alone)

    original = backend._prefill_batch

    def slowed(jobs, finish):
        time.sleep(0.3)
        return original(jobs, finish)

    monkeypatch.setattr(backend, "_prefill_batch", slowed)
    out: dict[int, list] = {i: [] for i in range(9)}
    threads = []
    for i in range(9):  # arrivals 20 ms apart: request 0 alone, then the rest queued behind it
        thread = threading.Thread(target=lambda i=i: out[i].append(backend.generate(prompts[i], arms[i], params)))
        threads.append(thread)
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join(60)
    assert all(len(v) == 1 for v in out.values())  # every request exactly one answer
    gens = [out[i][0] for i in range(9)]
    keys = [(g.batch["id"], g.batch["position"]) for g in gens]
    assert keys == sorted(keys) and len(set(keys)) == 9  # served oldest first
    sizes = {g.batch["id"]: g.batch["size"] for g in gens}
    assert max(sizes.values()) == 4 and sizes[gens[0].batch["id"]] == 1
    assert sum(sizes.values()) == 9
    together = [g.batch["prefilled_together"] for g in gens[1:5]]
    assert together == [2, 2, 2, 2]  # two arms of one length: each arm's two prompts in one prefill call
    for got, one in zip(gens, alone):
        assert got.tokens == one.tokens
        assert got.timings["queue_seconds"] >= 0 and got.timings["prompt_seconds"] > 0


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def batch_server(serve_model_dir, serve_env, tmp_path_factory):
    served = start_server(serve_model_dir, tmp_path_factory.mktemp("load_server"), serve_env, "--tail", "1024",
                          "--max-batch", "4")
    yield served
    served.stop()


def run_load(server, out, *args):
    code = main(["load", "--base-url", server.url, "--arm-b", '{"fill": "identity", "tail": 64}', "--out", str(out),
                 "--quiet", *args])
    assert code == 0
    return json.loads(out.read_text())


def test_poisson_sweeps_and_saturation_on_a_tiny_model(batch_server, tmp_path, capsys):
    result = run_load(batch_server, tmp_path / "load.json", "--lengths", "512", "--rates", "30", "90",
                      "--requests", "12", "--discard", "2", "--saturation", "--seed", "7")
    printed = capsys.readouterr().out
    assert result["kind"] == "rf-eval-load" and result["server_scheduler"]["max_batch"] == 4
    assert (result["requests"], result["discard"], result["rates"]) == (12, 2, [30.0, 90.0])
    (entry,) = result["lengths"]
    for side in "ab":
        sat = entry[f"saturation_{side}"]
        assert sat["sent"] == 20 and sat["completed"] == 20
        if sat["mu"] is not None:  # eq. 10 from the server's records of three consecutive full batches
            first, _, third = (b for b in sat["batches"] if b["id"] in sat["window"])
            assert all(b["size"] == 4 for b in sat["batches"] if b["id"] in sat["window"])
            assert sat["mu"] == pytest.approx(3 * 4 / (third["ended"] - first["started"]))
        else:
            assert "queue did not stay full" in sat["reason"]
    assert len(result["sweeps"]) == 4 and len(result["rows"]) == 2
    trace = None
    for sweep in result["sweeps"]:
        records = sweep["records"]
        assert len(records) == 12 and sweep["sent"] + sweep["unsent"] == 12
        assert sweep["completed"] + sweep["cut"] + sweep["failed"] == sweep["sent"] == 12
        assert sweep["completed"] == 12 and not sweep["cut_at_deadline"]
        scheduled = [r["scheduled"] for r in records]
        assert scheduled == list(arrival_times(sweep["rate"], 12, seed=7))  # both arms: the same trace
        if sweep["rate"] == 30.0:
            trace = trace or scheduled
            assert scheduled == trace
        for r in records:
            assert r["sent"] >= r["scheduled"] - 1e-3 and r["first_token"] > r["sent"] and r["end"] >= r["first_token"]
            assert r["ttft"] == r["first_token"] - r["scheduled"] and 1 <= r["batch"]["size"] <= 4
            # no second model's prefill in these arms: the TTFT without it is the TTFT (RaReCache's differs)
            assert r["server"]["source_seconds"] == 0.0 and r["ttft_without_source"] == r["ttft"]
        again = ttft_stats([r["ttft"] for r in records], 2)  # the report's recomputation
        assert (sweep["n"], sweep["median_seconds"], sweep["p99_seconds"]) == (10, again["median_seconds"],
                                                                               again["p99_seconds"])
        assert sweep["median_seconds_without_source"] == sweep["median_seconds"]
    mu_a = entry["saturation_a"]["mu"]
    for row in result["rows"]:
        a, b = row["a"], row["b"]
        assert row["ratio_median"] == a["median_seconds"] / b["median_seconds"]
        assert row["ratio_p99"] == a["p99_seconds"] / b["p99_seconds"]
        assert row["u"] == (row["rate"] / mu_a if mu_a else None)
    assert "A/B med" in printed and "fill=identity,tail=64" in printed
    assert entry["batching"] == {"a": "together", "b": "together"} and "batching, N=" not in printed


SELECTOR_ARM = '{"fill": "identity", "tail": 64, "selector": "attention(layers=0)"}'  # rows chosen per prompt: one by one


def test_arms_that_batch_differently_are_refused_on_a_batching_server(batch_server, tmp_path, capsys):
    """Issue #55 item 4: exact's prompts share one forward in a batch while a selector arm's run one by one; on
    a server of max batch 4 that compares the batching, not the prefills. Refused after the warm-up, before any
    sweep, naming the fair comparison (both unbatched: --max-batch 1) and the flag that times them as served."""
    out = tmp_path / "load.json"
    code = main(["load", "--base-url", batch_server.url, "--arm-b", SELECTOR_ARM, "--lengths", "512", "--rates",
                 "30", "--requests", "4", "--discard", "0", "--out", str(out), "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and not out.exists()
    assert "arm A (fill=exact) prefills a batch's prompts together and arm B" in err[0]
    assert "one by one" in err[0] and "--max-batch 1" in err[0] and "--unequal-batching" in err[0]
    result = run_load(batch_server, out, "--arm-b", SELECTOR_ARM, "--lengths", "512", "--rates", "30",
                      "--requests", "4", "--discard", "0", "--unequal-batching")
    assert result["lengths"][0]["batching"] == {"a": "together", "b": "one by one"}
    assert result["protocol"]["unequal_batching"] is True
    assert "batching, N=512: A prefills a batch's prompts together, B one by one" in capsys.readouterr().out


def test_a_sweep_past_max_seconds_is_cut_and_the_server_drops_what_queued(batch_server, tmp_path):
    from rf_eval.serving.client import Server
    from rf_eval.serving.load import scheduler_state

    server = Server(batch_server.url)
    dropped = scheduler_state(server)["dropped"]
    # 24 arrivals in ~60 ms, batches of 4 prompts of 2,048 tokens: most still queue at 0.3 s
    result = run_load(batch_server, tmp_path / "cut.json", "--lengths", "2048", "--rates", "400", "--requests", "24",
                      "--discard", "0", "--max-seconds", "0.3", "--warmup", "0")
    for sweep in result["sweeps"]:
        assert sweep["cut_at_deadline"] and sweep["cut"] + sweep["unsent"] >= 1
        assert sweep["completed"] + sweep["cut"] + sweep["failed"] == sweep["sent"]
        assert sweep["sent"] + sweep["unsent"] == 24
        assert sweep["n"] == sweep["completed"]
        assert all(r["status"] in ("completed", "cut", "unsent") for r in sweep["records"])
    assert wait_idle(server, 60)
    assert scheduler_state(server)["dropped"] > dropped  # the cut clients' queued requests were dropped unserved
    records = batch_server.records()
    assert any(r["status"] == 499 and r["error"] == "client disconnected before the first token" for r in records)


@pytest.mark.parametrize("args, says", [
    (["--rates", "0"], "argument --rates"),
    (["--rates", "nan"], "argument --rates"),
    (["--requests", "0"], "argument --requests"),
    (["--discard", "-1"], "argument --discard"),
    (["--max-seconds", "0"], "argument --max-seconds"),
    (["--seed", "-3"], "argument --seed"),
    (["--lengths", "1"], "--lengths value must be >= 2"),
    (["--requests", "10", "--discard", "10"], "--discard 10 leaves none"),
    (["--rates", "2", "2"], "must not repeat"),
    (["--prompt", "/nonexistent/p.txt"], "no such file"),
    (["--arm-b", "fill=bogus"], "valid fills"),
    (["--base-url", "http://127.0.0.1:9"], "cannot reach the server"),
])
def test_bad_input_is_one_line_and_exit_2(batch_server, args, says, capsys):
    argv = ["load", "--base-url", batch_server.url, "--lengths", "16", "--rates", "5", "--requests", "4",
            "--discard", "0", "--warmup", "1", "--quiet"]
    for i in range(0, len(args), 2):  # each given option replaces its default above
        if args[i] in argv:
            at = argv.index(args[i])
            del argv[at : at + 2]
    code = main([*argv, *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in err, err


def test_an_out_file_rf_eval_did_not_write_is_kept(batch_server, tmp_path, capsys):
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "data"}\n')
    code = main(["load", "--base-url", batch_server.url, "--lengths", "16", "--rates", "5", "--requests", "2",
                 "--discard", "0", "--out", str(mine)])
    assert code == 2 and "--overwrite" in capsys.readouterr().err
    assert mine.read_text() == '{"my": "data"}\n'
