"""The benchmark tables: every figure with its target (benchmarks/README.md) and the six headlines (README.md).

`figure_rows` turns the suites' JSON into (figure, value, target) rows;
`markdown` is the full table; `HEADLINES` names the six figures the README
leads with, and `headline_markdown` shows each at its worst setting, so a
target met there is met at every setting measured. `rows_from_table` reads
the rows back from a full table, so the headlines can be remade from
benchmarks/README.md without rerunning (`run.py --from-table`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"  # the full table, in benchmarks/README.md
HEADLINE_BEGIN, HEADLINE_END = "<!-- bench headlines:begin -->", "<!-- bench headlines:end -->"  # README.md


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


def figure_rows(results: dict) -> list[tuple[str, float, str]]:
    """(figure, value, target) for the full table; every figure a ratio or a measured size."""
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
    for block in results.get("probe account", {}).get("lengths", []):
        at = f"probe account: N={block['N']}"
        rows.append((f"{at} probe speedup / MAC ceiling with rows + sweep", block["probe_of_ceiling"], ""))
        rows.append((f"{at} its rows given directly: speedup / MAC ceiling", block["fixed_rows_of_ceiling"], ""))
        for phase, row in block["phases"].items():
            if row["charged_seconds"]:
                rows.append((f"{at} {phase}: measured / charged seconds", row["seconds"] / row["charged_seconds"], ""))
            rows.append((f"{at} {phase}: excess seconds / probe total", row["excess_share"], ""))
    batch = results.get("batched prefill", {})
    for name, value in batch.get("figures", {}).items():
        if " / " in name or "equal" in name:  # the ratios and the equality check, not the raw rates
            rows.append((f"batched prefill ({batch['prompts']} prompts of {batch['tokens']} tokens): {name}", value,
                         "~1.0 (bitwise)" if "equal" in name else ""))
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


def shown(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e-2 else f"{value:,.3f}".rstrip("0").rstrip(".")


def measured(info: dict) -> str:
    """Where and when: the phrase both tables open with."""
    return (f"Measured {info['date']} on {info['cores']} cores ({info['machine']}, torch {info['torch']}, "
            f"{info['torch_threads']} threads{', ' + str(info['cuda']) if info['cuda'] else ', CPU only'})")


def markdown(results: dict, info: dict, command: str, note: str = "") -> str:
    head = f"{measured(info)}; `{command}`.{note} All figures and their settings: the JSON it writes."
    lines = [head, "", "| figure | value | target | |", "|---|---:|---|---|"]
    for name, value, target in figure_rows(results):
        lines.append(f"| {name} | {shown(value)} | {target} | {meets(value, target)} |")
    failed = [name for name, figures in results.items() if isinstance(figures, dict) and "error" in figures]
    if failed:
        lines.append("")
        lines.append(f"Failed suites (see the log): {', '.join(failed)}.")
    return "\n".join(lines)


ROW = re.compile(r"^\| (?P<name>[^|]+?) \| (?P<value>[-+0-9.,e]+) \| (?P<target>[^|]*?) \| [^|]* \|$")


def rows_from_table(table: str) -> list[tuple[str, float, str]]:
    """The (figure, value, target) rows of a table `markdown` wrote (the values as shown there)."""
    rows = []
    for line in table.splitlines():
        match = ROW.match(line)
        if match:
            rows.append((match["name"], float(match["value"].replace(",", "")), match["target"]))
    return rows


@dataclass(frozen=True)
class Headline:
    label: str
    pattern: str  # matches the figure names it covers; group 1 is the setting

    def select(self, rows: list[tuple[str, float, str]]) -> list[tuple[str, float, str]]:
        """(setting, value, target) of every row this headline covers."""
        return [(m.group(1), value, target) for name, value, target in rows
                if (m := re.fullmatch(self.pattern, name))]


# The speed claims of issue #9 that carry a target: the engine's own overhead, each filled arm against the
# MAC-model ceiling with the rows it ran exactly, the lm-eval adapter against `hf`, RaReCache against eq. 11.
HEADLINES = (
    Headline("partial path, every row exact / plain forward (the engine's own overhead)",
             r"engine: (N=\d+) partial path, every row exact / plain forward"),
    Headline("ridge speedup / MAC-model ceiling", r"engine: (N=\d+) ridge speedup / MAC ceiling"),
    Headline("ridge + 10% attention rows speedup / ceiling with those rows",
             r"engine: (N=\d+) ridge\+10% rows speedup / MAC ceiling"),
    Headline("probe speedup / ceiling with its rows", r"engine: (N=\d+) probe speedup / MAC ceiling with its rows"),
    Headline("`ridgefill fill=exact` / `hf` requests per second", r"ridgefill fill=exact / hf requests/s \((.+)\)"),
    Headline("RaReCache target prefill speedup / eq. 11 ceiling",
             r"RaReCache (rho=[0-9.]+): target prefill speedup / eq\. 11 ceiling \(T=\d+\)"),
)


def worst(covered: list[tuple[str, float, str]]) -> tuple[str, float, str]:
    """The setting farthest from the target's side: the lowest for '>=', the highest for '<=' and '<'."""
    target = covered[0][2]
    pick = min if target.startswith(">") else max
    return pick(covered, key=lambda row: row[1])


def headline_markdown(rows: list[tuple[str, float, str]], where: str) -> str:
    lines = [f"Each at the worst of its settings; {where}.", "",
             "| figure | worst | at | target | |", "|---|---:|---|---|---|"]
    for headline in HEADLINES:
        covered = headline.select(rows)
        if not covered:
            lines.append(f"| {headline.label} | | not in this run | | |")
            continue
        setting, value, target = worst(covered)
        lines.append(f"| {headline.label} | {shown(value)} | {setting} (of {len(covered)}) | {target} | "
                     f"{meets(value, target)} |")
    return "\n".join(lines)


def between(text: str, begin: str, end: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"no {begin} ... {end} markers")
    return text.split(begin, 1)[1].split(end, 1)[0]


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the markers replaced by `body` (its own lines)."""
    between(text, begin, end)  # both markers present
    before, rest = text.split(begin, 1)
    return f"{before}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"
