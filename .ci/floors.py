"""Print a pip constraints file that pins every dependency of pyproject.toml to its declared lower bound.

    python .ci/floors.py [--extras test,serve] [--override torch==2.13.0] [pyproject.toml]

Every requirement in `[project] dependencies` and in the named extras must carry a `>=` floor (the script
fails naming the one that does not); a name that appears more than once (lm-eval in the dependencies and
in an extra) must declare the same floor everywhere. `--override NAME==VERSION` replaces a floor that
cannot be installed here (torch: this machine has one CPU wheel, 2.13.0). Extras are dropped from the
names: pip's constraints take none. `.ci/floors.sh` installs the package with this file.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(?:;.*)?$")


def normalize(name: str) -> str:
    """PEP 503's normalized name: `PyYAML`, `pyyaml` and `py_yaml` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"floors: no extra {', '.join(unknown)} in {pyproject} (have {', '.join(optional)})")
    return [*project["dependencies"], *(r for e in extras for r in optional[e])]


def floors(reqs: list[str]) -> dict[str, str]:
    """{normalized name: lowest version} from each requirement's `>=` specifier."""
    out: dict[str, str] = {}
    for req in reqs:
        match = _REQUIREMENT.match(req)
        if not match:
            raise SystemExit(f"floors: cannot read the requirement {req!r}")
        name, spec = normalize(match[1]), match[2]
        lows = re.findall(r">=\s*([^,\s]+)", spec)
        if len(lows) != 1:
            raise SystemExit(f"floors: {req!r} must declare exactly one lower bound (>=)")
        if out.setdefault(name, lows[0]) != lows[0]:
            raise SystemExit(f"floors: {name} is declared with two lower bounds, {out[name]} and {lows[0]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", nargs="?", default=str(Path(__file__).resolve().parents[1] / "pyproject.toml"))
    parser.add_argument("--extras", default="", help="comma-separated extras whose requirements are pinned too")
    parser.add_argument("--override", action="append", default=[], metavar="NAME==VERSION")
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    pins = floors(requirements(Path(args.pyproject), extras))
    for item in args.override:
        name, _, version = item.partition("==")
        if normalize(name) not in pins or not version:
            raise SystemExit(f"floors: --override {item!r} names no declared dependency NAME==VERSION")
        pins[normalize(name)] = version
    sys.stdout.write("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
