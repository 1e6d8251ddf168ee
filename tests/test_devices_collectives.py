"""Collectives on CPU tensors under a GPU backend go through a gloo group (NCCL reduces CUDA tensors only)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from rf_eval import devices


def test_cpu_tensors_under_nccl_reduce_through_one_gloo_group(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        seen = []
        real = dist.all_reduce
        monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: (seen.append(kw.get("group")), real(t, **kw)))
        t = torch.tensor([3.0], dtype=torch.float64)
        devices.all_reduce(t)  # gloo: the default group
        assert seen == [None] and t.item() == 3.0
        monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")
        devices.all_reduce(t)
        devices.all_reduce(t, op=dist.ReduceOp.MAX)
        assert seen[1] is not None and seen[2] is seen[1]  # one gloo group, made once
        assert t.item() == 3.0
    finally:
        devices._GLOO.clear()
        dist.destroy_process_group()
