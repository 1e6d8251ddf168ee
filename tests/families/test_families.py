"""Sliding-window attention: the engine attends inside each sliding layer's window, into the model's own cache."""

import pytest
import torch
import transformers as tf
from transformers.cache_utils import DynamicSlidingWindowLayer

from rf_eval.cli.check_equivalence import compare
from rf_eval.engine import Plan, extend, plain_prefill, prefill
from rf_eval.families import family_for, sliding_window
from rf_eval.ridge.maps import identity_fill
from rf_eval.testing import random_model, tiny_config

N, WINDOW, SPLIT, TAIL = 48, 16, 2, 8


@pytest.mark.parametrize(
    "config, window",
    [
        (tf.LlamaConfig(), None),
        (tf.Qwen3Config(), None),  # use_sliding_window false: sliding_window is None
        (tf.Qwen3Config(use_sliding_window=True, max_window_layers=2, num_hidden_layers=4), 4096),
        (tf.Qwen3Config(use_sliding_window=True, max_window_layers=4, num_hidden_layers=4), None),  # no sliding layer
        (tf.MistralConfig(), 4096),  # Mistral 7B v0.1
        (tf.MistralConfig(sliding_window=None), None),  # v0.2 and later
        (tf.MistralConfig(sliding_window=8192, max_position_embeddings=8192), None),  # the window covers the context
    ],
)
def test_sliding_window_of_configs(config, window):
    assert sliding_window(config) == window


#: tiny sliding-window models: Qwen3/Qwen2 with use_sliding_window (layers from max_window_layers on slide),
#: Mistral v0.1-style and Phi-3-mini-4k-style (every layer slides)
SLIDING = {
    "qwen3": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "qwen3_moe": dict(use_sliding_window=True, sliding_window=WINDOW),  # every layer slides
    "mistral": dict(sliding_window=WINDOW),
    "phi3": dict(sliding_window=WINDOW),
    "gemma3": dict(sliding_window=WINDOW),  # local layers slide, global ones do not; each kind its own RoPE
    "gpt_oss": dict(sliding_window=WINDOW),  # sliding and full layers alternate; attention sinks in both
}


def test_every_family_that_can_slide_has_a_sliding_model_here():
    """The families table (`rf-eval families`) names the sliding-window test below for every model type that
    can slide: each such family has its tiny sliding model in SLIDING, which the test runs."""
    from rf_eval.cli.families import rows

    sliding = {family for model_type, family, needs, *_ in rows() if "sliding window" in needs}
    assert sliding and sliding <= set(SLIDING), sorted(sliding - set(SLIDING))


def _model(family):
    config = tiny_config(family, vocab_size=259, **SLIDING[family])
    assert sliding_window(config) == WINDOW
    return random_model(config)


def _mask(n, window):
    """The additive mask transformers builds for a (sliding-window) causal layer, (1, 1, n, n)."""
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]


@torch.no_grad()
def _identity_reference(model, ids, exact, windowed=True):
    """The identity-fill arm from the stock decoder layers: filled rows enter each late layer as x_S."""
    n = ids.shape[1]
    x_split = model(input_ids=ids, output_hidden_states=True).hidden_states[SPLIT]
    positions = torch.arange(n)[None]
    family = family_for(model.config)
    tables = family.rope_tables(model, x_split, positions) or {None: model.model.rotary_emb(x_split, positions)}
    x_exact = x_split[:, exact]
    for layer in model.model.layers[SPLIT:]:
        rope = tables[family.rope_kind(layer)]
        x_in = x_split.clone()
        x_in[:, exact] = x_exact
        window = family.sliding_window(layer.self_attn) if windowed else None
        out = layer(x_in, attention_mask=_mask(n, window), position_ids=positions, position_embeddings=rope)
        x_exact = (out[0] if isinstance(out, tuple) else out)[:, exact]
    return family.logits(model, x_exact[:, -1:])[:, -1]


@pytest.mark.parametrize("family", sorted(SLIDING))
def test_sliding_window_models_run_filled_arms_in_their_windows(family, one_torch_thread):
    model = _model(family)
    ids = torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(0))
    ref = plain_prefill(model, ids)
    # fill off: bitwise the stock model, cache included
    assert compare(prefill(model, ids, Plan(split=3, tail=1, fill="exact")), ref) is None
    assert compare(prefill(model, ids, Plan(split=3, tail=N, fill="identity"), fill=identity_fill), ref) is None
    # every row exact through the partial path: the stock model within the engine floor
    plan = Plan(split=SPLIT, tail=TAIL, fill="identity")
    every = prefill(model, ids, plan, fill=identity_fill, select=lambda ctx: torch.arange(N - TAIL))
    torch.testing.assert_close(every.logits, ref.logits, rtol=1e-5, atol=1e-5)
    # the filled arm equals the stock layers under a windowed mask (and not under a full one)
    exact = torch.tensor([3, 20, *range(N - TAIL, N)])
    filled = prefill(model, ids, plan, fill=identity_fill, select=lambda ctx: exact[:-TAIL])
    torch.testing.assert_close(filled.logits, _identity_reference(model, ids, exact), rtol=1e-5, atol=1e-5)
    assert (filled.logits - _identity_reference(model, ids, exact, windowed=False)).abs().max() > 1e-3
    # the cache is the model's own: sliding layers are DynamicSlidingWindowLayer holding window - 1 rows
    assert type(filled.cache) is type(ref.cache)
    assert [type(a) for a in filled.cache.layers] == [type(b) for b in ref.cache.layers]
    sliding = [i for i, layer in enumerate(ref.cache.layers) if isinstance(layer, DynamicSlidingWindowLayer)]
    assert sliding and all(filled.cache.layers[i].keys.shape[2] == WINDOW - 1 for i in sliding)
    # and the stock model continues from it: decoding over the engine's all-exact cache = over the plain one
    cont = torch.randint(0, 250, (1, 4), generator=torch.Generator().manual_seed(1))
    plain_again = plain_prefill(model, ids)
    torch.testing.assert_close(extend(model, every, cont), extend(model, plain_again, cont), rtol=1e-5, atol=1e-5)


def test_attention_selectors_read_full_layers_of_a_sliding_model(tiny_model, one_torch_thread):
    """Gemma 3's tiny model alternates sliding (0, 2, ...) and full (1, 3, ...) layers: the lower-attention
    selector reads the full ones, whose cache holds every row; a sliding layer alone is refused, saying why."""
    from rf_eval.ridgefill.method import RidgeFill

    model, tok = tiny_model("gemma3")
    ids = torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(0))
    from rf_eval.selectors.registry import make_selector

    selector = make_selector("attention", share=0.1, window=8, layers=[0, 1, 2])
    picked = RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", selector=selector).prefill(ids)
    assert picked.exact_rows.numel() > TAIL
    with pytest.raises(ValueError, match="no full-attention layer among layers"):
        RidgeFill(model, tok, split=3, tail=TAIL, fill="identity", selector="attention(share=0.1;layers=0)").prefill(ids)


@pytest.mark.parametrize("setting, message", [(dict(attn_logit_softcapping=50.0), "soft-capping"),
                                              (dict(use_bidirectional_attention=True), "causal")])
def test_gemma3_configs_the_engine_cannot_run_are_refused(setting, message):
    with pytest.raises(ValueError, match=message):
        family_for(tiny_config("gemma3", vocab_size=259, **setting))


_HYBRID_FORWARD = """
import logging, sys, torch
from rf_eval.testing import random_model, tiny_config
import rf_eval.families.base
if sys.argv[1] == "unfiltered":
    logging.getLogger("transformers.integrations.hub_kernels").filters.clear()
model = random_model(tiny_config("qwen3_5", 64)).eval()
with torch.no_grad():
    model(torch.randint(0, 64, (1, 12)))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels' advice is kept where CUDA exists")
def test_a_hybrid_model_on_a_machine_without_cuda_prints_no_kernel_advice():
    """transformers' 'falling back to its reference PyTorch implementation' warnings (flash-linear-attention,
    causal-conv1d: CUDA-only kernels) do not reach a CPU machine's terminal; without the filter they would."""
    import subprocess
    import sys

    from rf_eval.families.base import KERNEL_FALLBACK

    def stderr(mode: str) -> str:
        done = subprocess.run([sys.executable, "-c", _HYBRID_FORWARD, mode], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr

    assert KERNEL_FALLBACK not in stderr("filtered")
    assert stderr("unfiltered").count(KERNEL_FALLBACK) == 2  # the test can fail: the warnings exist here


def test_the_kernel_advice_is_kept_where_cuda_exists(monkeypatch):
    import logging

    from rf_eval.families.base import KERNEL_FALLBACK, CudaOnlyKernelAdvice

    record = logging.LogRecord("transformers.integrations.hub_kernels", logging.WARNING, __file__, 1,
                               f"`chunk_gated_delta_rule` is {KERNEL_FALLBACK} because ...", None, None)
    other = logging.LogRecord("transformers.integrations.hub_kernels", logging.WARNING, __file__, 1, "x", None, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert CudaOnlyKernelAdvice().filter(record) and CudaOnlyKernelAdvice().filter(other)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not CudaOnlyKernelAdvice().filter(record) and CudaOnlyKernelAdvice().filter(other)
