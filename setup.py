"""setup.py exists only to install `rf_eval_lm_eval.pth` (all other metadata is in pyproject.toml).

The .pth file runs `rf_eval.model_adapters.startup` at interpreter start, which lets the
plain `lm_eval` command find rf-eval's models and tasks where lm-eval does not
discover them itself: 0.4.13 and 0.5.0.dev1 read no entry points (pyproject.toml
declares the models' for the releases that do), and none reads a task folder
from one. A wheel installs files at its root into site-packages: `build_py`
writes the .pth there for a regular install; for an editable install (PEP 660)
setuptools builds the wheel from a "strategy" object, which is wrapped so that
it writes the .pth too.
"""

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "rf_eval_lm_eval.pth"
# One line; errors are swallowed so that a broken install never breaks Python's start.
PTH_LINE = 'import sys; exec("try:\\n import rf_eval.model_adapters.startup\\nexcept Exception:\\n pass")\n'


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            with open(f"{self.build_lib}/{PTH_NAME}", "w") as f:
                f.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, f"{self.build_lib}/{PTH_NAME}"]


class _StrategyWithPth:
    def __init__(self, strategy):
        self._strategy = strategy

    def __call__(self, wheel, files, mapping):
        self._strategy(wheel, files, mapping)
        wheel.writestr(PTH_NAME, PTH_LINE)

    def __enter__(self):
        self._strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self._strategy.__exit__(*exc)


class EditableWheelWithPth(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
