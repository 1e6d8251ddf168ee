"""`rf_eval.engine.shared_lower`: a prompt's layers 0..S-1, run by one arm and read back by the next arm of
the same block (`shared_rows.shared_rows`, as `InProcessLauncher` runs a study's arms), bit for bit what
that arm computes alone, and its seconds charged to it."""

from __future__ import annotations

import pytest
import torch

from rf_eval.cli.check_equivalence import compare
from rf_eval.engine import AbsentRows, Plan, decoder_layers, prefill, shared_rows
from rf_eval.methods.requests import timed_prefill
from rf_eval.ridge.maps import identity_fill
from rf_eval.ridgefill.method import RidgeFill

N = 40
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(seed))


def identity_arm(model, ids, split=3, **plan):
    return prefill(model, ids, Plan(split=split, tail=4, fill="identity", **plan), fill=identity_fill)


def nofill_arm(model, ids, split=3, **kwargs):
    return prefill(model, ids, Plan(split=split, tail=8, fill="nofill"), fill=AbsentRows(), **kwargs)


def first_layer_runs(model) -> list[int]:
    runs: list[int] = []
    decoder_layers(model)[0].register_forward_pre_hook(lambda *_: runs.append(1))
    return runs


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_later_arm_reads_the_lower_layers_back_bit_for_bit(tiny_model_dir, family):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(family)).eval()  # its own: a hook goes on it
    ids = prompt()
    alone = nofill_arm(model, ids)  # outside a block: its own pass, nothing kept
    runs = first_layer_runs(model)
    with shared_rows.shared_rows() as store:
        first = identity_arm(model, ids)  # runs the pass and keeps it
        later = nofill_arm(model, ids)  # another fill, tail and strategy over the same lower layers
    (kept,) = store.entries.values()
    assert len(runs) == 1 and store.passes == 1  # layer 0 ran for the first arm only
    assert compare(later, alone) is None and later.exact_rows.tolist() == alone.exact_rows.tolist()
    assert first.timings["reused"] == 0 and later.timings["reused"] == kept.seconds > 0
    assert not shared_rows.active()


def test_the_seconds_read_back_are_in_the_arms_measured_prefill(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt(1)
    with shared_rows.shared_rows() as store:
        timed_prefill(RidgeFill(model, tok, fill="identity", split=3, tail=4), ids)
        result, cost = timed_prefill(RidgeFill(model, tok, fill="nofill", split=3, tail=8), ids)
    (kept,) = store.entries.values()
    assert result.timings["reused"] == kept.seconds and cost.prefill_seconds > kept.seconds


@pytest.mark.parametrize("change", ["split", "tokens", "chunk size", "threads", "capture", "outside a block"])
def test_the_pass_is_read_back_only_for_the_same_split_tokens_chunks_and_threads(tiny_model, change):
    """Each change makes the second arm run its own pass; a capturing arm (a selector that reads lower-layer
    inputs) runs its own and keeps it for an arm after it."""
    model, _ = tiny_model("llama")
    ids = prompt(2)
    if change == "outside a block":
        identity_arm(model, ids)  # nothing kept
    with shared_rows.shared_rows() as store:
        if change != "outside a block":
            identity_arm(model, ids, chunk_size=16 if change == "chunk size" else None)
        if change == "threads":
            torch.set_num_threads(2)
        second = nofill_arm(model, prompt(3) if change == "tokens" else ids, split=2 if change == "split" else 3,
                            capture={1: slice(0, 4)} if change == "capture" else None)
        assert second.timings["reused"] == 0 and store.passes == 0
        if change == "capture":
            assert nofill_arm(model, ids).timings["reused"] > 0 and store.passes == 1


@pytest.mark.parametrize("family", ["gemma3", "qwen3_5"])
def test_sliding_window_and_recurrent_lower_layers_are_not_shared(tiny_model, family):
    """Their lower layers keep state beside keys and values (a window, a recurrent state): each arm runs its
    own pass."""
    model, _ = tiny_model(family)
    ids = prompt(4)
    with shared_rows.shared_rows() as store:
        identity_arm(model, ids)
        assert nofill_arm(model, ids).timings["reused"] == 0
    assert store.entries == {} and store.passes == 0


class FixedClock:
    """A Stopwatch that always reads one second."""

    def __init__(self, device):
        self.seconds = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.seconds = 1.0


def test_a_batch_charges_each_prompt_its_own_pass_read_back(tiny_model, monkeypatch):
    """`batched_prefills` of two prompts whose arm prefills them one by one (a selector's rows are per
    prompt): each prompt is charged half the batch's clock plus the whole pass it read back."""
    import rf_eval.methods.requests as method_module

    model, tok = tiny_model("llama")
    prompts = [prompt(2)[0].tolist(), prompt(3)[0].tolist()]
    rows = RidgeFill(model, tok, fill="nofill", split=3, tail=8, selector="random(share=0.1)")
    assert not rows.arm.batches
    monkeypatch.setattr(method_module, "Stopwatch", FixedClock)
    with shared_rows.shared_rows() as store:
        for ids in prompts:
            prefill_arm = RidgeFill(model, tok, fill="identity", split=3, tail=4)
            prefill_arm.prefill(torch.tensor([ids]))  # keeps each prompt's pass
        out = list(method_module.batched_prefills(rows, prompts, None, batch_size=2))
    assert store.passes == 2 and len(out) == 2
    for _, result, cost in out:
        assert result.timings["reused"] > 0 and "batch" not in result.timings
        assert cost.prefill_seconds == pytest.approx(0.5 + result.timings["reused"])


def test_one_engine_call_over_a_batch_charges_each_prompt_half_the_pass(tiny_model, monkeypatch):
    """Two prompts in one engine call read back one pass of both: each is charged half of it."""
    import rf_eval.methods.requests as method_module

    model, tok = tiny_model("llama")
    prompts = [prompt(4)[0].tolist(), prompt(5)[0].tolist()]
    monkeypatch.setattr(method_module, "Stopwatch", FixedClock)
    with shared_rows.shared_rows() as store:
        first = RidgeFill(model, tok, fill="identity", split=3, tail=4)
        list(method_module.batched_prefills(first, prompts, None, batch_size=2))  # keeps the batch's pass
        later = RidgeFill(model, tok, fill="nofill", split=3, tail=8)
        out = list(method_module.batched_prefills(later, prompts, None, batch_size=2))
    assert store.passes == 1 and len(out) == 2
    for _, result, cost in out:
        assert result.timings["batch"] == 2 and result.timings["reused"] > 0
        assert cost.prefill_seconds == pytest.approx(0.5 + result.timings["reused"] / 2)
