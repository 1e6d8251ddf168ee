"""Every public path on every registered family, so that no family is half-supported (issue #18).

One test per family runs: the map fit with the held-out lambda choice, the ridge/identity/nofill arms
and their continuation, every selector of `rf_eval.selectors`' registry, the corrections that apply
(value/key rescale; the terminal-state fit and correction where the family has Gated DeltaNet layers),
the three splices, and RaReCache where the family is attention-only (a clear refusal elsewhere).
Tiny models, short prompts. Beside it, the Gated DeltaNet inputs a family reads are checked against
what transformers' own module feeds its delta rule.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from rf_eval.cli import main as cli_main
from rf_eval.engine import decoder_layers
from rf_eval.families import family_class, family_for, registered_families, sliding_window
from rf_eval.fields import ArmError
from rf_eval.rarecache.api import RaReCache
from rf_eval.rarecache.features import unsupported
from rf_eval.rarecache.fit import fit_transfer
from rf_eval.rarecache.selectors import SELECTORS as TRANSFER_SELECTORS
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.ridgefill.fitting import fit_maps
from rf_eval.ridgefill.maps import load_maps
from rf_eval.ridgefill.state_correction import load_table
from rf_eval.selectors.registry import SELECTORS
from rf_eval.testing import make_tiny_pair

SPLIT, TAIL = 3, 8
TEXT = ("<|im_start|>user\nThe Vault code of Blue-Falcon is 48213, kept by Ms Quill. "
        "What is the code?<|im_end|>\n<|im_start|>assistant\n")
BASE = "attention(layers=1;window=8)"  # layer 1 is an attention layer in every tiny model, below the split
#: one spec per registered selector: a new selector must be added here (the test checks the names)
SELECTOR_SPECS = {
    "attention": BASE,
    "question_hidden": "question_hidden(layers=1;window=8)",
    "random": f"random(seed=1;of={BASE})",
    "longer_tail": f"longer_tail(of={BASE})",
    "probe": "probe(rows=16;layers=1;window=8)",
    "protected": "protected",
    "lexical_net": "lexical_net",
    "special": "special",
    "union": "special+protected",
}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("every_family_text")
    words = "river stone lamp seven blue quiet market paper ladder window forty north clock garden".split()
    paths = {}
    for name, seed, count in (("calibration", 0, 3), ("heldout", 1, 1), ("state", 2, 2)):
        g = torch.Generator().manual_seed(seed)
        files = []
        for i in range(count):
            path = folder / f"{name}{i}.txt"
            idx = torch.randint(0, len(words), (24,), generator=g).tolist()
            path.write_text(" ".join(words[j] for j in idx) + ".\n")
            files.append(str(path))
        paths[name] = files
    return paths


def test_every_registered_selector_has_a_spec_here():
    assert set(SELECTOR_SPECS) == set(SELECTORS)


def check_result(result, n: int, tail: int = TAIL) -> None:
    assert result.logits.shape[0] == 1 and torch.isfinite(result.logits).all()
    prefix = n - result.plan.tail
    assert result.plan.tail >= tail
    assert torch.equal(result.exact_rows[-result.plan.tail:], torch.arange(prefix, n))


@pytest.mark.parametrize("family", registered_families())
def test_every_public_path(family, tiny_model, tiny_model_dir, texts, tmp_path):
    model, tok = tiny_model(family)
    cls = family_class(family)
    ids = tok(TEXT, return_tensors="pt").input_ids
    n = ids.shape[1]

    # fit maps, lambda chosen on held-out text
    fit = fit_maps(model, tok, splits=[SPLIT], calibration=texts["calibration"], heldout=texts["heldout"],
                   lambdas=[1e-3, 1e-1], out=tmp_path / "maps", progress=False)
    assert set(fit.scores[SPLIT]) == {1e-3, 1e-1} and all(0 < s <= 1 for s in fit.scores[SPLIT].values())
    maps = load_maps(tmp_path / "maps", SPLIT)
    assert maps.layers == list(range(SPLIT, model.config.num_hidden_layers))

    # the arms, and the stock model continuing from their cache
    fills = ("ridge", "identity", "nofill")
    if sliding_window(model.config) is not None:  # nofill is refused there, before any prompt runs
        with pytest.raises(ArmError, match="fill=nofill leaves late layers with fewer rows"):
            RidgeFill(model, tok, fill="nofill", split=SPLIT, tail=TAIL)
        fills = ("ridge", "identity")
    for fill in fills:
        rf = RidgeFill(model, tok, fill=fill, maps=maps if fill == "ridge" else None, split=SPLIT, tail=TAIL)
        result = rf.prefill(ids[:, :-1], held_back=1)
        check_result(result, n - 1, TAIL - 1)
        assert torch.isfinite(rf.extend(result, ids[:, -1:])).all()
    assert RidgeFill(model, tok, fill="ridge", maps=maps, tail=n).is_plain(n)

    # every selector of the registry
    for name, spec in SELECTOR_SPECS.items():
        arm = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, selector=spec)
        result = arm.prefill(ids)
        check_result(result, n)
        if name not in ("longer_tail", "special", "lexical_net"):
            assert result.exact_rows.numel() > TAIL, name

    # corrections and splices
    for spec in ("value_rescale(c=4)", "key_rescale(c=4)"):
        check_result(RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, corrections=spec).prefill(ids), n)
    for splice in ("keys", "values", "both"):
        check_result(RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, splice=splice).prefill(ids), n)

    # terminal state where the family has Gated DeltaNet layers
    recurrent = [i for i, layer in enumerate(decoder_layers(model)) if family_for(model.config).is_recurrent(layer)]
    assert bool(recurrent) == cls.linear_attention
    if cls.linear_attention:
        out = tmp_path / "dm"
        assert cli_main(["fit-state-correction", "--model", tiny_model_dir(family), "--maps", str(tmp_path / "maps"),
                         "--calibration", *texts["state"], "--out", str(out), "--every", "16", "--device", "cpu",
                         "--no-progress"]) == 0
        delta, meta = load_table(out)
        assert sorted(delta) == [i for i in recurrent if i >= SPLIT] and meta["map_split"] == "false"
        assert all(d.abs().max() > 0 for d in delta.values())
        spec = f"terminal_state(path={out / f'state_correction_split{SPLIT}.safetensors'})"
        rf = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, corrections=spec)
        corrected = rf.prefill(ids)
        check_result(corrected, n)
        plain = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL).prefill(ids)
        assert not torch.equal(corrected.logits, plain.logits)
        assert set(rf.arm.corrections[0].last_rho) == set(delta)
        with pytest.raises(ValueError, match="map_split"):
            RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, corrections=spec, map_split=True)

    # RaReCache where it can map the family's cache; elsewhere its refusal (a hybrid holds no per-token cache
    # entry, a sliding window keeps only the last rows, several RoPE tables cannot be undone as one)
    reason = unsupported(model.config, "source")
    if reason is not None:
        with pytest.raises(ValueError) as refused:
            fit_transfer(model, model, tok, tok, texts["calibration"], k=2, rank=8)
        assert str(refused.value) == reason
        return
    from transformers import AutoModelForCausalLM

    source_dir, target_dir = make_tiny_pair(family, tmp_path / "pair")
    source = AutoModelForCausalLM.from_pretrained(source_dir).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    transfer, _ = fit_transfer(source, target, tok, tok, texts["calibration"], k=2, rank=8)
    for selector in TRANSFER_SELECTORS:
        rc = RaReCache(target, source, tok, maps=transfer, source_tokenizer=tok, rho=0.3, selector=selector)
        result = rc.prefill(ids)
        assert torch.isfinite(result.logits).all(), selector
        assert torch.isfinite(rc.extend(result, ids[:, -1:])).all(), selector


HYBRIDS = [name for name in registered_families() if family_class(name).linear_attention]


@pytest.mark.parametrize("family", HYBRIDS)
def test_delta_inputs_are_what_the_module_feeds_its_delta_rule(family, tiny_model, monkeypatch):
    """Family.delta_inputs / log_gates against transformers' own Gated DeltaNet forward: after the module's
    short convolution our q/k/v are its q/k/v, sigmoid(b) its beta, and log_gates its g."""
    model, _ = tiny_model(family)
    fam = family_for(model.config)
    layer = next(layer for layer in decoder_layers(model) if fam.is_recurrent(layer))
    mixer = layer.linear_attn
    modeling = importlib.import_module(type(mixer).__module__)
    seen = {}
    original = modeling.torch_chunk_gated_delta_rule

    def record(query, key, value, g, beta, **kwargs):
        seen.update(query=query, key=key, value=value, g=g, beta=beta)
        return original(query, key, value, g=g, beta=beta, **kwargs)

    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", record)
    h = layer.input_layernorm(torch.randn(1, 12, model.config.hidden_size))
    with torch.no_grad():
        mixer(hidden_states=h, cache=None, attention_mask=None)
        qkv, b, a = fam.delta_inputs(mixer, h)
        conv = F.silu(mixer.conv1d(qkv.transpose(1, 2))[..., : h.shape[1]]).transpose(1, 2)
        log_g = fam.log_gates(mixer, h)
    q, k, v = torch.split(conv, [mixer.key_dim, mixer.key_dim, mixer.value_dim], -1)
    torch.testing.assert_close(q, seen["query"].reshape(q.shape), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k, seen["key"].reshape(k.shape), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, seen["value"].reshape(v.shape), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.sigmoid(b), seen["beta"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(log_g, seen["g"][0].double(), rtol=1e-6, atol=1e-7)
