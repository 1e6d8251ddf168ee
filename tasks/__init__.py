"""lm-eval tasks for the RidgeFill evaluation protocols (paper section 3.1, appendices C-E).

Installed as `rf_eval.tasks`. The YAML files live in data folders beside the
Python modules (`ruler_filled/`, `ruler_second_question/`, `keytoken_nll/`,
`decode_agreement/`, `longbench_v2_cot/`); the task classes they name are the modules here.

Plain `lm_eval` finds them through rf-eval's startup hook (`model_adapters/startup.py`).
`task_dir()` is the same folder, for an explicit include path (a `TaskManager`
built in Python, or a Python started with the hook switched off):

    lm_eval --include_path "$(python -c 'import rf_eval.tasks as t; print(t.task_dir())')" ...

Tasks: `ruler_filled` and `<ruler task>_filled` (ruler_filled.py), `keytoken_nll`
(keytoken.py), `decode_agreement` (decode_agreement.py), `ruler_second_question`
(second_question.py), `longbench_v2_cot` (longbench_cot.py); extra request types
in request_types.py; what they download, fetched ahead and checked before a run, in data.py (one
plug-in per piece of data: data_sources/).
"""

from __future__ import annotations

from pathlib import Path


def task_dir() -> str:
    """The folder holding this package's task YAMLs (an lm-eval include path)."""
    return str(Path(__file__).resolve().parent)
