"""Fills are plugins (`rf_eval.fills`): found by the registry, each checked by the engine invariants.

Every fill from predicted inputs, the ones the package ships and a throwaway one registered at run
time by this module, runs the same invariants with no other edit: the partial path with no filled row is
the stock model; a filled prefill is the stock forward with the filled rows' late inputs replaced by the
method's prediction (`filled_reference`); every prefix row selected exact is the stock model again.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from filled_reference import assert_matches, reference
from warm_start import run_argv

from rf_eval.cli import main
from rf_eval.cli.check_equivalence import compare
from rf_eval.cli.fills import BEGIN, END, rows, table, with_table
from rf_eval.engine import Plan, plain_prefill, prefill
from rf_eval.fills import FILL_OFF, arm_fills, fill_named, register_fill, registered_fills, unregister_fill
from rf_eval.fills.base import Fill
from rf_eval.ridgefill.method import RidgeFill

ROOT = Path(__file__).resolve().parents[2]
N, SPLIT, TAIL = 40, 3, 6


class Throwaway(Fill):
    """A fill no module defines: late layer l's filled rows read x_S scaled by 1 - l/100."""

    name = "throwaway"
    summary = "x_S scaled per layer (a test's own fill)"

    def fill_fn(self, maps, dtype, device):
        return lambda layer, x: x * (1.0 - layer / 100.0)


@pytest.fixture
def throwaway():
    register_fill(Throwaway)
    yield Throwaway.name
    unregister_fill(Throwaway.name)


@pytest.fixture(scope="module")
def maps_for(tiny_model, tmp_path_factory):
    """Maps fitted on a tiny model at SPLIT, for the methods that read maps."""
    from rf_eval.ridge.maps import load_maps
    from rf_eval.ridgefill.fitting import fit_maps

    made = {}

    def get(family):
        if family not in made:
            model, tok = tiny_model(family)
            out = tmp_path_factory.mktemp(f"maps_{family}")
            cal = out / "cal.txt"
            cal.write_text("the cat sat on the mat and the dog ran to the red house by the river " * 8)
            fit_maps(model, tok, splits=[SPLIT], calibration=[str(cal)], lambdas=[0.03], out=out / "maps",
                     progress=False)
            made[family] = load_maps(out / "maps", SPLIT)
        return made[family]

    return get


def predicting() -> list[str]:
    return [n for n in registered_fills() if fill_named(n).strategy == "inputs"]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("name", [*predicting(), Throwaway.name])
def test_every_fill_from_predicted_inputs_keeps_the_engine_invariants(tiny_model, maps_for, throwaway, family, name):
    model, tok = tiny_model(family)
    method = fill_named(name)
    maps = maps_for(family) if method.needs_maps else None
    param = next(model.parameters())
    fill = method.fill_fn(maps, param.dtype, param.device)
    ids = torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(3))
    stock = plain_prefill(model, ids)
    # no filled row, on the partial path: the stock model bitwise
    covered = prefill(model, ids, Plan(SPLIT, tail=N, fill=name), fill=fill, select=lambda ctx: torch.zeros(0).long())
    assert covered.timings.get("late", 0) > 0 and compare(covered, stock) is None
    # filled rows read the method's prediction: the stock forward with their late inputs replaced
    plan = Plan(SPLIT, tail=TAIL, fill=name)
    got = prefill(model, ids, plan, fill=fill)
    filled = torch.arange(N - TAIL)
    logits, cache = reference(model, ids, SPLIT, filled, fill)
    assert (logits[:, -1] - stock.logits).abs().max() > 1e-3  # the fill is read
    assert_matches(got.cache, got.logits, cache, logits[:, -1], filled, SPLIT)
    # every prefix row selected exact: the fill is never read
    every = prefill(model, ids, plan, fill=fill, select=lambda ctx: filled)
    assert compare(every, stock) is None
    # the public API builds the same arm from the name alone
    api = RidgeFill(model, tok, fill=name, split=SPLIT, tail=TAIL, maps=maps)
    assert api.provenance()["fill"] == name
    assert torch.equal(api.prefill(ids).logits, got.logits)


def test_a_throwaway_fill_is_a_valid_arm_only_while_registered(tiny_model, throwaway):
    from rf_eval.fields import ArmError
    from rf_eval.ridgefill.arm_spec import RidgeFillArm

    assert throwaway in arm_fills() and RidgeFillArm(fill=throwaway).fill_obj.name == throwaway
    unregister_fill(throwaway)
    with pytest.raises(ArmError, match="fill='throwaway' is not valid; valid fills: exact, identity"):
        RidgeFillArm(fill=throwaway)
    register_fill(Throwaway)


class NoName(Fill):
    summary = "no name"


class BadStrategy(Fill):
    name = "bad_strategy"
    strategy = "magic"


class Exact(Fill):
    name = FILL_OFF


class Twin(Fill):
    name = "ridge"

    def fill_fn(self, maps, dtype, device):
        return lambda layer, x: x


class NoFillFunction(Fill):
    name = "no_fill_function"


class KvWithoutRowFill(Fill):
    name = "kv_without_row_fill"
    strategy = "kv"


@pytest.mark.parametrize("cls, message", [
    (NoName, "must define a Fill subclass that sets name"),
    (BadStrategy, "strategy 'magic' is not one of inputs, absent, kv"),
    (Exact, "'exact' is the fill switched off, not a fill's name"),
    (Twin, "fill 'ridge' is already registered (rf_eval.fills.ridge)"),
    (int, "must define a Fill subclass"),
    (NoFillFunction, "fill 'no_fill_function' (strategy 'inputs') must define fill_fn (or bind)"),
    (KvWithoutRowFill, "fill 'kv_without_row_fill' (strategy 'kv') must define row_fill"),
])  # fmt: skip
def test_the_registry_refuses_a_bad_fill_method(cls, message):
    with pytest.raises((TypeError, ValueError)) as err:
        register_fill(cls)
    assert message in str(err.value)
    assert registered_fills() == ("identity", "kv_ridge", "nofill", "ridge", "swiftkv", "swiftkv_released")


def test_entry_points_add_fill_methods(monkeypatch):
    import rf_eval.fills as fills
    from rf_eval import plugins

    class FromAPackage(Fill):
        name = "from_a_package"
        strategy = "absent"

    class EntryPoint:
        name, value = "from_a_package", "a_package.fills:FromAPackage"

        def load(self):
            return FromAPackage

    monkeypatch.setattr(plugins, "entry_points", lambda group: [EntryPoint()] if group == fills.ENTRY_POINTS else [])
    fills.FILLS.refresh()
    try:
        assert "from_a_package" in registered_fills() and isinstance(fill_named("from_a_package"), FromAPackage)
    finally:
        monkeypatch.undo()
        fills.FILLS.refresh()
    assert "from_a_package" not in registered_fills()


def test_the_readme_table_is_current_and_the_command_prints_it(tmp_path, capsys):
    readme = (ROOT / "README.md").read_text()
    assert with_table(readme) == readme, "run `rf-eval fills --readme README.md`"
    assert readme.count(BEGIN) == readme.count(END) == 1
    assert [r[0] for r in rows()] == [f"`{n}`" for n in arm_fills()]
    assert main(["fills"]) == 0
    assert capsys.readouterr().out == table()


def _string_literals(path: Path) -> set[str]:
    """The string constants of a module's code, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_a_fill_name_is_a_literal_only_in_its_own_file():
    """Nothing outside a fill's module branches on its name: a new fill needs no other edit (#25 item 1)."""
    package = [p for folder in ("rf_eval", "model_adapters", "tasks", "stats", "reports")
               for p in (ROOT / folder).rglob("*.py")]
    own = {fill_named(n).__class__.__module__.rsplit(".", 1)[-1]: n for n in registered_fills()}
    found = []
    for path in package:
        if path.parent == ROOT / "rf_eval" / "fills" and own.get(path.stem) is not None:
            allowed = {own[path.stem]}
        else:
            allowed = set()
        found += [f"{path.relative_to(ROOT)}: {name!r}" for name in (_string_literals(path) & set(own.values()))
                  if name not in allowed]
    assert not found, found


def test_a_ragged_cache_is_refused_where_it_cannot_decode_and_decodes_where_it_is_allowed(tiny_model_dir):
    """nofill's late layers hold only the exact rows. Under SDPA one decoded query attends without a mask,
    so it decodes (the control); eager attention adds the lower layers' full-length mask to every layer and
    fails on it, so the arm is refused before any prompt runs, naming the hf model_arg that fixes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.engine import extend
    from rf_eval.fields import ArmError

    path = tiny_model_dir("llama")
    tok = AutoTokenizer.from_pretrained(path)
    ids = torch.randint(3, 200, (1, N), generator=torch.Generator().manual_seed(0))
    plan = Plan(split=SPLIT, tail=TAIL, fill="nofill")
    results = {}
    for attn in ("sdpa", "eager"):
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn).eval()
        result = prefill(model, ids[:, :-1], plan, fill_named("nofill").row_fill(None))
        assert result.ragged
        try:
            results[attn] = extend(model, result, ids[:, -1:])
        except RuntimeError as err:  # the mask of the prompt's length added to the late layers' shorter keys
            results[attn] = err
        if attn == "eager":
            with pytest.raises(ArmError, match="eager attention cannot decode from .*attn_implementation=sdpa"):
                RidgeFill(model, tok, fill="nofill", split=SPLIT, tail=TAIL)
        else:
            RidgeFill(model, tok, fill="nofill", split=SPLIT, tail=TAIL)  # allowed
    assert isinstance(results["sdpa"], torch.Tensor) and torch.isfinite(results["sdpa"]).all()
    assert isinstance(results["eager"], RuntimeError), "eager decodes a ragged cache now: drop the refusal"


@pytest.mark.parametrize("source, says", [
    ("def broken(:\n", "fill module {folder}/broken.py (on RF_EVAL_FILL_PATH) does not import (SyntaxError"),
    ("import no_such_module_anywhere\n", "does not import (ModuleNotFoundError: No module named"),
    ("from rf_eval.fills.base import Fill\n\nclass Half(Fill):\n    name = 'half'\n",
     "fill 'half' (strategy 'inputs') must define fill_fn (or bind)"),
])
def test_a_broken_fill_plugin_is_one_line_even_for_another_fill(tmp_path, source, says):
    """A plugin folder on RF_EVAL_FILL_PATH is read when the registry is: a module that does not import, or a
    class that could not run, is refused in one line naming the file, before any request."""
    import os
    import sys

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "broken.py").write_text(source)
    env = {**os.environ, "RF_EVAL_FILL_PATH": str(folder)}
    done = run_argv([sys.executable, "-m", "rf_eval", "fills"], env=env, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and says.format(folder=folder) in done.stderr
