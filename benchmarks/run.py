"""One command for every benchmark: each figure a ratio measured side by side in one process.

    python benchmarks/run.py [--quick] [--out results.json] [--readme README.md]

Runs, each in its own process (so one's memory and threads do not disturb
another's): the engine (exact/plain, ridge and ridge + 10% rows against their
MAC ceilings and 1/r, capture/forward, fit peak memory), the exact-row cost
line and the probe, `ridgefill fill=exact` against lm-eval's `hf`, RaReCache
against its eq. 11 ceiling, and the paired bootstrap against scipy. Prints
one table, writes all figures as JSON with the machine's description, and
with --readme replaces the table between the README's benchmark markers.
On CUDA the engine benchmark times GPU prefill with synchronisation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def suites(quick: bool, device: str) -> dict[str, list[str]]:
    reps = ["--repeats", "3" if quick else "5"]
    engine_ns = ["2048"] if quick else ["4096", "8192", "16384"]
    return {
        "engine": ["bench_engine.py", "--n", *engine_ns, "--tail", "1024" if not quick else "256",
                   "--device", device, *reps],
        "exact rows and probe": ["bench_rows.py", "--n", "2048" if quick else "4096",
                                 "--counts", *(["0", "256", "512", "1024"] if quick else ["0", "512", "1024", "2048"]),
                                 "--repeats", "1" if quick else "3"],
        "adapter vs hf": ["bench_adapter.py", "--repeats", "3", "--docs", "12" if quick else "24"],
        "rarecache": ["bench_rarecache.py", "--T", "1024" if quick else "2048", "--repeats", "3"],
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


def flatten(prefix: str, value, rows: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix} / {k}" if prefix else str(k), v, rows)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            flatten(f"{prefix} [{i}]", v, rows)
    elif isinstance(value, float):
        rows.append((prefix, f"{value:.3f}"))
    else:
        rows.append((prefix, str(value)))


def markdown(results: dict, info: dict) -> str:
    rows: list[tuple[str, str]] = []
    for suite, figures in results.items():
        flatten(suite, figures, rows)
    head = (f"Measured {info['date']} on {info['cores']} cores ({info['machine']}, torch {info['torch']}, "
            f"{info['torch_threads']} threads{', ' + str(info['cuda']) if info['cuda'] else ', CPU only'}); "
            "`python benchmarks/run.py --quick`.")
    lines = [head, "", "| figure | value |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results.json")
    p.add_argument("--readme", default=None, help="replace the table between the README's bench markers")
    p.add_argument("--only", nargs="+", default=None, help="run only these suites")
    p.add_argument("--device", default=None)
    a = p.parse_args()
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    info = machine()
    results = {}
    for name, argv in suites(a.quick, device).items():
        if a.only and name not in a.only:
            continue
        results[name], _ = run_suite(name, argv)
    Path(a.out).write_text(json.dumps({"machine": info, "results": results}, indent=1))
    table = markdown(results, info)
    print(table)
    if a.readme:
        text = Path(a.readme).read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{a.readme} has no {BEGIN} ... {END} markers")
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        Path(a.readme).write_text(f"{before}{BEGIN}\n{table}\n{END}{after}")


if __name__ == "__main__":
    main()
