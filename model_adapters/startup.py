"""Make the plain `lm_eval` command find rf-eval's models and tasks where lm-eval cannot discover them.

pyproject.toml declares rf-eval's models (`MODELS`) in the `lm_eval.models`
entry-point group, which lm-eval reads from the release that carries
EleutherAI/lm-evaluation-harness#4013 on (its `lm_eval.api.registry.load_plugins`).
lm-eval 0.4.13 and 0.5.0.dev1 read no entry points, and no lm-eval reads a
task folder from one; this hook fills both gaps.

Imported at every interpreter start by `rf_eval_lm_eval.pth` (installed into
site-packages by setup.py). It imports nothing but `sys` and `os` and only
puts a small finder on `sys.meta_path`. When lm-eval itself later imports

- `lm_eval.models`: where lm-eval has no entry-point discovery, the
  models of `MODELS` are registered as lazy "module:Class"
  strings (lm-eval's registry loads them on first use, so `lm_eval --model hf`
  never imports rf-eval code); where it has discovery, the hook does nothing
  and lm-eval finds the same names through the entry points;
- `lm_eval.tasks.manager`: every `TaskManager` also indexes the installed
  `rf_eval.tasks` folder (after lm-eval's own tasks and before --include_path);
- `lm_eval.tasks._index`: the task index is read from a disk cache while no YAML
  file changed (unless `RF_EVAL_TASK_INDEX_CACHE=off`) (`rf_eval.harness.task_index_cache`);
- `lm_eval.evaluator`: `simple_evaluate` first checks that rf-eval's tasks can
  get their data, before it loads the model (`rf_eval.tasks.data_needs.preflight`);
- `lm_eval._cli.harness`: under the `lm_eval` command an rf-eval `UserError`
  (bad model_args, missing data) prints as one line with exit status 2
  (`rf_eval.errors.one_line`);
- `lm_eval.loggers.evaluation_tracker`: the per-item results a run of one of
  rf-eval's models writes are sealed (sha256, size, lines) once written, so
  `rf-eval report` refuses them edited or truncated (`rf_eval.integrity.seal`).

Any failure is swallowed: this module must never break an unrelated start.
Set RF_EVAL_NO_LM_EVAL_HOOK=1 to switch it off.
"""

from __future__ import annotations

import os
import sys

# lm-eval model name -> "module:object": every name is the one adapter, `PrefillLM`, with its default method
# (`rf_eval.methods.MODELS`; a new prefill method needs no name here). pyproject.toml's
# [project.entry-points."lm_eval.models"] declares the same (tests/test_packaging.py checks they agree).
MODELS = {name: f"rf_eval.model_adapters.prefill_lm:{name}" for name in ("ridgefill", "rarecache", "drop", "prefill")}


def has_model_discovery(registry) -> bool:
    """Whether this lm-eval reads the `lm_eval.models` entry points itself (EleutherAI/lm-evaluation-harness#4013)."""
    return callable(getattr(registry, "load_plugins", None))


def _register_models(module) -> None:
    from lm_eval.api import registry

    if has_model_discovery(registry):  # our entry points serve: register nothing twice
        return
    model_registry = registry.model_registry
    for name, target in MODELS.items():
        if name not in model_registry:
            model_registry.register(name, target=target)


def tasks_dir() -> str | None:
    """The installed `rf_eval.tasks` folder (the repository's tasks/ under an editable install)."""
    from importlib.util import find_spec

    spec = find_spec("rf_eval.tasks")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def _add_tasks_folder(module) -> None:
    manager = module.TaskManager
    original = manager.__init__
    if getattr(original, "_rf_eval", False):
        return

    def __init__(self, verbosity=None, include_path=None, *args, **kwargs):
        folder = tasks_dir()
        if folder:
            given = include_path if isinstance(include_path, (list, tuple)) else [include_path] if include_path else []
            if all(os.path.abspath(str(p)) != folder for p in given):
                include_path = [folder, *given]
        original(self, verbosity, include_path, *args, **kwargs)

    __init__._rf_eval = True
    __init__.__wrapped__ = original
    manager.__init__ = __init__


class _Lazy:
    """The hook that calls "module:function" (imported only then) with the lm-eval module just loaded."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __call__(self, module) -> None:
        from importlib import import_module

        module_name, function = self.target.split(":")
        getattr(import_module(module_name), function)(module)


def _one_line_errors(module) -> None:
    from rf_eval.errors import one_line

    cli = module.HarnessCLI
    if not getattr(cli.execute, "_rf_eval", False):
        cli.execute = one_line(cli.execute)


_HOOKS = {
    "lm_eval.models": _register_models,
    "lm_eval.tasks.manager": _add_tasks_folder,
    "lm_eval.tasks._index": _Lazy("rf_eval.harness.task_index_cache:wrap_build"),  # unless RF_EVAL_TASK_INDEX_CACHE=off
    "lm_eval.evaluator": _Lazy("rf_eval.tasks.data_needs:check_before_model"),
    "lm_eval._cli.harness": _one_line_errors,
    "lm_eval.loggers.evaluation_tracker": _Lazy("rf_eval.integrity.seal:wrap_tracker"),
}


class _Loader:
    """Wraps a module's loader: run the module, then our hook (errors in the hook are ignored)."""

    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception:  # never break lm-eval because of rf-eval
            pass


class _Finder:
    """A meta-path finder that answers only for the watched lm-eval modules."""

    _busy = False

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname not in _HOOKS or cls._busy:
            return None
        cls._busy = True
        try:
            for finder in sys.meta_path:
                if finder is cls or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, _HOOKS[fullname])
                    return spec
            return None
        except Exception:
            return None
        finally:
            cls._busy = False


def install() -> None:
    if os.environ.get("RF_EVAL_NO_LM_EVAL_HOOK") or _Finder in sys.meta_path:
        return
    for name, hook in _HOOKS.items():  # lm-eval already imported (e.g. startup order): hook it now
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
    sys.meta_path.insert(0, _Finder)


try:
    install()
except Exception:  # pragma: no cover - a broken hook must not break Python
    pass
