"""`RidgeFill.from_pretrained(device_map=...)`: accelerate's big-model dispatch with CPU and disk offload; the
engine runs each late layer on its execution device and the filled arm's logits are the undispatched model's."""

import pytest
import torch

from rf_eval.engine import execution_device
from rf_eval.ridgefill.method import RidgeFill

ARM = dict(fill="identity", split=2, tail=8, device="cpu", dtype="float32")


def offloading_map(n_layers: int) -> dict[str, str]:
    """Embedding, norm, head and the lower layers in memory; the late layers on CPU offload and on disk."""
    placed = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    for i in range(n_layers):
        placed[f"model.layers.{i}"] = "cpu" if i < 2 else "disk"
    return placed


@pytest.mark.parametrize("family", ["llama", "phi3", "olmo2", "qwen3_5"])
def test_a_dispatched_model_gives_the_undispatched_logits(tiny_model_dir, family, tmp_path, one_torch_thread):
    folder = tiny_model_dir(family)
    plain = RidgeFill.from_pretrained(folder, **ARM)
    dispatched = RidgeFill.from_pretrained(folder, **ARM, device_map=offloading_map(6), offload_folder=tmp_path)
    assert dispatched.model.hf_device_map["model.layers.5"] == "disk"
    late = dispatched.model.model.layers[4]
    assert next(late.parameters()).device.type == "meta"  # offloaded: loaded by accelerate's hooks when run
    assert execution_device(late) == torch.device("cpu")
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(0))
    want, got = plain.prefill(ids), dispatched.prefill(ids)
    assert want.exact_rows.numel() == 8  # 32 filled rows in every late layer
    assert torch.equal(got.logits, want.logits)
    assert torch.equal(dispatched.generate(ids, max_new_tokens=4, do_sample=False),
                       plain.generate(ids, max_new_tokens=4, do_sample=False))
