"""Every public path on every registered family, so that no family is half-supported (issue #18).

One test per family runs: the map fit with the held-out lambda choice, the ridge/identity/nofill arms
and their continuation, every selector of `rf_eval.selectors`' registry, the corrections that apply
(value/key rescale; the terminal-state fit and correction where the family has Gated DeltaNet layers),
the three splices, and RaReCache where the family is attention-only (a clear refusal elsewhere).
Tiny models, short prompts. Each prefill, and the stock model's continuation from it, is checked against
the engine-free reference of `filled_reference` (the stock forward with the rows the arm filled replaced
in late layers: x̂_l = A_l x_S + b_l from the fitted maps' tensors, x_S, absent, rescaled, spliced, or
RaReCache's mapped K/V): filled rows' K/V bitwise, the rest within the kernel floor. Beside it, the Gated
DeltaNet inputs a family reads are checked against what transformers' own module feeds its delta rule.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from filled_reference import FLOOR, affine, assert_matches, reference, split_state, stock_kv

from rf_eval.cli import main as cli_main
from rf_eval.engine import decoder_layers, plain_prefill
from rf_eval.families import family_class, family_for, registered_families, sliding_window
from rf_eval.fields import ArmError
from rf_eval.rarecache.budget import layer_budget
from rf_eval.rarecache.features import cache_entries, prefill_cache, unsupported
from rf_eval.rarecache.fit import fit_transfer
from rf_eval.rarecache.maps import SIDES
from rf_eval.rarecache.method import RaReCache
from rf_eval.ridge.maps import load_maps
from rf_eval.ridge.state_correction import load_table
from rf_eval.ridgefill.fitting import fit_maps
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.selectors.registry import SELECTORS, names_for
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
    "tsp": "tsp(keep=16;layer=1)",  # FastKV's rule; layer 1: an attention layer below the split in every family
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
    assert set(SELECTOR_SPECS) == set(names_for("ridgefill"))
    assert set(SELECTORS) == set(names_for("ridgefill")) | set(names_for("rarecache"))


def check_result(result, n: int, tail: int = TAIL) -> None:
    assert result.logits.shape[0] == 1 and torch.isfinite(result.logits).all()
    prefix = n - result.plan.tail
    assert result.plan.tail >= tail
    assert torch.equal(result.exact_rows[-result.plan.tail:], torch.arange(prefix, n))


def filled_rows(result, n: int) -> torch.Tensor:
    """The prompt rows a prefill filled (not in its exact rows)."""
    exact = torch.zeros(n, dtype=torch.bool)
    exact[result.exact_rows] = True
    return (~exact).nonzero().squeeze(1)


def check_arm(model, ids, result, predict, *, map_split, kv=None, absent=False, bitwise=True, split=SPLIT):
    """A prefill of `ids` against the engine-free reference (`filled_reference`) with the rows it filled:
    filled rows' late K/V bitwise (with `bitwise`), every cache tensor and the logits within the floor."""
    filled = filled_rows(result, ids.shape[1])
    assert filled.numel() > 0
    logits, cache = reference(model, ids, split, filled, predict, map_split=map_split, kv=kv, absent=absent)
    assert_matches(result.cache, result.logits, cache, logits[:, -1], filled, split,
                   kept=result.exact_rows if absent else None, bitwise=bitwise)
    return filled, cache


def continue_by_hand(model, cache, token: torch.Tensor, position: int) -> torch.Tensor:
    """The stock model's logits for one more token reading a cache built without the engine."""
    with torch.no_grad():
        return model(input_ids=token, cache=cache, use_cache=True, position_ids=torch.tensor([[position]])).logits


def predicted_kv(model, ids, predict) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Every late attention layer's K/V of every row computed from x̂_l (every row filled)."""
    predicted = {}

    def record(layer, k, v):
        predicted[layer] = (k, v)
        return k, v

    reference(model, ids, SPLIT, torch.arange(ids.shape[1]), predict, map_split=False, kv=record)
    return predicted


def rescaled(predicted, part: str, c: int, prefix_end: int):
    """value/key rescale (paper section 2.3) as a `reference` kv hook, with no selector (the filled rows are
    the prefix): per KV head, the mean over the first c tail rows of |exact| / |predicted| (norms of that
    part; `predicted_kv`), times the filled rows' part."""
    side, rows = (1 if part == "values" else 0), torch.arange(prefix_end, prefix_end + c)

    def kv(layer, k, v):
        pair = [k, v]
        ratio = pair[side][:, :, rows].norm(dim=-1) / predicted[layer][side][:, :, rows].norm(dim=-1)
        pair[side][:, :, :prefix_end] *= ratio.mean(-1)[..., None, None]
        return tuple(pair)

    return kv


def spliced(stock_pairs, part: str, prefix_end: int):
    """A splice (paper section 6.6) as a `reference` kv hook: the filled rows' keys/values are the stock ones."""

    def kv(layer, k, v):
        if part in ("keys", "both"):
            k[:, :, :prefix_end] = stock_pairs[layer][0][:, :, :prefix_end]
        if part in ("values", "both"):
            v[:, :, :prefix_end] = stock_pairs[layer][1][:, :, :prefix_end]
        return k, v

    return kv


def substituted(held, filled: torch.Tensor):
    """A `reference` kv hook that puts `held` K/V in the filled rows (RaReCache's mapped rows)."""

    def kv(layer, k, v):
        k[:, :, filled], v[:, :, filled] = held[layer][0][:, :, filled], held[layer][1][:, :, filled]
        return k, v

    return kv


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
    stock = plain_prefill(model, ids)
    predicts = {"ridge": affine(maps), "identity": split_state, "nofill": None}
    for fill, map_split in [(fill, False) for fill in fills] + [("ridge", True)]:
        rf = RidgeFill(model, tok, fill=fill, maps=maps if fill == "ridge" else None, split=SPLIT, tail=TAIL,
                       map_split=map_split)
        result = rf.prefill(ids[:, :-1], held_back=1)
        check_result(result, n - 1, TAIL - 1)
        filled, cache = check_arm(model, ids[:, :-1], result, predicts[fill], map_split=map_split,
                                  absent=fill == "nofill")
        logits = rf.extend(result, ids[:, -1:])
        if fill == "nofill":  # the reference cache holds the filled rows (masked): run prompt and token at once
            want, cache = reference(model, ids, SPLIT, filled, absent=True)
        else:
            want = continue_by_hand(model, cache, ids[:, -1:], n - 1)
        assert (want[:, -1] - stock.logits).abs().max() > 1e-3, fill  # the fill matters at this tolerance
        torch.testing.assert_close(logits[:, -1], want[:, -1], rtol=0, atol=1e-4)
        kept = torch.cat([result.exact_rows, torch.tensor([n - 1])]) if fill == "nofill" else None
        assert_matches(result.cache, logits[:, -1], cache, want[:, -1], filled, SPLIT, kept=kept, bitwise=False,
                       atol=1e-4)
    assert RidgeFill(model, tok, fill="ridge", maps=maps, tail=n).is_plain(n)

    # every selector of the registry
    for name, spec in SELECTOR_SPECS.items():
        arm = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, selector=spec, map_split=False)
        result = arm.prefill(ids)
        check_result(result, n)
        if name not in ("longer_tail", "special", "lexical_net"):
            assert result.exact_rows.numel() > TAIL, name
        check_arm(model, ids, result, affine(maps), map_split=False)

    # corrections and splices
    uncorrected = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, map_split=False).prefill(ids)
    predicted = predicted_kv(model, ids, affine(maps))
    for part in ("values", "keys"):
        spec = f"{part[:-1]}_rescale(c=4)"
        result = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, corrections=spec,
                           map_split=False).prefill(ids)
        check_result(result, n)
        kv = rescaled(predicted, part, c=4, prefix_end=n - TAIL)
        check_arm(model, ids, result, affine(maps), map_split=False, kv=kv, bitwise=False)
        if part == "values":  # the correction did something (a QK-norm family's key norms are its norm weight's)
            assert (result.logits - uncorrected.logits).abs().max() > 1e-4, spec
    stock_pairs = stock_kv(model, ids)
    for part in ("keys", "values", "both"):
        result = RidgeFill(model, tok, fill="ridge", maps=maps, tail=TAIL, splice=part, map_split=False).prefill(ids)
        check_result(result, n)
        check_arm(model, ids, result, affine(maps), map_split=False, kv=spliced(stock_pairs, part, n - TAIL))
        if part == "both" and not cls.linear_attention:  # exact keys and values everywhere: the exact arm
            torch.testing.assert_close(result.logits, stock.logits, rtol=0, atol=FLOOR)

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
        assert set(rf.arm.correction_objs[0].last_rho) == set(delta)
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
    target_pairs = stock_kv(target, ids)
    entries = dict(zip(SIDES, cache_entries(source, family_for(source.config), prefill_cache(source, ids))))
    mapped = None
    for selector in names_for("rarecache"):
        rc = RaReCache(target, tok, source=source, maps=transfer, source_tokenizer=tok, rho=0.3, selector=selector)
        result = rc.prefill(ids)
        # the mapped rows hold the map's K/V of the source's stock cache at their own positions (not the target's
        # own K/V); the recomputed rows and the logits are the stock target's reading them
        split = layer_budget(0.3, len(target_pairs)) if selector == "layer-prefix" else 0
        filled = filled_rows(result, n)
        mapped = mapped or rc.mapper.map_prompt(entries, score=False)
        held = {i: (layer.keys.clone(), layer.values.clone())
                for i, layer in enumerate(result.cache.layers) if i >= split}
        for index, (k, v) in held.items():
            assert (k[:, :, filled] - target_pairs[index][0][:, :, filled]).abs().max() > 1e-3, (selector, index)
            for got, want in zip((k, v), (mapped.keys[index], mapped.values[index])):
                torch.testing.assert_close(got[:, :, filled], want[:, :, filled], rtol=0, atol=FLOOR)
        kv = substituted(held, filled)
        _, cache = check_arm(target, ids, result, None, map_split=False, kv=kv, split=split)
        logits = rc.extend(result, ids[:, -1:])
        torch.testing.assert_close(logits, continue_by_hand(target, cache, ids[:, -1:], n), rtol=0, atol=1e-4)


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
