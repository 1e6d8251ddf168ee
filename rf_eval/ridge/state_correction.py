"""Terminal-state correction for Gated DeltaNet layers: rho, its bound, and the Delta-M fit.

Paper section 2.3 and appendix H. Without the delta rule's erase term a
layer's state after the n prefix rows is M_n = sum_j w_j u_j with
w_j = prod_{k>j} g_k (the gates after row j; the last row's weight is 1).
rho = sum_{j filled} w_j / sum_j w_j is the filled rows' share of that state;
the correction adds rho * Delta-M once, at the end of the prefix. The gates
are the layer's own, g = exp(-exp(A_log) * softplus(a + dt_bias)) per value
head and row, from the inputs the fill computes anyway. The derivation is
per head (one gate per head and token), so rho is computed per value head;
the paper's rho_l is that vector. The gate inputs come from the model's family
(`Family.log_gates`: Qwen3.5's separate projections, Qwen3-Next's fused ones).

Delta-M (per layer and value head, a d_k x d_v matrix) is the mean of
M_exact - M_filled over states read every `every` (2,048) tokens of
calibration prompts kept apart from the maps' text: M_exact from the layer's
true inputs, M_filled from the fill's predicted inputs for every row (a fully
filled prefix, which is what Delta-M estimates). `rf-eval
fit-state-correction` writes `state_correction_split{S}.safetensors`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine import FillFn, decoder_layers
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT
from rf_eval.families import family_for
from rf_eval.files.tensor_files import read_tensors, save_tensors
from rf_eval.ridge.capture import run_with_layer_hooks
from rf_eval.ridge.maps import config_hash


def filled_share(log_g: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """sum_{j filled} w_j / sum_j w_j at the last row, w_j = prod_{k>j} g_k; per head (log_g: rows x heads)."""
    if log_g.dim() == 1:
        log_g = log_g[:, None]
    cum = log_g.double().cumsum(0)
    log_w = cum[-1:] - cum  # log of the product of the gates after each row
    filled = filled.to(torch.bool).to(log_w.device)
    if not filled.any():
        return torch.zeros(log_w.shape[1], dtype=torch.float64, device=log_w.device)
    return torch.exp(torch.logsumexp(log_w[filled], 0) - torch.logsumexp(log_w, 0))


def share_bound(gamma: float, m: int) -> float:
    """Appendix H: with every gate <= gamma and the last m rows exact, the filled share is <= gamma^m/(1-gamma)."""
    if not 0 <= gamma < 1 or m < 0:
        raise ValueError(f"need 0 <= gamma < 1 and m >= 0; got gamma={gamma}, m={m}")
    return gamma**m / (1 - gamma)


def filename(split: int) -> str:
    return f"state_correction_split{split}.safetensors"


def save_table(delta: dict[int, torch.Tensor], meta: dict[str, str], out: str | Path, split: int) -> Path:
    out = Path(out)
    path = out / filename(split) if out.suffix != ".safetensors" else out
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_tensors({f"dM.{layer}": t.float() for layer, t in delta.items()}, path, {**meta, "split": split})


def load_table(path: str | Path, split: int | None = None) -> tuple[dict[int, torch.Tensor], dict[str, str]]:
    """Delta-M per layer, (value heads, d_k, d_v), and the file's metadata."""
    p = Path(path)
    if p.is_dir():
        if split is None:
            files = sorted(p.glob("state_correction_split*.safetensors"))
            if len(files) != 1:
                raise ValueError(f"{p}: give the state-correction file itself (found {len(files)} candidates)")
            p = files[0]
        else:
            p = p / filename(split)
    if not p.is_file():
        raise FileNotFoundError(f"no state-correction file at {p} (write one with `rf-eval fit-state-correction`)")
    tensors, meta = read_tensors(p, ValueError, "state-correction file")
    delta = {int(k.split(".")[1]): t for k, t in tensors.items() if k.startswith("dM.")}
    if "split" not in meta or not delta:
        raise ValueError(f"{p} is not an rf-eval state-correction file")
    return delta, meta


def _states(mixer: nn.Module, h: torch.Tensor, index: int, config, every: int) -> list[torch.Tensor]:
    """The recurrent state after every `every` rows (the stock mixer, carried across chunks)."""
    cache = DynamicCache(config=config)
    states = []
    for start in range(0, h.shape[1] - every + 1, every):
        mixer(hidden_states=h[:, start : start + every], cache=cache, attention_mask=None)
        states.append(cache.get_recurrent_state(index)[0].double().clone())
    return states


@torch.no_grad()
def fit_delta(
    model: nn.Module, documents: Iterable[torch.Tensor], split: int, fill: FillFn, every: int = 2048,
    map_split: bool = DEFAULT_MAP_SPLIT,
) -> tuple[dict[int, torch.Tensor], int]:
    """Mean exact-minus-filled state per late Gated DeltaNet layer, and the number of states per layer.

    Appendix H. Filled inputs are the engine's: fill(l, x_S), at layer S too with
    `map_split` (the arm's field), else x_S itself there.
    """
    family = family_for(model.config)
    layers = decoder_layers(model)
    late = [i for i in range(split, len(layers)) if family.is_recurrent(layers[i])]
    if not late:
        raise ValueError("the model has no Gated DeltaNet layer above the split: no state to correct")
    sums: dict[int, torch.Tensor] = {}
    count = {"states": 0}
    keep: dict[str, torch.Tensor] = {}

    def hook(index: int, x: torch.Tensor, _kwargs: dict) -> None:
        if index == split:
            keep["x"] = x
        if index not in late:
            return
        layer = layers[index]
        x_hat = keep["x"] if index == split and not map_split else fill(index, keep["x"])
        exact = _states(layer.linear_attn, layer.input_layernorm(x), index, model.config, every)
        filled = _states(layer.linear_attn, layer.input_layernorm(x_hat), index, model.config, every)
        for e, f in zip(exact, filled):
            sums[index] = sums.get(index, 0) + (e - f)
        if index == late[0]:
            count["states"] += len(exact)

    for input_ids in documents:
        run_with_layer_hooks(model, input_ids, split, hook)
    if not count["states"]:
        raise ValueError(f"no calibration prompt reaches {every} tokens: no state was measured (lower --every)")
    return {i: (sums[i] / count["states"]).float() for i in late}, count["states"]


def table_metadata(model: nn.Module, fill_name: str, maps_sha: str, every: int, states: int, docs_sha: str,
                   map_split: bool = DEFAULT_MAP_SPLIT) -> dict[str, str]:
    """What a Delta-M file records: the model, fill, maps and `map_split` it was fitted for."""
    return {"config_hash": config_hash(model.config), "fill": fill_name, "maps_sha256": maps_sha,
            "every": str(every), "states": str(states), "calibration_sha256": docs_sha,
            "map_split": str(bool(map_split)).lower(), "kind": "rf-eval-state-correction/1"}
