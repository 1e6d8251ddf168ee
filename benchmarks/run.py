"""One command for every benchmark: each figure a ratio measured side by side in one process.

    python benchmarks/run.py [--quick] [--out results.json] [--readme README.md [--tables FILE]]
    python benchmarks/run.py --from-table --readme README.md

Runs, each in its own process (so one's memory and threads do not disturb
another's): the engine (its partial path with every row exact / plain forward,
ridge and ridge + 10% rows against their MAC ceilings and 1/r,
capture/forward, fit peak memory), the exact-row cost
line and the probe, where the probe's time goes by phase against its MAC charge, `ridgefill fill=exact` against lm-eval's `hf`, a filled arm and `hf` at batch 1 and 8
on prompts of one length, RaReCache
against its eq. 11 ceiling, and the paired bootstrap against scipy. Prints
one table and writes all figures as JSON with the machine's description.
With --readme README.md it rewrites the full table in benchmarks/README.md
(beside that README; --tables names another file) and the six headline
figures in README.md; --from-table remakes only the headlines from the full
table already there, running nothing. The tables: benchmarks/bench_tables.py.
On CUDA the engine benchmark times GPU prefill with synchronisation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_tables as tables  # noqa: E402  (benchmarks/bench_tables.py)


def suites(quick: bool, device: str) -> dict[str, list[str]]:
    reps = ["--repeats", "3" if quick else "5"]
    engine_ns = ["2048"] if quick else ["4096", "8192", "16384"]
    return {
        "engine": ["bench_engine.py", "--n", *engine_ns, "--tail", "1024" if not quick else "256",
                   "--device", device, *reps],
        "exact rows and probe": ["bench_rows.py", "--n", "2048" if quick else "4096",
                                 "--counts", *(["0", "256", "512", "1024"] if quick else ["0", "512", "1024", "2048"]),
                                 "--repeats", "1" if quick else "3"],
        "adapter vs hf": ["bench_adapter.py", *reps, "--docs", "12" if quick else "24"],
        "probe account": ["bench_probe.py", "--n", *(["2048"] if quick else ["4096", "8192", "16384"]),
                          "--tail", "256" if quick else "1024", "--device", device, "--repeats", "2" if quick else "3"],
        "batched prefill": ["bench_batch.py", "--repeats", "3", "--tokens", "512" if quick else "1024"],
        "rarecache": ["bench_rarecache.py", "--T", "1024" if quick else "2048", *reps],
        "bootstrap": ["bench_bootstrap.py", "--repeats", "5"],
    }


def machine() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "date": dt.date.today().isoformat(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def run_suite(name: str, argv: list[str]) -> tuple[dict, str]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, str(HERE / argv[0]), *argv[1:], "--json", out]
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(done.stdout[-4000:], flush=True)
    if done.returncode != 0:
        print(done.stderr[-4000:], file=sys.stderr)
        return {"error": f"exit {done.returncode}"}, done.stdout
    try:
        return json.loads(Path(out).read_text()), done.stdout
    finally:
        os.unlink(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results.json")
    p.add_argument("--readme", default=None, help="rewrite the headlines in this README and the full table")
    p.add_argument("--tables", default=None, help="the full table's file (default: benchmarks/README.md beside --readme)")
    p.add_argument("--from-table", action="store_true", help="remake the README's headlines from the full table only")
    p.add_argument("--only", nargs="+", default=None, help="run only these suites")
    p.add_argument("--reuse", default=None,
                   help="a JSON an earlier run wrote: its suites fill in those not run now (e.g. a long engine run)")
    p.add_argument("--device", default=None)
    a = p.parse_args()
    if a.from_table:
        if not a.readme:
            raise SystemExit("--from-table needs --readme README.md")
        headlines_from_table(Path(a.readme), tables_path(a))
        return
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    known = suites(a.quick, device)
    unknown = sorted(set(a.only or ()) - set(known))
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; valid suites: {', '.join(known)}")
    info = machine()
    results: dict = {}
    runs: dict = {}
    if a.reuse:
        earlier = json.loads(Path(a.reuse).read_text())
        results.update(earlier["results"])
        runs.update(earlier.get("runs", {}))
    for name, argv in known.items():
        if a.only and name not in a.only:
            continue
        results[name], _ = run_suite(name, argv)
        runs[name] = {"argv": argv, "date": info["date"]}
    Path(a.out).write_text(json.dumps({"machine": info, "runs": runs, "results": results}, indent=1))
    command = "python benchmarks/run.py" + (" --quick" if a.quick else "")
    note = ""
    reused = [name for name in results if a.only and name not in a.only]
    if reused:
        dates = ", ".join(sorted({runs.get(name, {}).get("date", "?") for name in reused}))
        note = (f" Figures of {', '.join(reused)}: from an earlier run (`--reuse`) on the same machine, {dates}, "
                f"with the same settings.")
    table = tables.markdown(results, info, command, note)
    print(table)
    if a.readme:
        write_tables(Path(a.readme), tables_path(a), table, tables.figure_rows(results), tables.measured(info))


def tables_path(a: argparse.Namespace) -> Path:
    return Path(a.tables) if a.tables else Path(a.readme).parent / "benchmarks" / "README.md"


def write_tables(readme: Path, full: Path, table: str, rows: list, when: str) -> None:
    """The full table into `full` (unless empty), the headlines (worst settings of `rows`) into `readme`."""
    if table:
        full.write_text(tables.replace_between(full.read_text(), tables.BEGIN, tables.END, table))
    link = os.path.relpath(full, readme.parent)
    where = f"{when[0].lower()}{when[1:]}; every figure: [{link}]({link})"
    headlines = tables.headline_markdown(rows, where)
    readme.write_text(tables.replace_between(readme.read_text(), tables.HEADLINE_BEGIN, tables.HEADLINE_END, headlines))


def headlines_from_table(readme: Path, full: Path) -> None:
    """Remake the README's headlines from the full table in `full`, running nothing."""
    table = tables.between(full.read_text(), tables.BEGIN, tables.END)
    when = re.match(r"\s*(Measured .*?\))(?=;)", table)
    if when is None:
        raise SystemExit(f"{full}: the table does not open with 'Measured ...;'")
    write_tables(readme, full, "", tables.rows_from_table(table), when.group(1))


if __name__ == "__main__":
    main()
