"""lm-eval tasks for the RidgeFill evaluation protocols (paper section 3.1, appendices C-E).

Installed as `rf_eval.tasks`. The YAML files live in data folders beside the
Python modules (`ruler_filled/`, `ruler_second_question/`, `keytoken_nll/`,
`longbench_v2_cot/`); the task classes they name are the modules here.

`task_dir()` is the folder to hand to lm-eval as an include path:

    lm_eval --include_path "$(python -c 'import rf_eval.tasks as t; print(t.task_dir())')" ...
"""

from __future__ import annotations

from pathlib import Path


def task_dir() -> str:
    """The folder holding this package's task YAMLs (an lm-eval include path)."""
    return str(Path(__file__).resolve().parent)
