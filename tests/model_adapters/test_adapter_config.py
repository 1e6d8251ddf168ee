"""model_args of `--model ridgefill`: parsed once, typed, and refused early when wrong."""

from __future__ import annotations

import pytest
from adapter_helpers import identity_maps

from rf_eval.model_adapters.config import ModelArgsError, RidgeFillConfig, parse_model_args
from rf_eval.model_adapters.ridgefill import RidgeFillLM


def parse(args, extra=None) -> RidgeFillConfig:
    return parse_model_args(RidgeFillConfig, args, extra)


def test_values_are_typed_and_lm_eval_flags_merge():
    cfg = parse("pretrained=/m,fill=identity,tail=16,split=3,dtype=float32", {"batch_size": "4", "device": "cpu"})
    assert (cfg.tail, cfg.split, cfg.batch_size, cfg.device, cfg.dtype) == (16, 3, 4, "cpu", "float32")
    # model_args win over lm-eval's flags; None flags are ignored
    cfg = parse({"pretrained": "/m", "fill": "exact", "batch_size": 2}, {"batch_size": 8, "max_batch_size": None})
    assert cfg.batch_size == 2 and cfg.max_batch_size is None
    assert parse("pretrained=/m,fill=exact", {"batch_size": "auto:4"}).continuation_batch == 1
    with pytest.raises(AttributeError):
        cfg.tail = 3  # frozen


@pytest.mark.parametrize(
    "args, message",
    [
        ("pretrained=/m,fill=exact,tial=3", "unknown model_args key(s): 'tial'; valid keys: pretrained, tokenizer"),
        ("pretrained=/m", "missing required model_args key(s): fill"),
        ("pretrained=/m,fill=ridge", "fill=ridge needs maps="),
        ("pretrained=/m,fill=rigde", "fill='rigde' is not valid; valid fills: exact, nofill, identity, ridge"),
        ("pretrained=/m,fill=exact,tail=0", "tail must be >= 1"),
        ("pretrained=/m,fill=exact,tail=abc", "tail='abc' has the wrong type; expected int"),
        ("pretrained=/m,fill=exact,dtype=float8", "dtype='float8' is not valid"),
        ("pretrained=/m,fill=exact,reference=ridge", "reference='ridge' is not valid; valid: exact"),
        ("pretrained=/m,fill=exact,batch_size=lots", "batch_size='lots'"),
        ("pretrained=/m,fill=ridge,maps=/nowhere", "maps='/nowhere': map path /nowhere does not exist"),
        ("pretrained=/m,fill=identity,selector=atention", "selector='atention': unknown selector 'atention'"),
        ("pretrained=/m,fill=identity,corrections=rescale(c=4)", "corrections='rescale(c=4)': unknown correction"),
        ("pretrained=/m,fill=identity,splice=queries", "splice='queries' is not valid; valid splices: keys"),
        ("pretrained=/m,fill=nofill,splice=keys", "they need fill=identity or ridge, not fill=nofill"),
        ("pretrained=/m,fill=identity,cost_match=ridge", "cost_match lengthens a nofill arm's tail"),
    ],
)
def test_bad_model_args_name_the_key(args, message):
    with pytest.raises(ModelArgsError) as err:
        parse(args)
    assert message in str(err.value)


def test_maps_contradictions_fail_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    llama, qwen = tiny_model_dir("llama"), tiny_model_dir("qwen3")
    maps = identity_maps(llama, 3, tmp_path / "maps")
    with pytest.raises(ModelArgsError, match="split=2 contradicts the maps, fitted for split 3"):
        parse(f"pretrained={llama},fill=ridge,maps={maps},split=2")
    with pytest.raises(ModelArgsError, match="no maps for split 2"):
        parse(f"pretrained={llama},fill=ridge,maps={maps.parent},split=2")

    import transformers

    def no_weights(*a, **k):
        raise AssertionError("the model weights were loaded before the model_args were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(ModelArgsError, match="fitted for another model"):
        RidgeFillLM.create_from_arg_string(f"pretrained={qwen},fill=ridge,maps={maps}")
    with pytest.raises(ModelArgsError, match="split=6 is outside 1..5"):
        RidgeFillLM.create_from_arg_string(f"pretrained={llama},fill=identity,split=6")
    with pytest.raises(ModelArgsError, match="unknown model_args key"):
        RidgeFillLM.create_from_arg_obj({"pretrained": llama, "fill": "exact", "selector_args": "share=0.1"})


def test_demo_is_the_default_model_and_brings_its_maps(monkeypatch, tmp_path):
    """No pretrained (or pretrained=demo): the demo model, and for fill=ridge the demo's maps."""
    from rf_eval import demo, demo_model
    from rf_eval.model_adapters.config import RidgeFillConfig, parse_model_args

    model_dir = tmp_path / "cache" / "demo-model" / "m"
    maps_dir = tmp_path / "maps"
    monkeypatch.setattr(demo_model, "resolve_pretrained", lambda name, log=None: str(model_dir))
    monkeypatch.setattr(demo, "demo_maps", lambda d, s: maps_dir)
    seen = {}
    monkeypatch.setattr(RidgeFillConfig, "check", lambda self: seen.setdefault("cfg", self))
    for given in ({}, {"pretrained": "demo"}, {"pretrained": "DEMO", "fill": "ridge"}):
        cfg = parse_model_args(RidgeFillConfig, given)
        assert (cfg.pretrained, cfg.fill, cfg.maps, cfg.split) == (str(model_dir), "ridge", str(maps_dir), demo.SPLIT)
    cfg = parse_model_args(RidgeFillConfig, {"pretrained": "demo", "fill": "identity", "split": 5})
    assert (cfg.fill, cfg.maps, cfg.split) == ("identity", None, 5)
    cfg = parse_model_args(RidgeFillConfig, {"pretrained": "/m", "fill": "exact"})
    assert cfg.pretrained == "/m"
