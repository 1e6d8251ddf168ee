"""A fill in one file outside the package runs through `lm_eval` with no other edit (#25 item 1).

The file is the README's own ("Adding a fill"), saved into a folder named by RF_EVAL_FILL_PATH.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from adapter_helpers import TASK, cli_env, loglikelihoods, run_lm_eval
from warm_start import run_argv

ROOT = Path(__file__).resolve().parents[2]


def readme_fill_file() -> tuple[str, str]:
    """The README's example fill module and its `fill=` name."""
    section = (ROOT / "README.md").read_text().split("## Adding a fill", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return code, re.search(r'^    name = "(\w+)"', code, re.M).group(1)


def test_the_readme_fill_file_runs_through_lm_eval(tiny_model_dir, adapter_task, tmp_path, monkeypatch):
    code, name = readme_fill_file()
    fills = tmp_path / "fills"
    fills.mkdir()
    (fills / f"{name}.py").write_text(code)
    model = tiny_model_dir("llama")
    common = ["--tasks", TASK, "--include_path", str(adapter_task), "--limit", "4", "--device", "cpu",
              "--log_samples"]
    # without the folder the fill is unknown, and says where fills come from
    proc = run_lm_eval(["--model", "ridgefill", "--model_args", f"pretrained={model},fill={name},split=3,tail=2",
                        "--output_path", str(tmp_path / "none"), *common], tmp_path)
    assert proc.returncode == 2 and f"fill={name!r} is not valid" in proc.stderr
    monkeypatch.setenv("RF_EVAL_FILL_PATH", str(fills))
    listed = run_argv([sys.executable, "-m", "rf_eval", "fills"], env=cli_env(), timeout=120)
    assert listed.returncode == 0 and f"| `{name}` |" in listed.stdout
    for fill in (name, "identity"):
        proc = run_lm_eval(["--model", "ridgefill", "--model_args", f"pretrained={model},fill={fill},split=3,tail=2",
                            "--output_path", str(tmp_path / fill), *common], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / name).rglob("results_*.json")).read_text())
    assert (results["config"]["rf_eval"]["fill"], results["config"]["rf_eval"]["tail"]) == (name, 2)
    plugin, identity = loglikelihoods(tmp_path / name), loglikelihoods(tmp_path / "identity")
    assert plugin.keys() == identity.keys() and len(plugin) >= 4
    assert max(abs(plugin[k][0] - identity[k][0]) for k in plugin) > 1e-4  # its own filled rows were read
