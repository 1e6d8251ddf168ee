"""Speculative Prefill (Liu et al., 2025): a small speculator of the same tokenizer picks the rows the target
prefills.

The authors' rule (Jingyu6/speculative_prefill, `look_ahead_spec_worker.py`,
the `*_full_lah8` configurations): the speculator prefills the whole prompt
and decodes `lookahead` - 1 (7) more tokens greedily; the queries (after RoPE)
of the last prompt token and of each look-ahead token, in every speculator
layer and head, attend over the prompt's keys alone (softmax of the scaled
logits over the N prompt keys, fp32); the [layers x heads x lookahead x N]
scores are smoothed along the tokens by an average pool of 13 (padding 6,
counted), reduced by the max over layers and heads together, then the mean
over the look-ahead rows. The prompt is cut into chunks of 32 rows scored by
their mean; the top ceil(keep_share x chunks) chunks (keep_share 0.1 in the
authors' example) are kept whole, in order. The target prefills those rows
alone at their original positions. No row is forced in.

Decoding: the authors' scheduler counts all N prompt tokens as computed
(`spec_prefill_worker.py`, `_record_and_update_requests`; `input_builder.py`
numbers a decode step from that count), so the first token is sampled from
the last kept row's logits and every token after the prompt runs at its own
position, from N on, whether or not the prompt's last row was kept
(`continues_at_prompt_end`: continuations scored and generated tokens alike).
The speculator's look-ahead stops at its end-of-sequence token as theirs does.
The cost charges the speculator's prefill and look-ahead steps and the
target's prefill of the kept rows (the scoring's dot products are left out,
as the attention selectors' are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rf_eval.cost.mac_model import layer_costs, prefill_macs
from rf_eval.drop.base import Dropper, DropperArm
from rf_eval.engine import decoder_layers, new_cache
from rf_eval.families import family_for, sliding_window
from rf_eval.fields import ArmError
from rf_eval.integrity.tokenizers import check_tokenizers

__all__ = ["SpeculativePrefill"]

POOL = 13
#: the authors' example share of the chunks kept
DEFAULT_KEEP_SHARE = 0.1


class SpeculativePrefill(Dropper):
    """Speculative Prefill over a target and its speculator (`source`); see the module docstring."""

    name = "specprefill"
    knob_name = "chunks"
    budget_knob = "the kept chunks"
    loads = ("source",)
    second_model = "source"
    continues_at_prompt_end = True

    @dataclass(frozen=True, kw_only=True)
    class Arm(DropperArm):
        """`keep_share` of the chunks (default 0.1) or `budget`; `lookahead` (8) and `chunk` (32) as the
        authors' main configuration."""

        lookahead: int = 8
        chunk: int = 32

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.keep is not None:
                raise ArmError("specprefill keeps whole chunks: give keep_share (its authors' percentage) or "
                               "budget, not keep")
            if self.lookahead < 1 or self.chunk < 1:
                raise ArmError(f"lookahead and chunk must be >= 1; got lookahead={self.lookahead}, "
                               f"chunk={self.chunk}")

    def __init__(self, model, tokenizer=None, arm=None, *, source=None, speculator_tokenizer=None, **given):
        if source is None:
            raise ArmError("method=specprefill needs a speculator: source=<a smaller model of the same tokenizer>")
        if tokenizer is not None and speculator_tokenizer is not None:
            check_tokenizers(speculator_tokenizer, tokenizer, "specprefill")
        super().__init__(model, tokenizer, arm, source=source, **given)

    def bind_model(self) -> None:
        """The speculator: attention-only, beside a full-attention target."""
        self.speculator = self.parts["source"].eval()
        self.spec_family = family_for(self.speculator.config)
        types = getattr(self.speculator.config, "layer_types", None) or []
        if any(t != "full_attention" for t in types):
            raise ArmError("specprefill scores rows by the speculator's attention in every layer; this speculator "
                           f"has {sorted(set(types) - {'full_attention'})} layers: give an attention-only one")
        if sliding_window(self.model.config) is not None:
            raise ArmError("specprefill prefills the kept rows at their original positions; a sliding-window "
                           "target counts its window in cache rows, not positions: give a full-attention target")

    # -- counts --------------------------------------------------------------------------
    def chunks(self, n: int) -> int:
        return math.ceil(n / self.arm.chunk)

    def keep_count(self, n: int) -> int:
        return self.rows_of(n, max(1, math.ceil((self.arm.keep_share or DEFAULT_KEEP_SHARE) * self.chunks(n))))

    def rows_of(self, n: int, value: int) -> int:
        """Rows of the top `value` chunks: whole chunks of `chunk` rows (a short last chunk counted as full,
        the most they can hold)."""
        return min(value * self.arm.chunk, n)

    def knob_top(self, n: int) -> int:
        return self.chunks(n)

    def score_macs(self, n: int) -> int:
        """The speculator's prefill of the prompt and its look-ahead decoding steps (one row each over the
        cache so far)."""
        config = self.speculator.config
        total = prefill_macs(config, n)
        for step in range(1, self.arm.lookahead):
            total += sum(c.write + c.rest + c.attn_per_key * (n + step) for c in layer_costs(config))
            total += config.hidden_size * config.vocab_size
        return total

    # -- the rule ----------------------------------------------------------------------
    @torch.no_grad()
    def queries(self, ids: torch.Tensor) -> tuple[dict[int, torch.Tensor], object]:
        """Each speculator layer's queries of the last prompt token and the look-ahead tokens (1, H, la, D),
        rotated, and the speculator's cache."""
        layers = decoder_layers(self.speculator)
        grabbed: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}

        def grab(index):
            def hook(_module, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                cos, sin = kwargs["position_embeddings"]
                h = self.spec_family.input_norm(layers[index], hidden[:, -1:])
                q, _ = self.spec_family.query(layers[index].self_attn, h, cos[:, -1:], sin[:, -1:])
                grabbed[index].append(q)

            return hook

        handles = [layer.register_forward_pre_hook(grab(i), with_kwargs=True) for i, layer in enumerate(layers)]
        cache = new_cache(self.speculator)
        eos = getattr(self.speculator.generation_config, "eos_token_id", None)
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        try:
            logits = self.speculator(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits
            for _ in range(self.arm.lookahead - 1):
                token = logits[:, -1].argmax(-1, keepdim=True)
                if int(token) in eos:
                    break
                logits = self.speculator(input_ids=token, cache=cache, use_cache=True).logits
        finally:
            for handle in handles:
                handle.remove()
        return {i: torch.cat(qs, 2) for i, qs in grabbed.items()}, cache

    def scores(self, ids: torch.Tensor) -> torch.Tensor:
        """Per prompt row: the max over layers and heads of the pooled attention from each look-ahead query,
        averaged over the queries (N,), fp32."""
        n = ids.shape[1]
        positions = getattr(self.speculator.config, "max_position_embeddings", None)
        if positions and n + self.arm.lookahead - 1 > positions:  # past its positions it scores noise, silently
            raise ArmError(f"method=specprefill: a prompt of {n:,} tokens (with {self.arm.lookahead - 1} look-ahead) "
                           f"exceeds the speculator's {positions:,} positions; give a speculator (source=) that "
                           "holds the task's lengths, or shorter lengths")
        queries, cache = self.queries(ids)
        per_layer = []
        for index, q in queries.items():
            keys = cache.layers[index].keys[:, :, :n]  # the prompt's keys only
            keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
            attn = decoder_layers(self.speculator)[index].self_attn
            probs = ((q.float() @ keys.float().transpose(-1, -2)) * attn.scaling).softmax(-1)[0]  # (H, la, N)
            per_layer.append(probs)
        stacked = torch.cat(per_layer, 0)  # (L*H, la, N)
        heads, rows = stacked.shape[:2]
        pooled = F.avg_pool1d(stacked.reshape(heads * rows, 1, n), POOL, stride=1, padding=POOL // 2)
        return pooled.reshape(heads, rows, n).amax(0).mean(0)

    def keep_rows(self, ids: torch.Tensor, count: int) -> torch.Tensor:
        n, size = ids.shape[1], self.arm.chunk
        scores = self.scores(ids)
        chunk_scores = torch.stack([scores[i : i + size].mean() for i in range(0, n, size)])
        top = torch.topk(chunk_scores, min(math.ceil(count / size), chunk_scores.numel())).indices
        rows = torch.cat([torch.arange(c * size, min((c + 1) * size, n)) for c in top.tolist()])
        return torch.sort(rows).values.to(ids.device)
