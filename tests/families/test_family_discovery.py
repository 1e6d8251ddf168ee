"""The family registry: every family module is found by itself, describes itself truthfully, and a new one
(a throwaway module on RF_EVAL_FAMILY_PATH) runs every engine invariant test with no other edit (in a fresh
Python, which reads the variable: tests/plugin_contracts.py)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from plugin_contracts import run_contracts

from rf_eval import families
from rf_eval.families import family_class, family_class_for, registered_families, supported_model_types
from rf_eval.testing import FAMILIES, tiny_config

ROOT = Path(__file__).resolve().parents[2]

# Llama's layers under a model type of its own (registered with transformers' Auto classes, as a
# checkpoint's own code would be), with a tiny test model of five layers.
THROWAWAY = "tinyllama_alias"
THROWAWAY_MODULE = '''
"""A throwaway family (tests/test_family_discovery.py): Llama's layers under a model type of its own."""

from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rf_eval.families.llama import Llama


class AliasConfig(LlamaConfig):
    model_type = "tinyllama_alias"


class AliasForCausalLM(LlamaForCausalLM):
    config_class = AliasConfig


AutoConfig.register("tinyllama_alias", AliasConfig)
AutoModelForCausalLM.register(AliasConfig, AliasForCausalLM)


class TinyllamaAlias(Llama):
    model_types = ("tinyllama_alias",)
    tiny_settings = dict(Llama.tiny_settings, num_hidden_layers=5)
'''


def test_every_module_of_the_package_is_a_family():
    folder = ROOT / "rf_eval" / "families"
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "base")
    assert registered_families() == tuple(modules) == FAMILIES
    assert {"llama", "qwen3", "qwen3_5", "qwen3_next", "mistral"} <= set(FAMILIES)
    with pytest.raises(ValueError, match=r"unknown family 'gpt2'; valid families: gemma3, gpt_oss, llama, "):
        family_class("gpt2")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_describes_itself_truthfully(tiny_model, family):
    cls = family_class(family)
    assert cls.__module__ == f"rf_eval.families.{family}"
    assert all(supported_model_types()[t] == family for t in cls.model_types)
    config = tiny_config(family, vocab_size=259)
    assert config.model_type == cls.model_types[0] and family_class_for(config) is cls
    # the cost-model facts are what the tiny model's layers hold
    model, _ = tiny_model(family)
    layers = model.model.layers
    attention = [layer.self_attn for layer in layers if hasattr(layer, "self_attn")]
    assert cls.linear_attention == any(cls.is_recurrent(layer) for layer in layers)
    assert all(_query_features(a) == a.config.num_attention_heads * a.head_dim * (2 if cls.gated_attention else 1)
               for a in attention)
    assert cls.moe_mlp == any(hasattr(layer.mlp, "experts") for layer in layers)


def _query_features(attn) -> int:
    """q_proj's width; a fused qkv_proj (Phi-3) holds the queries beside two K/V-wide blocks."""
    if hasattr(attn, "q_proj"):
        return attn.q_proj.out_features
    return attn.qkv_proj.out_features - 2 * attn.config.num_key_value_heads * attn.head_dim


def _with_folder(monkeypatch, folder: Path) -> None:
    """The registry also scans `folder`, as with RF_EVAL_FAMILY_PATH=folder at import."""
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(folder)])


def test_a_family_defined_twice_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "llama.py").write_text("")
    _with_folder(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match="family 'llama' is defined twice"):
        registered_families()


def test_a_model_type_claimed_twice_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "llama_twin.py").write_text("from rf_eval.families.llama import Llama\n\n\nclass Twin(Llama):\n"
                                            "    pass\n")
    (tmp_path / "not_a_family.py").write_text("X = 1\n")
    _with_folder(monkeypatch, tmp_path)
    try:
        assert "llama_twin" in registered_families()
        assert family_class("llama_twin").__name__ == "Twin"
        with pytest.raises(TypeError, match="must define exactly one Family subclass"):
            family_class("not_a_family")
        with pytest.raises(ValueError, match="model_type 'llama' is claimed by families 'llama' and 'llama_twin'"):
            supported_model_types()
    finally:
        for name in ("llama_twin", "not_a_family"):
            sys.modules.pop(f"rf_eval.families.{name}", None)


#: tests/engine/test_engine.py's invariants over every registered family (`rf_eval.testing.FAMILIES`)
ENGINE_INVARIANTS = ("test_no_filled_row_on_the_partial_path_is_the_stock_model",
                     "test_greedy_decoding_continues_from_the_filled_cache",
                     "test_filled_prefill_is_the_stock_forward_with_predicted_inputs")

#: each engine invariant called for the throwaway family, on its tiny model, if FAMILIES holds it
CONTRACTS = """
import json, sys
from pathlib import Path

from plugin_contracts import contract_module, tiny_model

from rf_eval.testing import FAMILIES

family, invariants = sys.argv[2], sys.argv[3:]
models = tiny_model(Path(sys.argv[1]) / "models")
engine = contract_module("engine/test_engine.py")
kept = []
if family in FAMILIES:
    for name in invariants:
        getattr(engine, name)(models, family)
        kept.append(name)
print(json.dumps({"families": list(FAMILIES), "kept": kept}))
"""


def test_a_new_family_module_runs_every_engine_invariant_with_no_other_edit(tmp_path):
    (tmp_path / f"{THROWAWAY}.py").write_text(textwrap.dedent(THROWAWAY_MODULE).lstrip())
    env = dict(os.environ, **{families.FAMILY_PATH_ENV: str(tmp_path)}, OMP_NUM_THREADS="1")
    (tmp_path / "contracts").mkdir()
    found = run_contracts(CONTRACTS, env, tmp_path / "contracts", args=[THROWAWAY, *ENGINE_INVARIANTS])
    assert THROWAWAY in found["families"]  # the list the invariants are parametrized over
    assert found["kept"] == list(ENGINE_INVARIANTS)
