"""`RaReCache`: a target model whose prompt cache is mapped from a source's, with selective recomputation.

Paper section 3. The source prefills the prompt; the transfer maps predict
the target's cache for every position; the target recomputes the
ceil(rho * T) selected positions exactly over that mixed cache (one set for
all layers) through the shared partial-prefill engine (`engine.prefill` with
split 0 and the mapped-K/V strategy `engine.MappedKV`). The result is the target's own
`transformers` cache, so decoding is the stock target model.

Budget and the last prompt row: the engine needs the last prompt row exact
(it yields the next-token logits), so that row is always recomputed and
*counted in* the ceil(rho * T) budget; the selector picks the other
ceil(rho * T) - 1 among rows 0..T-2. At rho = 0 the last row is still run by
the target over the pure mapped cache of rows 0..T-2: it plays the part of
the first decoded token, which is how a mapped cache is decoded from (the
paper's rho = 0, Heo et al.'s setting). At rho = 1 (every row exact) the
prompt goes to `engine.plain_prefill`: the target's own logits, bitwise.

`prefill(ids, for_generation=True)` takes a prompt *minus its last token*,
which `generate` then runs exactly: the budget counts that token, and the
rows of `ids` get the same classes as in a full-prompt prefill (selected rows
after the last selected one are appended to the cache as mapped rows; they
cannot affect earlier rows).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rf_eval import engine
from rf_eval.devices import default_device, parse_dtype
from rf_eval.engine import MappedKV, Plan, PrefillResult, new_cache, num_layers
from rf_eval.mac_model import cache_rows
from rf_eval.method import check_prompt, generate, input_device, method_forward, model_identity, prefill_each
from rf_eval.prefill_cost import PrefillCost
from rf_eval.rarecache.arm_spec import RaReCacheArm
from rf_eval.rarecache.budget import budget, layer_budget, rarecache_knob
from rf_eval.rarecache.cost import EquationCost, ceiling_for
from rf_eval.rarecache.features import cache_entries, check_attention_only, prefill_cache
from rf_eval.rarecache.maps import SIDES, TransferMaps, check_tokenizers, load_transfer_maps
from rf_eval.rarecache.transfer import MappedCache, Mapper
from rf_eval.selectors.mapped_cache import CachePrompt, prefill_with_attention
from rf_eval.weights import weights_fingerprint


class RaReCache:
    """Cross-model KV transfer with rank-disagreement recomputation; see the module docstring.

    The arm is a `RaReCacheArm` (`arm=`, or its fields `rho`, `selector`,
    `seed` as keyword arguments). Implements the prefill-method protocol
    (`rf_eval.method.PrefillMethod`).
    """

    def __init__(
        self,
        target: nn.Module,
        source: nn.Module,
        tokenizer: Any = None,
        *,
        maps: TransferMaps | str | Path,
        arm: RaReCacheArm | None = None,
        source_tokenizer: Any = None,
        map_dtype: torch.dtype | None = None,
        clock: Callable[[], float] = time.perf_counter,
        **fields: Any,
    ):
        if arm is None:
            arm = RaReCacheArm.from_fields(fields, what="RaReCache")
        elif fields:
            raise TypeError(f"give arm= or the arm's fields, not both (got {', '.join(fields)})")
        self.spec = arm
        self.target, self.source = target.eval(), source.eval()
        self.model = self.target  # the model whose cache the method writes (rf_eval.method.PrefillMethod)
        self.tokenizer = tokenizer
        self.family = check_attention_only(target, "target")
        self.source_family = check_attention_only(source, "source")
        if tokenizer is not None and source_tokenizer is not None:
            check_tokenizers(source_tokenizer, tokenizer)
        self.maps = maps if isinstance(maps, TransferMaps) else load_transfer_maps(maps)
        self.maps.check_pair(source.config, target.config)
        self.source_weights_sha256, self.weights_sha256 = weights_fingerprint(source), weights_fingerprint(target)
        self.maps.check_weights(self.source_weights_sha256, self.weights_sha256)
        self.maps.check_tokenizer(tokenizer)
        self.rho, self.selector, self.seed = arm.recompute_share, arm.selector, int(arm.seed or 0)
        self.chooser = arm.selector_obj  # made once, with the arm
        self.costs = EquationCost(target, source, self.maps)
        positions = getattr(target.config, "max_position_embeddings", None) or 1 << 20
        self.knob = rarecache_knob(arm.budget, self.costs, self.chooser.whole_layers, int(positions))
        if self.knob is not None:
            self.knob.check_reachable()
        param = next(target.parameters())
        self.mapper = Mapper(self.maps, target, map_dtype or param.dtype, param.device, clock)
        self.clock = clock  # the phases' clock in `PrefillResult.timings` (benchmarks may pass time.process_time)

    @classmethod
    def from_pretrained(
        cls,
        pretrained: str | Path,
        source: str | Path,
        *,
        maps: TransferMaps | str | Path,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        trust_remote_code: bool = False,
        **options: Any,
    ) -> RaReCache:
        """Load target and source (tokenizers compared before any weights load)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
        source_tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        check_tokenizers(source_tokenizer, tokenizer)
        device = device or default_device()
        torch_dtype = parse_dtype(dtype, device)
        models = [
            AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, trust_remote_code=trust_remote_code).to(device)
            for p in (pretrained, source)
        ]
        return cls(*models, tokenizer, maps=maps, source_tokenizer=source_tokenizer, **options)

    @property
    def device(self) -> torch.device:
        return input_device(self.target)

    # -- the prompt ---------------------------------------------------------------
    def recomputed(self, n: int) -> int:
        """Positions (layers, for layer-prefix) an n-token prompt recomputes: ceil(rho n) (ceil(rho L)), or
        what the budget pays for (`rarecache_knob`)."""
        if self.knob is not None:
            return self.knob.setting(n)
        if self.chooser.whole_layers:
            return layer_budget(self.rho, num_layers(self.target))
        return budget(self.rho, n)

    def is_plain(self, n: int) -> bool:
        """True when an n-token prompt has no mapped row (every row or every layer recomputed)."""
        return self.recomputed(n) >= (num_layers(self.target) if self.chooser.whole_layers else n)

    def forward_context(self) -> AbstractContextManager:
        """The context a request runs the model in (`rf_eval.method.method_forward`), entered once per request."""
        return method_forward(self)

    def exact_tail(self, n: int) -> int:
        """The last prompt row only (every row for a plain prompt): the others are chosen per prompt."""
        return n if self.is_plain(n) else 1

    def speedup_ceilings(self, n: int) -> dict[str, float]:
        """On an n-token prompt: `ceiling`, eq. 11 (`rf_eval.rarecache.cost.ceiling_for`; its row selectors)."""
        if self.is_plain(n):
            return {"ceiling": 1.0}
        if self.chooser.whole_layers:  # eq. 11 counts recomputed rows, not layers
            return {}
        return {"ceiling": ceiling_for(self.target, self.maps, n, self.recomputed(n) / n)}

    def prefill_cost(self, n: int, result: PrefillResult | None = None) -> PrefillCost:
        """What the prefill of an n-token prompt cost (`rf_eval.prefill_cost`): eq. 11's count with the source's
        prefill charged (`EquationCost`). The recomputed rows are a function of n (the budget, the last row
        included), so `result` adds nothing."""
        exact, cache = self.costs.exact(n), cache_rows(self.target.config, n)
        knob = {"budget": self.knob.budget, "knob_value": None} if self.knob is not None else {}
        if self.is_plain(n):
            return PrefillCost(n, exact, exact, n, cache, cache, **knob)
        k = self.recomputed(n)
        if self.chooser.whole_layers:
            knob = {**knob, "knob_value": k} if knob else {}
            return PrefillCost(n, self.costs.layers(n, k), exact, 1, cache, cache, **knob)
        rows = min(max(k - 1, 0), n - 1) + 1  # the last row is always recomputed, and counted
        knob = {**knob, "knob_value": rows / n} if knob else {}
        return PrefillCost(n, self.costs.rows(n, rows), exact, rows, cache, cache, **knob)

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False) -> list[PrefillResult]:
        """One prefill per prompt: each prompt's recomputed rows are its own."""
        return prefill_each(self, input_ids, for_generation=for_generation)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0) -> PrefillResult:
        """Prefill a 1 x N prompt (or a prompt minus its last token, `for_generation`). `held_back` must be 0:
        which rows are exact depends on the whole prompt (`exact_tail` is 1)."""
        if held_back:
            raise ValueError(f"held_back={held_back}: RaReCache chooses its exact rows from the whole prompt, "
                             "so none can be held back")
        ids = check_prompt(input_ids, self.target).to(self.device)
        n = ids.shape[1]
        prompt_rows = n + 1 if for_generation else n
        if self.chooser.whole_layers:
            return self._layer_prefix(ids, self.recomputed(prompt_rows), for_generation)
        free = prompt_rows - 1  # candidates: every prompt row but the last (always exact, counted in the budget)
        pick = min(max(self.recomputed(prompt_rows) - 1, 0), free)
        if pick >= free:
            return self._exact(ids)
        t0 = self.clock()
        received = None
        if self.chooser.source_attention:
            source_cache, received = prefill_with_attention(self.source, self.source_family, ids)
        else:
            source_cache = prefill_cache(self.source, ids)
        t1 = self.clock()
        mapped = self._map(source_cache, score=self.chooser.scores_mapping)
        t2 = self.clock()
        rows = self.chooser.choose(CachePrompt(
            ids=ids, free=free, pick=pick, mapped=mapped, seed=self.seed, source_received=received,
            target_prefill=lambda: prefill_cache(self.target, ids),
            target_attention=lambda: prefill_with_attention(self.target, self.family, ids)))
        t3 = self.clock()
        result = self._assemble(ids, mapped, rows, for_generation)
        t4 = self.clock()
        result.timings = {
            "source": t1 - t0, **mapped.timings, "select": t3 - t2, "target": t4 - t3,
            "target_side": t4 - t1,
        }
        return result

    def _map(self, source_cache, score: bool, layers: list[int] | None = None) -> MappedCache:
        t0 = self.clock()
        keys, values = cache_entries(self.source, self.source_family, source_cache)
        derotate = self.clock() - t0
        mapped = self.mapper.map_prompt(dict(zip(SIDES, (keys, values))), score=score, layers=layers)
        mapped.timings["map"] += derotate
        return mapped

    def _exact(self, ids: torch.Tensor) -> PrefillResult:
        result = engine.plain_prefill(self.target, ids)
        result.timings["target_side"] = result.timings["target"] = result.timings["total"]
        return result

    def _assemble(self, ids: torch.Tensor, mapped: MappedCache, rows: torch.Tensor, for_generation: bool):
        """The target cache: `rows` (and, for a full prompt, the last row) exact; every other row mapped."""
        n = ids.shape[1]
        plan, fill = Plan(split=0, tail=1, fill="mapped"), MappedKV(mapped.kv_fill)
        if not for_generation:
            return engine.prefill(self.target, ids, plan, fill=fill, select=lambda _ctx: rows)
        if rows.numel() == 0:
            return self._mapped_only(mapped, n, new_cache(self.target), 0)
        end = int(rows[-1]) + 1  # rows after the last exact one cannot change it: run the engine up to it
        result = engine.prefill(self.target, ids[:, :end], plan, fill=fill, select=lambda _ctx: rows[:-1])
        return self._mapped_only(mapped, n, result.cache, end, result.exact_rows)

    def _mapped_only(self, mapped: MappedCache, n: int, cache, start: int, exact=None) -> PrefillResult:
        """Append mapped rows start..n-1 of every mapped layer to `cache` (no logits: a generation prefill)."""
        dtype = next(self.target.parameters()).dtype
        for layer in sorted(mapped.keys):
            cache.update(mapped.keys[layer][:, :, start:n].to(dtype), mapped.values[layer][:, :, start:n].to(dtype),
                         layer)
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        return PrefillResult(cache=cache, logits=None, exact_rows=empty if exact is None else exact, prompt_length=n)

    def _layer_prefix(self, ids: torch.Tensor, m: int, for_generation: bool) -> PrefillResult:
        """DroidSpeak-like baseline: target layers 0..m-1 exact for every row, the rest mapped."""
        n_layers = num_layers(self.target)
        if m >= n_layers:
            return self._exact(ids)
        t0 = self.clock()
        source_cache = prefill_cache(self.source, ids)
        t1 = self.clock()
        mapped = self._map(source_cache, score=False, layers=list(range(m, n_layers)))
        t2 = self.clock()
        if for_generation:
            cache = new_cache(self.target)
            if m > 0:
                engine.run_lower_layers(self.target, ids, m, cache)
            result = self._mapped_only(mapped, ids.shape[1], cache, 0)
        else:
            plan = Plan(split=m, tail=1, fill="mapped")
            result = engine.prefill(self.target, ids, plan, fill=MappedKV(mapped.kv_fill))
        t3 = self.clock()
        result.timings = {"source": t1 - t0, **mapped.timings, "select": 0.0, "target": t3 - t2,
                          "target_side": t3 - t1}
        return result

    # -- after the prompt: the stock target ------------------------------------------------
    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """The stock target over `tokens` (1 x k) after the prompt; their logits (1, k, V)."""
        return engine.extend(self.target, result, tokens.to(self.device))

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """`target.generate` over a RaReCache-prefilled cache; the last prompt token runs exactly."""
        return generate(self, input_ids, **kwargs)

    def provenance(self) -> dict[str, Any]:
        """What ran: method, what it recomputes (rho, or the MAC budget that sets it per length), selector
        (oracles flagged), the target's identity in every method's schema (`rf_eval.method.model_identity`),
        the source's beside it."""
        return {
            "method": "rarecache",
            "rho": self.rho,
            **({"budget": self.knob.budget, "knob": self.knob.name} if self.knob is not None else {}),
            "selector": self.selector,
            "oracle": self.chooser.oracle,
            "seed": self.seed,
            "recomputes": "layer-prefix: ceil(rho*L) target layers exact for all rows"
            if self.chooser.whole_layers
            else "ceil(rho*T) positions exact in every layer, the last prompt row included",
            **model_identity(self.target, self.weights_sha256, self.maps, ("file_sha256", "r2", "source_layers")),
            "source_model": getattr(self.source.config, "_name_or_path", ""),
            "source_weights_sha256": self.source_weights_sha256,
            "map_dtype": str(self.mapper.dtype),
        }
