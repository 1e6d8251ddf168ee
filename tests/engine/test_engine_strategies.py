"""The engine's row-fill strategies one by one, and the engine package's shape (small functions, one-way imports)."""

import ast
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch

import rf_eval.engine as engine
from rf_eval.engine import (
    AbsentRows,
    Corrected,
    LateLayerHooks,
    LayerInputs,
    LayerStep,
    MappedKV,
    Plan,
    Precomputed,
    PredictedInput,
    Rows,
    decoder_layers,
    exact_row_set,
    family_for,
    late_layers,
    new_cache,
    plain_prefill,
    prefill,
    run_layers,
    run_lower_layers,
)
from rf_eval.ridge.maps import identity_fill

N, TAIL, SPLIT = 48, 8, 3
SELECTED = torch.tensor([2, 9, 30])


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


def scaled_fill(layer, x):
    """A deterministic non-identity fill (a ridge-like arm without fitting)."""
    return x * (1.0 + 0.05 * layer)


class Sweep:
    """The lower layers of one prompt, and late-layer sweeps over them under a strategy."""

    def __init__(self, model, plan=None, ids=None):
        self.model, self.plan = model, plan or Plan(SPLIT, TAIL, "ridge")
        self.ids = prompt() if ids is None else ids
        self.family = family_for(model.config)
        self.exact = exact_row_set(self.ids.shape[1], self.plan, SELECTED, "cpu")

    @torch.no_grad()
    def run(self, fill, exact=None):
        """(last layer's output for the exact rows, cache) under `fill`."""
        cache = new_cache(self.model)
        inputs, _ = run_lower_layers(self.model, self.ids, self.plan.split, cache)
        out = late_layers(self.model, self.family, self.plan, inputs, cache,
                          self.exact if exact is None else exact, fill)
        return out, cache

    @torch.no_grad()
    def precomputed(self, source, rows):
        """A Precomputed holding `source`'s K/V of rows 0..rows-1 in every late attention layer (as the probe does)."""
        inputs, _ = run_lower_layers(self.model, self.ids, self.plan.split, new_cache(self.model))
        n = self.ids.shape[1]
        step = LayerStep(self.family, decoder_layers(self.model), self.plan, inputs,
                         Rows(torch.arange(rows, n), torch.arange(rows), torch.arange(n)), None)
        held = Precomputed(source, rows)
        for index in self.attention_layers():
            held.keep(index, source.filled_kv(step, index), n)
        return held

    def attention_layers(self):
        layers = decoder_layers(self.model)
        return [i for i in range(self.plan.split, len(layers)) if not self.family.is_recurrent(layers[i])]


def tensors(cache):
    from rf_eval.cli.check_equivalence import cache_tensors

    return cache_tensors(cache)


def assert_same(a, b):
    """Bitwise the same sweep result: output rows and every cache tensor."""
    assert torch.equal(a[0], b[0])
    ta, tb = tensors(a[1]), tensors(b[1])
    assert len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb))


# -- predicted input --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_predicted_input_filled_kv_is_what_the_layer_caches(tiny_model, family):
    """PredictedInput.filled_kv (filled rows alone) = the K/V its sweep caches for them (all rows at once)."""
    model, _ = tiny_model(family)
    sweep = Sweep(model)
    source = PredictedInput(scaled_fill)
    _, cache = sweep.run(source)
    held = sweep.precomputed(source, N - TAIL)
    filled = torch.ones(N, dtype=torch.bool)
    filled[sweep.exact] = False
    for index in sweep.attention_layers():
        k, v = held.kv[index]
        torch.testing.assert_close(cache.layers[index].keys[:, :, filled], k[:, :, filled], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(cache.layers[index].values[:, :, filled], v[:, :, filled], rtol=1e-6, atol=1e-6)


def test_layer_s_reads_the_split_state(tiny_model):
    """The default: layer S's filled rows read x_S (computed exactly), later layers the fill."""
    model, _ = tiny_model("llama")
    sweep = Sweep(model, Plan(SPLIT, TAIL, "ridge"))
    assert not sweep.plan.map_split
    step = LayerStep(sweep.family, decoder_layers(model), sweep.plan, None, None, None)
    x = torch.randn(1, 4, 8)
    fill = PredictedInput(scaled_fill)
    assert fill.predict(step, SPLIT, x) is x
    assert torch.equal(fill.predict(step, SPLIT + 1, x), scaled_fill(SPLIT + 1, x))


def test_layer_s_reads_its_map_with_map_split(tiny_model):
    """map_split=true (the paper's released maps cover layers S..L-1): layer S reads fill(S, x_S)."""
    model, _ = tiny_model("llama")
    sweep = Sweep(model, Plan(SPLIT, TAIL, "ridge", map_split=True))
    step = LayerStep(sweep.family, decoder_layers(model), sweep.plan, None, None, None)
    x = torch.randn(1, 4, 8)
    fill = PredictedInput(scaled_fill)
    assert torch.equal(fill.predict(step, SPLIT, x), scaled_fill(SPLIT, x))
    assert torch.equal(fill.predict(step, SPLIT + 1, x), scaled_fill(SPLIT + 1, x))


# -- precomputed K/V ----------------------------------------------------------------------------------


def assert_close(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-5)
    ta, tb = tensors(a[1]), tensors(b[1])
    assert len(ta) == len(tb)
    for x, y in zip(ta, tb):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_precomputed_equals_its_source_on_the_same_rows(tiny_model, family):
    """Precomputed K/V = the predicted-input sweep they came from, up to rounding.

    Not bitwise: the source projects every row of a layer in one call, the held
    K/V were projected apart from the exact rows (the probe's sweep), and a
    matmul may round a row differently in a batch of another size.
    """
    model, _ = tiny_model(family)
    sweep = Sweep(model)
    source = PredictedInput(scaled_fill)
    held = sweep.precomputed(source, N - TAIL)
    assert sorted(held.kv) == sweep.attention_layers()
    assert_close(sweep.run(held), sweep.run(source))
    assert held.kv == {}  # every held layer was taken (its tensors became the cache's)


def test_precomputed_equals_mapped_kv_of_the_same_tensors(tiny_model):
    """Precomputed and MappedKV given the same filled K/V write the same cache and output, bitwise.

    Both write the exact rows' own K/V beside the given ones (`exact_rows_beside`).
    """
    model, _ = tiny_model("llama")
    sweep = Sweep(model)
    held = sweep.precomputed(PredictedInput(scaled_fill), N - TAIL)
    copies = {index: (k.clone(), v.clone()) for index, (k, v) in held.kv.items()}
    mapped = MappedKV(lambda index, rows: (copies[index][0][:, :, rows], copies[index][1][:, :, rows]))
    assert_same(sweep.run(held), sweep.run(mapped))


def test_precomputed_that_misses_a_filled_row_runs_its_source(tiny_model):
    model, _ = tiny_model("qwen3_5")
    sweep = Sweep(model)
    source = PredictedInput(scaled_fill)
    held = sweep.precomputed(source, 20)  # filled rows up to N - TAIL - 1: not covered
    assert_same(sweep.run(held), sweep.run(source))
    assert sorted(held.kv) == sweep.attention_layers()  # nothing taken


def test_precomputed_is_laid_only_over_its_own_fill():
    source = PredictedInput(scaled_fill)
    held = Precomputed(source, 10)
    assert held.over(PredictedInput(scaled_fill)) is held
    for other in (PredictedInput(identity_fill), AbsentRows(), Corrected(source, LateLayerHooks())):
        assert held.over(other) is other


# -- no fill, mapped K/V ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_nofill_is_a_sweep_that_never_sees_the_filled_rows(tiny_model, family):
    """AbsentRows with exact rows E = every row exact in a prompt of rows E alone (at their positions), bitwise."""
    model, _ = tiny_model(family)
    sweep = Sweep(model, Plan(SPLIT, TAIL, "nofill"))
    absent = sweep.run(AbsentRows())
    e = sweep.exact
    with torch.no_grad():
        cache = new_cache(model)
        inputs, _ = run_lower_layers(model, sweep.ids, SPLIT, cache)
        only = LayerInputs(inputs.x_split[:, e], inputs.cos[:, e], inputs.sin[:, e])
        rows = torch.arange(e.numel())
        step = LayerStep(sweep.family, decoder_layers(model), sweep.plan, only, Rows(rows, rows[:0], rows), cache)
        alone = run_layers(step, PredictedInput(None), only.x_split), cache
    assert_same(absent, alone)
    for index in sweep.attention_layers():
        assert absent[1].layers[index].keys.shape[2] == e.numel()


def test_mapped_kv_writes_its_rows_and_refuses_recurrent_layers(tiny_model):
    model, _ = tiny_model("llama")
    ids = prompt()
    ref = plain_prefill(model, ids)
    exact_kv = MappedKV(lambda index, rows: (ref.cache.layers[index].keys[:, :, rows],
                                             ref.cache.layers[index].values[:, :, rows]))
    plan = Plan(split=0, tail=TAIL, fill="mapped")
    got = prefill(model, ids, plan, fill=exact_kv, select=lambda ctx: SELECTED)
    filled = torch.ones(N, dtype=torch.bool)
    filled[got.exact_rows] = False
    for index, layer in enumerate(got.cache.layers):
        assert torch.equal(layer.keys[:, :, filled], ref.cache.layers[index].keys[:, :, filled])
        assert torch.equal(layer.values[:, :, filled], ref.cache.layers[index].values[:, :, filled])
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5, atol=1e-5)  # exact K/V in: the exact model
    with pytest.raises(ValueError, match="needs its mapped keys and values"):
        prefill(model, ids, plan)
    qwen, _ = tiny_model("qwen3_5")
    with pytest.raises(ValueError, match="needs attention layers"):
        prefill(qwen, ids, plan, fill=MappedKV(lambda index, rows: None))


# -- corrections wrap a strategy ------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_wrapping_with_identity_adjustments_is_the_unwrapped_strategy(tiny_model, family):
    model, _ = tiny_model(family)
    sweep = Sweep(model)
    source = PredictedInput(scaled_fill)
    want = sweep.run(source)
    assert_same(sweep.run(Corrected(source, LateLayerHooks())), want)
    assert_same(sweep.run(Corrected(source, LateLayerHooks(kv=lambda view, k, v: (k, v)))), want)
    nofill = Sweep(model, Plan(SPLIT, TAIL, "nofill"))
    assert_same(nofill.run(Corrected(AbsentRows(), LateLayerHooks(kv=lambda view, k, v: (k, v)))), nofill.run(AbsentRows()))


def test_a_wrapper_sees_the_filled_rows_and_changes_only_them(tiny_model):
    model, _ = tiny_model("llama")
    sweep = Sweep(model)
    source = PredictedInput(scaled_fill)
    _, plain = sweep.run(source)

    def halve(view, k, v):
        v[:, :, view.filled] = v[:, :, view.filled] * 0.5
        return k, v

    _, halved = sweep.run(Corrected(source, LateLayerHooks(kv=halve)))
    first = SPLIT  # the first late layer's K/V come before any change reaches the exact rows
    filled = torch.ones(N, dtype=torch.bool)
    filled[sweep.exact] = False
    assert torch.equal(halved.layers[first].values[:, :, filled], plain.layers[first].values[:, :, filled] * 0.5)
    assert torch.equal(halved.layers[first].values[:, :, ~filled], plain.layers[first].values[:, :, ~filled])
    with pytest.raises(ValueError, match="predicted inputs"):
        Corrected(MappedKV(lambda index, rows: None), LateLayerHooks())


# -- the probe hands its K/V to the engine as a strategy ----------------------------------------------------


def test_the_probe_hands_a_precomputed_strategy(tiny_model):
    from rf_eval.selectors import Probe, Request

    model, tok = tiny_model("llama")
    ids = prompt()
    plan = Plan(split=4, tail=24, fill="identity")  # the probe rows lie in the tail: every filled row is held
    req = Request(model, tok, ids, plan, identity_fill, {"unigram": torch.ones(len(tok), dtype=torch.int64)})
    probe = Probe(rows=16, window=8, layers=(3,))
    wanted = probe.captures(req)
    req.capture_start = {k: a for k, (a, _) in wanted.items()}
    seen = {}

    def select(ctx):
        seen["selection"] = probe.select(req.attach(ctx))
        return seen["selection"]

    prefill(model, ids, plan, fill=identity_fill, select=select, capture={k: slice(a, b) for k, (a, b) in wanted.items()})
    held = seen["selection"].fill
    assert isinstance(held, Precomputed) and held.source == PredictedInput(identity_fill)
    assert held.rows == N - 24 and held.kv == {}  # the engine took every layer's K/V


# -- the package's shape ------------------------------------------------------------------------------


def engine_modules():
    names = [engine.__name__] + [f"{engine.__name__}.{m.name}" for m in pkgutil.iter_modules(engine.__path__)]
    return [importlib.import_module(name) for name in names]


def own_functions(module):
    """(qualified name, function) for every function and method defined in `module`, generated ones included."""
    for name, obj in vars(module).items():
        if inspect.isfunction(obj) and obj.__module__ == module.__name__:
            yield name, inspect.unwrap(obj)
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            for attr, member in vars(obj).items():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    yield f"{name}.{attr}", inspect.unwrap(member)


def test_no_engine_function_has_more_than_seven_parameters():
    counts = {}
    for module in engine_modules():
        for name, fn in own_functions(module):
            params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls", "_cls")]
            counts[f"{module.__name__}.{name}"] = len(params)
    assert counts, "no functions found"
    assert {name: c for name, c in counts.items() if c > 7} == {}
    assert counts["rf_eval.engine.prefill"] <= 7 and counts["rf_eval.engine.layers.late_layers"] <= 7


def imports_of(module) -> set[str]:
    """rf_eval modules that `module` imports anywhere (TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rf_eval"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rf_eval"))
    return found


def test_engine_imports_go_one_way():
    """The engine reads model families, the fills registry for a plan's fill name (`rf_eval.fills`, whose
    fill modules reach the engine's strategies only inside their functions), and two leaf modules for the
    lower layers a block of arms shares (`shared_lower`: the block's store, whose keys are the weights' sha256,
    `rf_eval.integrity.weights`, and the synchronised timer, `rf_eval.prefill_timer`); inside it, modules import
    each other without a cycle."""
    assert importlib.util.find_spec("rf_eval.hooks") is None
    graph = {}
    for module in engine_modules():
        deps = imports_of(module)
        outside = {d for d in deps if not d.startswith("rf_eval.engine")}
        assert outside <= {"rf_eval.families", "rf_eval.fills", "rf_eval.fills.identity", "rf_eval.integrity.weights",
                           "rf_eval.prefill_timer"}, (module.__name__, outside)
        graph[module.__name__] = {d for d in deps if d.startswith("rf_eval.engine")} - {module.__name__}
    done, visiting = set(), []

    def visit(name):
        assert name not in visiting, f"import cycle: {' -> '.join(visiting + [name])}"
        if name in done:
            return
        visiting.append(name)
        for dep in graph.get(name, ()):
            visit(dep)
        visiting.pop()
        done.add(name)

    for name in graph:
        visit(name)
    assert "rf_eval.engine" not in set().union(*(graph[m] for m in graph if m != "rf_eval.engine"))
