"""The data rf-eval's tasks download, one plug-in per piece (a `DataSource`, `base`), found by name with no
list to edit (the one plug-in pattern, `rf_eval.plugins`): the modules of this package (`essays`,
`punkt_tab`, `squad`, `hotpotqa`, `longbench_v2`), those of the folders in `RF_EVAL_DATA_SOURCE_PATH`
(separated like PATH, read when the package is first imported; they import as
`rf_eval.tasks.data_sources.<module>`), the classes of installed packages' `rf_eval.data_sources` entry
points, and classes given to `register_source`. A source declares which tasks need it, how to fetch it,
how a run finds it and how a data folder's copy is checked; `rf-eval fetch-data`, the preflight checks and
the tasks read it here (`rf_eval.tasks.data`, `data_fetch`, `data_needs`). So a new piece is one file.
"""

from __future__ import annotations

from rf_eval.plugins import Discovery, PluginError, Registry
from rf_eval.tasks.data_sources.base import DataSource

SOURCE_PATH_ENV = "RF_EVAL_DATA_SOURCE_PATH"
ENTRY_POINTS = "rf_eval.data_sources"


def _check(cls: type[DataSource], where: str) -> None:
    """A source's contract beyond its name: what it is, where it lands, which tasks need it, how to fetch it."""
    for field in ("what", "path", "host"):
        if not getattr(cls, field, ""):
            raise PluginError(f"{where}: data source {cls.name!r} must set {field}")
    if cls.needed_by is DataSource.needed_by and not (cls.task_classes or cls.ruler_tasks):
        raise PluginError(f"{where}: data source {cls.name!r} must say which tasks need it (task_classes, "
                          "ruler_tasks, or needed_by)")
    if cls.fetch is DataSource.fetch:
        raise PluginError(f"{where}: data source {cls.name!r} must define fetch(folder)")


#: every data source by name (`rf_eval.plugins.Registry`)
SOURCES: Registry[DataSource] = Registry("data source", DataSource, __name__,
                                         Discovery(env=SOURCE_PATH_ENV, group=ENTRY_POINTS,
                                                   skip=("base", "ruler_qa")), check=_check)


def source(name: str) -> DataSource:
    """The data source `name`."""
    return SOURCES[name]()


def register_source(cls: type[DataSource]) -> type[DataSource]:
    """Add a data source class at run time (a test's throwaway; a notebook's own). Returns `cls`."""
    return SOURCES.register(cls)


def unregister_source(name: str) -> None:
    """Remove a data source `register_source` added."""
    SOURCES.unregister(name)
