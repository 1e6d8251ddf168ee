"""`rf-eval fit` and `rf-eval fit-transfer` are shells over library functions (`fit_map_files`,
`fit_transfer_file`) that the study runner calls too: every option reaches one of their arguments or a field
of their options (`FitOptions`, `TransferOptions`), and a refusal reads the same from the library as from the
command."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from rf_eval.cli import fit, fit_transfer, main
from rf_eval.errors import UserError
from rf_eval.rarecache.transfer_run import TransferOptions, fit_transfer_file
from rf_eval.ridgefill.fit_run import FitOptions, fit_map_files


def dests(module) -> set[str]:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return {a.dest for a in parser._actions if a.dest != "help"}


@pytest.mark.parametrize("module, function, options", [(fit, fit_map_files, FitOptions),
                                                       (fit_transfer, fit_transfer_file, TransferOptions)])
def test_every_option_is_a_keyword_argument(module, function, options):
    renamed = {"no_progress": "progress"}
    arguments = set(inspect.signature(function).parameters) - {"options", "given"}
    fields = {f.name for f in dataclasses.fields(options)}
    assert not arguments & fields
    assert {renamed.get(d, d) for d in dests(module)} == arguments | fields


def test_a_refusal_reads_the_same_from_the_library_and_the_command(tmp_path, capsys):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(UserError) as err:
        fit_map_files(tmp_path / "out", model="m", splits=[1])
    assert main(["fit", "--model", "m", "--splits", "1", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"rf-eval fit: error: {err.value}"
    assert "is a file; give a folder for the map files" in str(err.value)
