#!/usr/bin/env bash
# The declared floors, tested: a second virtual environment with every dependency of pyproject.toml
# (and of the extras below) at its lower bound, then a fast subset of the tests in it.
#
#   bash .ci/floors.sh   # .ci/run calls it: 4.3 min on 2 busy cores (1.3 installing, 2.3 testing)
#
# `.ci/floors.py` writes the pins (a pip constraints file) from pyproject's `>=` bounds. torch is pinned
# to 2.13.0, the one CPU wheel this machine has, not to its floor (see the comment in pyproject.toml).
# Everything happens in a copy of the checkout's files (git's tracked and unignored ones) in a fresh
# folder, FLOORS_DIR (default: a new temporary folder, removed when the run passes; FLOORS_KEEP=1 keeps
# it): the editable install's metadata and the tests' outputs never touch the checkout, so .ci/run can
# run this beside the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
work=${FLOORS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rf-eval-floors.XXXXXX")}
mkdir -p "$work/src"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$work/src"
cd "$work/src"
[ -f pyproject.toml ] || { echo "floors: could not copy the checkout into $work/src"; exit 1; }
venv=$work/venv
extras=demo,serve,cluster,test

# The subset, in one place: engine invariants on two families (an attention-only and a hybrid one),
# a filled prefill, `rf-eval check-equivalence`, one adapter run through the `lm_eval` command, one
# report from lm-eval's own output, the server (fastapi, uvicorn, jinja2), a Slurm study (submitit),
# and the packaging checks (entry points, the startup hook).
TESTS=(
  "tests/engine/test_engine_floor.py::test_partial_path_with_every_row_exact_is_the_stock_model[llama-float32]"
  "tests/engine/test_engine_floor.py::test_partial_path_with_every_row_exact_is_the_stock_model[qwen3_5-float32]"
  "tests/engine/test_engine_floor.py::test_check_equivalence_runs_the_partial_path[llama-float32]"
  "tests/engine/test_engine_floor.py::test_check_equivalence_runs_the_partial_path[qwen3_5-float32]"
  "tests/engine/test_engine.py::test_filled_prefill_is_the_stock_forward_with_predicted_inputs[llama]"
  "tests/engine/test_engine.py::test_filled_prefill_is_the_stock_forward_with_predicted_inputs[qwen3_5]"
  "tests/model_adapters/test_adapter_cli.py::test_exact_arm_matches_lm_eval_hf"
  "tests/reports/test_report.py::test_report_names_arms_from_model_args_and_pairs_items"
  "tests/serving/test_serving_api.py::test_unknown_arm_is_a_clear_400_and_the_server_keeps_serving"
  "tests/study/test_slurm.py::test_the_study_is_submitted_as_jobs_that_each_wait_for_the_ones_they_need"
  "tests/test_packaging.py"
)

rm -rf "$venv"
python3 -m venv "$venv"
python3 .ci/floors.py --extras "$extras" --override torch==2.13.0 >"$venv/constraints.txt"
# A subshell, so that the caller's environment (.ci/run's .venv) is left as it was.
(
  . "$venv/bin/activate"
  pip install -q --no-compile torch==2.13.0  # first, from the local wheel, so pip never resolves a CUDA build
  echo "floors: torch installed at $((SECONDS - started)) s"
  pip install -q --no-compile -c "$venv/constraints.txt" -e ".[$extras]"
  pip check
  echo "floors: installed at $((SECONDS - started)) s"
  python - "$venv/constraints.txt" <<'EOF'
import sys
from importlib.metadata import version

from packaging.version import Version

pins = [line.strip().split("==") for line in open(sys.argv[1]) if line.strip()]
got = {name: version(name) for name, _ in pins}
wrong = [f"{name} {got[name]} (pinned {want})" for name, want in pins if Version(Version(got[name]).public) != Version(want)]
if wrong:
    sys.exit("floors: not installed at the pinned version: " + ", ".join(wrong))
print("floors:", " ".join(f"{name}=={got[name]}" for name, _ in pins))
EOF
  python -m pytest -q -p no:cacheprovider --basetemp "$work/pytest" --durations=5 "${TESTS[@]}"
)
cd /
[ "${FLOORS_KEEP:-}" = 1 ] || rm -rf "$work"
echo "floors: passed in $((SECONDS - started)) s"
