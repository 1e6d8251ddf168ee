"""The benchmark scripts: their figures are well-formed, and both tables are written from them.

benchmarks/README.md holds every figure; README.md the six headlines, each at its worst setting.

Speed itself is not asserted here (benchmarks measure it); these check that the
scripts run at toy size and that the table states each target and its outcome.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_tables as tables  # noqa: E402  (benchmarks/bench_tables.py)
import run  # noqa: E402  (benchmarks/run.py)
from warm_start import run_argv  # noqa: E402

ROOT = BENCH.parent


@pytest.mark.parametrize(
    ("value", "target", "want"),
    [(1.02, "<= 1.03", "met"), (1.04, "<= 1.03", "missed"), (0.9, ">= 0.90", "met"), (0.89, ">= 0.90", "missed"),
     (0.99, "< 1", "met"), (1.0, "< 1", "missed"), (5.0, "", ""), (1.0, "~1.0 (flat)", "met"),
     (1.2, "~1.0 (flat)", "missed")],
)
def test_targets_are_judged(value, target, want):
    assert tables.meets(value, target) == want


def bench(argv: list, **kwargs) -> None:
    """A benchmark script run as its own process (warm: tests/warm_start.py); it must exit 0."""
    done = run_argv(argv, **kwargs)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_engine_benchmark_at_toy_size(tmp_path):
    out = tmp_path / "engine.json"
    bench([sys.executable, str(BENCH / "bench_engine.py"), "--n", "320", "--tail", "64", "--layers", "8",
           "--hidden", "128", "--repeats", "1", "--skip-memory", "--device", "cpu", "--json", str(out)], timeout=300)
    figures = json.loads(out.read_text())
    prefix = 320 - 64
    # every arm's ceiling is the cost model's, and rows only lower it
    assert figures["N=320 ridge MAC ceiling"] > figures["N=320 ridge+10% rows MAC ceiling"] > 1.0
    assert figures["N=320 ridge+10% rows: exact rows"] == round(0.1 * 320)  # 10% of the prompt's rows
    assert 0 < figures["N=320 probe: exact rows"] <= prefix
    assert figures["N=320 probe speedup / MAC ceiling with rows + sweep"] > \
        figures["N=320 probe speedup / MAC ceiling with its rows"]
    for name, value in figures.items():
        if name != "targets":
            assert value > 0, name
    assert figures["targets"]["N=320 partial path, every row exact / plain forward"] == "<= 1.05"
    assert "N=320 engine exact / plain forward" not in figures  # an A/A of one dispatch, replaced
    assert set(figures["targets"]) <= set(figures)


def test_the_probe_account_splits_its_time_into_phases_at_toy_size(tmp_path):
    """`bench_probe.py`: the probe's phases add up to its prefill, each beside its MAC charge (#28 item 4)."""
    out = tmp_path / "probe.json"
    bench([sys.executable, str(BENCH / "bench_probe.py"), "--n", "512", "--tail", "64", "--layers", "8",
           "--hidden", "128", "--repeats", "1", "--device", "cpu", "--json", str(out)], timeout=300, cwd=BENCH)
    (block,) = json.loads(out.read_text())["lengths"]
    phases = block["phases"]
    assert list(phases) == ["lower", "base", "sweep", "late"]
    assert phases["base"]["charged_seconds"] == 0  # the MAC model charges the base rules nothing
    assert all(row["seconds"] > 0 for row in phases.values())
    assert all(phases[p]["charged_seconds"] > 0 for p in ("lower", "sweep", "late"))
    total = sum(row["seconds"] for row in phases.values())
    excess = sum(row["seconds"] - row["charged_seconds"] for row in phases.values()) / total
    assert abs(sum(row["excess_share"] for row in phases.values()) - excess) < 1e-9
    assert 0 < block["exact_rows"] <= 512 - 64 and block["probe_of_ceiling"] > 0
    rows = tables.figure_rows({"probe account": {"lengths": [block]}})
    assert ("probe account: N=512 base: excess seconds / probe total", phases["base"]["excess_share"], "") in rows


def test_the_batch_benchmark_finds_batch_8_answers_equal_to_batch_1(tmp_path):
    out = tmp_path / "batch.json"
    bench([sys.executable, str(BENCH / "bench_batch.py"), "--tokens", "96", "--prompts", "8", "--tail", "32",
           "--hidden", "64", "--layers", "4", "--repeats", "1", "--json", str(out)], timeout=300, cwd=BENCH)
    report = json.loads(out.read_text())
    figures = report["figures"]
    assert figures["filled answers at every batch size equal batch 1's"] == 1.0
    assert figures["filled / hf requests/s, batch 8"] == figures["filled b8 requests/s"] / figures["hf b8 requests/s"]
    rows = tables.figure_rows({"batched prefill": report})
    assert [name for name, _, _ in rows] == [f"batched prefill (8 prompts of 96 tokens): {name}" for name in figures
                                             if " / " in name or "equal" in name]


RESULTS = {
    "engine": {"N=4096 ridge speedup / MAC ceiling": 0.95, "N=8192 ridge speedup / MAC ceiling": 0.91,
               "N=4096 partial path, every row exact / plain forward": 1.02,
               "N=8192 partial path, every row exact / plain forward": 1.07,
               "N=4096 engine exact / plain forward": 1.05,
               "targets": {"N=4096 ridge speedup / MAC ceiling": ">= 0.90", "N=8192 ridge speedup / MAC ceiling": ">= 0.90",
                           "N=4096 partial path, every row exact / plain forward": "<= 1.05",
                           "N=8192 partial path, every row exact / plain forward": "<= 1.05",
                           "N=4096 engine exact / plain forward": "<= 1.03"}},
    "rarecache": {"T": 2048, "rows": [{"rho": 0.2, "share_of_ceiling": 0.8}, {"rho": 0.5, "share_of_ceiling": 1.01}]},
    "bootstrap": {"error": "exit 1"},
}
INFO = {"date": "2026-11-30", "cores": 2, "machine": "x86_64", "torch": "2.13.0+cpu", "torch_threads": 2, "cuda": None}


def test_the_full_table_states_targets_and_outcomes():
    table = tables.markdown(RESULTS, INFO, "python benchmarks/run.py")
    lines = table.splitlines()
    assert "| engine: N=4096 ridge speedup / MAC ceiling | 0.95 | >= 0.90 | met |" in lines
    assert "| engine: N=4096 engine exact / plain forward | 1.05 | <= 1.03 | missed |" in lines
    assert any(line.startswith("| RaReCache rho=0.2") and line.endswith("| 0.8 | >= 0.85 | missed |")
               for line in lines)
    assert "Failed suites (see the log): bootstrap." in lines
    assert "2 cores" in lines[0] and "`python benchmarks/run.py`" in lines[0]
    assert tables.rows_from_table(table) == tables.figure_rows(RESULTS)  # read back as written


def test_the_headlines_are_the_worst_setting_of_each():
    lines = tables.headline_markdown(tables.figure_rows(RESULTS), "measured here").splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| figure")]
    assert len(rows) == len(tables.HEADLINES) == 6
    assert rows[0].endswith("| 1.07 | N=8192 (of 2) | <= 1.05 | missed |")  # the highest, against '<='
    assert rows[1].endswith("| 0.91 | N=8192 (of 2) | >= 0.90 | met |")  # the lowest, against '>='
    assert rows[2].endswith("| | not in this run | | |") and rows[4].endswith("| | not in this run | | |")
    assert rows[5].endswith("| 0.8 | rho=0.2 (of 2) | >= 0.85 | missed |")
    assert "engine exact / plain forward" not in "\n".join(lines)  # the old A/A figure is no headline


def test_the_readme_headlines_are_remade_from_the_full_table(tmp_path):
    """What README.md shows is what `run.py --from-table` makes from benchmarks/README.md now."""
    readme, full = tmp_path / "README.md", tmp_path / "benchmarks" / "README.md"
    full.parent.mkdir()
    readme.write_text((ROOT / "README.md").read_text())
    full.write_text((BENCH / "README.md").read_text())
    run.headlines_from_table(readme, full)
    assert readme.read_text() == (ROOT / "README.md").read_text(), \
        "run `python benchmarks/run.py --from-table --readme README.md`"
    assert full.read_text() == (BENCH / "README.md").read_text()  # the full table is only read
    assert len(tables.rows_from_table(tables.between(full.read_text(), tables.BEGIN, tables.END))) >= 60


@pytest.mark.slow
def test_run_rewrites_both_tables(tmp_path):
    """The README's command, on its cheapest suite: JSON written, the full table and the headlines replaced."""
    readme, full = tmp_path / "README.md", tmp_path / "benchmarks" / "README.md"
    full.parent.mkdir()
    readme.write_text(f"intro\n{tables.HEADLINE_BEGIN}\nold headlines\n{tables.HEADLINE_END}\nafter\n")
    full.write_text(f"all\n{tables.BEGIN}\nold table\n{tables.END}\nend\n")
    out = tmp_path / "bench.json"
    bench([sys.executable, str(BENCH / "run.py"), "--only", "bootstrap", "--out", str(out),
           "--readme", str(readme)], timeout=600)
    saved = json.loads(out.read_text())
    assert saved["machine"]["cores"] and saved["runs"]["bootstrap"]["argv"][0] == "bench_bootstrap.py"
    text = full.read_text()
    assert text.startswith(f"all\n{tables.BEGIN}\nMeasured ") and text.endswith(f"{tables.END}\nend\n")
    assert "old table" not in text
    assert "| rf_eval paired_bootstrap, one index matrix per comparison: seconds |" in text
    head = readme.read_text()
    assert head.startswith(f"intro\n{tables.HEADLINE_BEGIN}\nEach at the worst of its settings; measured ")
    assert head.endswith(f"{tables.HEADLINE_END}\nafter\n") and "old headlines" not in head
    assert "[benchmarks/README.md](benchmarks/README.md)" in head  # the link, relative to the README
    assert head.count("| not in this run |") == 6  # the bootstrap suite carries no headline


def test_the_gpu_benchmark_writes_every_field_at_toy_size(tmp_path):
    """`benchmarks/gpu.py --tiny --device cpu`: the GPU command's fields and tables, at toy shapes (#28)."""
    bench([sys.executable, str(BENCH / "gpu.py"), "--tiny", "--device", "cpu", "--out", str(tmp_path)], timeout=600, cwd=BENCH)
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert [b["N"] for b in report["lengths"]] == [256, 512] and report["skipped_lengths"] == []
    for block in report["lengths"]:
        assert set(block["seconds"]) == {"plain", "partial exact", "exact", "identity", "ridge", "ridge+rows",
                                         "probe", "ridge streamed"}
        assert all(t > 0 for t in block["seconds"].values())
        assert set(block["arms"]) == {"identity", "ridge", "ridge+rows", "probe"}
        for row in block["arms"].values():
            assert row["mac_ceiling"] > 1.0 and row["speedup"] > 0
            assert abs(row["of_mac_ceiling"] - row["speedup"] / row["mac_ceiling"]) < 1e-9
        assert block["arms"]["ridge"]["mac_ceiling"] > block["arms"]["ridge+rows"]["mac_ceiling"]
        assert block["peak_memory_gib"] == {"plain": None, "ridge": None, "ridge_over_plain": None}  # CUDA only
        assert block["streamed_over_resident"] > 0 and block["capture_tokens_per_s"] > 0
        assert 0 < block["exact_rows"]["probe"] <= block["N"]
    batched = report["batched"]
    assert batched["batch"] == 8 and len(batched["prompts_per_s"]) == 4
    assert all(rate > 0 for rate in batched["prompts_per_s"].values())
    assert batched["ridge_batch_gain"] == batched["prompts_per_s"]["ridge, batch 8"] / batched["prompts_per_s"][
        "ridge, one at a time"]
    floor = report["engine_floor"]
    assert floor["decoded"] == 64 and 0 <= floor["greedy_flipped"] <= 64 and floor["max_abs"] < 1e-4
    table = (tmp_path / "gpu.md").read_text()
    assert table.count("| 256 |") == 5 and table.count("| 512 |") == 5 and "greedy tokens flipped" in table
    assert "Batch 8 at N=256" in table


def test_the_mac_rate_fit_recovers_known_rates_and_its_counts_sum_to_the_mac_model():
    """bench_mac_rates: the row and pair counts add up to the MAC model's exact prefill, and the least-squares
    fit recovers the per-MAC seconds that made a set of timings (w = b / a = 1.3 here), bit-for-bit enough."""
    from bench_mac_rates import fit_rates, mac_counts
    from transformers import LlamaConfig

    from rf_eval.cost.mac_model import prefill_macs

    config = LlamaConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    lengths = [128, 256, 512, 1024]
    counts = [mac_counts(config, n) for n in lengths]
    assert [rows + pairs for rows, pairs in counts] == [prefill_macs(config, n) for n in lengths]
    assert counts[-1][1] > 3 * counts[0][1] * 4  # pairs grow as n^2: the two columns can be told apart
    a, b = 2e-11, 2.6e-11
    row, pair = fit_rates(counts, [a * rows + b * pairs for rows, pairs in counts])
    assert row == pytest.approx(a, rel=1e-9) and pair == pytest.approx(b, rel=1e-9)


def test_the_mac_rate_benchmark_runs_at_toy_size(tmp_path, tiny_model_dir):
    done = run_argv([sys.executable, str(BENCH / "bench_mac_rates.py"), "--model", tiny_model_dir("llama"),
                     "--lengths", "32", "64", "--repeats", "1"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["32", "64"] and lines[-1].startswith("fit: a row MAC")
    bad = run_argv([sys.executable, str(BENCH / "bench_mac_rates.py"), "--lengths", "64"], timeout=300)
    assert bad.returncode == 2 and "give two lengths or more" in bad.stderr
