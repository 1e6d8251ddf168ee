"""One command for every benchmark: each figure a ratio measured side by side in one process.

    python benchmarks/run.py [--quick] [--out results.json] [--readme README.md]

Runs, each in its own process (so one's memory and threads do not disturb
another's): the engine (its partial path with every row exact / plain forward,
ridge and ridge + 10% rows against their MAC ceilings and 1/r,
capture/forward, fit peak memory), the exact-row cost
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
        "adapter vs hf": ["bench_adapter.py", *reps, "--docs", "12" if quick else "24"],
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


def meets(value: float, target: str) -> str:
    """'met' / 'missed' for a target written as '<= x', '>= x', '< x' or '~x' (within 5%); '' for none."""
    if not target:
        return ""
    if target.startswith("~"):
        about = float(target[1:].split()[0])
        return "met" if abs(value - about) <= 0.05 * abs(about) else "missed"
    op, bound = target.split()[:2]
    ok = {"<=": value <= float(bound), ">=": value >= float(bound), "<": value < float(bound)}[op]
    return "met" if ok else "missed"


def headlines(results: dict) -> list[tuple[str, float, str]]:
    """(figure, value, target) for the README table; every figure a ratio or a measured size."""
    rows: list[tuple[str, float, str]] = []
    engine = results.get("engine", {})
    targets = engine.get("targets", {})
    for name, value in engine.items():
        if name != "targets" and isinstance(value, (int, float)):
            rows.append((f"engine: {name}", value, targets.get(name, "")))
    probe = results.get("exact rows and probe", {})
    if "line" in probe:
        line = probe["line"]["CPU"]
        rows.append(("exact prefix rows: seconds per row (CPU)", line["sigma"], ""))
        rows.append(("exact prefix rows: break-even count / prefix", line["breakeven"] / probe["prefix"], ""))
        rows.append(("probe arm: selection share of its prefill time", probe["probe_select"] / probe["probe_total"], ""))
    for row in results.get("adapter vs hf", []) if isinstance(results.get("adapter vs hf"), list) else []:
        rows.append((f"ridgefill fill=exact / hf requests/s ({row['words']} words, batch {row['batch']})",
                     row["ratio"], ">= 1.0"))
    rare = results.get("rarecache", {})
    for row in rare.get("rows", []):
        rows.append((f"RaReCache rho={row['rho']}: target prefill speedup / eq. 11 ceiling (T={rare['T']})",
                     row["share_of_ceiling"], ">= 0.85"))
    for row in results.get("bootstrap", {}).get("rows", []):
        if row["method"].startswith("scipy"):
            rows.append(("scipy.stats.bootstrap, 10,000 x 500 x 20: seconds", row["median_s"], ""))
        else:
            target = "< 1" if "one index matrix per comparison" in row["method"] else ""
            rows.append((f"{row['method']}: seconds", row["median_s"], target))
            rows.append((f"{row['method']}: speedup over scipy", row["speedup_vs_scipy"], ""))
    return rows


def markdown(results: dict, info: dict, command: str, note: str = "") -> str:
    head = (f"Measured {info['date']} on {info['cores']} cores ({info['machine']}, torch {info['torch']}, "
            f"{info['torch_threads']} threads{', ' + str(info['cuda']) if info['cuda'] else ', CPU only'}); "
            f"`{command}`.{note} All figures and their settings: the JSON it writes.")
    lines = [head, "", "| figure | value | target | |", "|---|---:|---|---|"]
    for name, value, target in headlines(results):
        shown = f"{value:.3g}" if abs(value) < 1e-2 else f"{value:,.3f}".rstrip("0").rstrip(".")
        lines.append(f"| {name} | {shown} | {target} | {meets(value, target)} |")
    failed = [name for name, figures in results.items() if isinstance(figures, dict) and "error" in figures]
    if failed:
        lines.append("")
        lines.append(f"Failed suites (see the log): {', '.join(failed)}.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results.json")
    p.add_argument("--readme", default=None, help="replace the table between the README's bench markers")
    p.add_argument("--only", nargs="+", default=None, help="run only these suites")
    p.add_argument("--reuse", default=None,
                   help="a JSON an earlier run wrote: its suites fill in those not run now (e.g. a long engine run)")
    p.add_argument("--device", default=None)
    a = p.parse_args()
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
    table = markdown(results, info, command, note)
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
