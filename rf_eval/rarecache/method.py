"""`RaReCache`: a target model whose prompt cache is mapped from a source's, with selective recomputation.

    lm_eval --model rarecache --model_args pretrained=TARGET,source=SOURCE,maps=MAPS_DIR,rho=0.3 ...

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rf_eval import engine
from rf_eval.cost.mac_model import cache_rows
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.engine import MappedKV, Plan, PrefillResult, new_cache, num_layers
from rf_eval.fields import ArmError
from rf_eval.integrity.tokenizers import check_tokenizers
from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.methods.base import MapsSplit, Method, ModelSource, PromptPlan
from rf_eval.methods.requests import check_prompt, model_identity
from rf_eval.rarecache.arm_spec import RaReCacheArm
from rf_eval.rarecache.budget import knob_from_configs, layer_budget, rarecache_knob, recompute_count
from rf_eval.rarecache.cost import EquationCost, ceiling_for
from rf_eval.rarecache.features import cache_entries, check_attention_only, prefill_cache
from rf_eval.rarecache.maps import SIDES, TransferMaps, load_transfer_maps
from rf_eval.rarecache.transfer import MappedCache, Mapper
from rf_eval.ridge.maps import MapError
from rf_eval.selectors.mapped_cache import CachePrompt, prefill_with_attention


class RaReCache(Method):
    """Cross-model KV transfer with rank-disagreement recomputation; see the module docstring.

    The arm is a `RaReCacheArm` (`arm=`, or its fields `rho`, `selector`, `seed`, `budget` as keyword
    arguments); `source`: the source model (loaded), `maps`: a `TransferMaps` or a path.
    """

    name = "rarecache"
    Arm = RaReCacheArm
    loads = ("source", "maps")
    second_model = "source"
    budget_sets = ("rho",)
    budget_knob = "the recomputed rows (layers, for layer-prefix)"

    def __init__(
        self,
        target: nn.Module,
        tokenizer: Any = None,
        arm: RaReCacheArm | None = None,
        *,
        source: nn.Module,
        maps: TransferMaps | str,
        source_tokenizer: Any = None,
        map_dtype: torch.dtype | None = None,
        clock: Callable[[], float] = time.perf_counter,
        **fields: Any,
    ):
        maps = maps if isinstance(maps, TransferMaps) else load_transfer_maps(maps)
        super().__init__(target, tokenizer, arm, source=source, maps=maps, **fields)
        arm = self.arm
        self.target, self.source = self.model, source.eval()
        self.family = check_attention_only(target, "target")
        self.source_family = check_attention_only(source, "source")
        if tokenizer is not None and source_tokenizer is not None:
            check_tokenizers(source_tokenizer, tokenizer)
        self.maps = maps
        self.maps.check_pair(source.config, target.config)
        self.source_weights_sha256 = weights_fingerprint(source)
        self.maps.check_weights(self.source_weights_sha256, self.weights_sha256)
        self.maps.check_tokenizer(tokenizer)
        self.rho, self.selector, self.seed = arm.recompute_share, arm.selector, int(arm.seed or 0)
        self.chooser = arm.selector_obj  # made once, with the arm
        self.costs = EquationCost(target, source, self.maps)
        positions = getattr(target.config, "max_position_embeddings", None) or 1 << 20
        self.knob = rarecache_knob(arm.budget, self.costs, self.chooser.whole_layers, int(positions))
        if self.knob is not None:
            self.knob.check_reachable()  # a budget no recompute count meets, refused before any prompt
        param = next(target.parameters())
        self.mapper = Mapper(self.maps, target, map_dtype or param.dtype, param.device, clock)
        self.clock = clock  # the phases' clock in `PrefillResult.timings` (benchmarks may pass time.process_time)

    @classmethod
    def prepare(cls, arm: RaReCacheArm, source: ModelSource) -> tuple[RaReCacheArm, dict[str, Any]]:
        """The tokenizers compared, the maps read and checked for the pair, a budget's reach (eq. 11 from the
        configs), before any weights load."""
        source_config = cls.check_loads(arm, source)
        path = source.files["maps"]
        try:
            maps = path if isinstance(path, TransferMaps) else load_transfer_maps(path)
            if source_config is not None:
                maps.check_pair(source_config, source.config)
                if arm.budget is not None:  # a budget no recompute count meets is refused now
                    knob_from_configs(arm, maps, source_config, source.config).check_reachable()
        except MapError as err:
            raise ArmError(f"maps={path!r}: {err}") from err
        return arm, {"maps": maps}

    @classmethod
    def check_budget(cls, model_args: Mapping[str, Any], arm: RaReCacheArm, lengths: Sequence[int] | None, *,
                     maps_split: MapsSplit) -> None:
        """The budget's knob from the source's and target's configs and the maps (eq. 11), before any weights."""
        from transformers import AutoConfig

        configs = [AutoConfig.from_pretrained(model_args[k]) for k in ("source", "pretrained")]
        knob_from_configs(arm, load_transfer_maps(model_args["maps"]), *configs).check_reachable(lengths)

    # -- the prompt ---------------------------------------------------------------
    def plan(self, n: int) -> PromptPlan:
        """The positions (layers, for layer-prefix) an n-token prompt recomputes: ceil(rho n) (ceil(rho L)), or
        what the budget pays for (`rarecache_knob`); plain when every row (layer) is."""
        whole_layers = self.chooser.whole_layers
        if self.knob is not None:
            count = self.knob.setting(n)
        else:
            count = layer_budget(self.rho, num_layers(self.target)) if whole_layers else recompute_count(self.rho, n)
        plain = count >= (num_layers(self.target) if whole_layers else n)
        return PromptPlan(n, plain, n if plain else 1, count, count if self.knob is not None else None)

    def speedup_ceilings(self, n: int, plan: PromptPlan | None = None) -> dict[str, float]:
        """`ceiling`: eq. 11 (`rf_eval.rarecache.cost.ceiling_for`; its row selectors)."""
        plan = plan if plan is not None else self.plan(n)
        if plan.plain:
            return {"ceiling": 1.0}
        if self.chooser.whole_layers:  # eq. 11 counts recomputed rows, not layers
            return {}
        return {"ceiling": ceiling_for(self.target, self.maps, n, plan.setting / n)}

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        """Eq. 11's count with the source's prefill charged (`EquationCost`). The recomputed rows are the
        plan's (the budget, the last row included), so `result` adds nothing."""
        plan = plan if plan is not None else self.plan(n)
        exact, cache = self.costs.exact(n), cache_rows(self.target.config, n)
        knob = {"budget": self.knob.budget, "knob_value": None} if self.knob is not None else {}
        if plan.plain:
            return PrefillCost(n, exact, exact, n, cache, cache, **knob)
        k = plan.setting
        if self.chooser.whole_layers:
            knob = {**knob, "knob_value": k} if knob else {}
            return PrefillCost(n, self.costs.layers(n, k), exact, 1, cache, cache, **knob)
        rows = min(max(k - 1, 0), n - 1) + 1  # the last row is always recomputed, and counted
        knob = {**knob, "knob_value": rows / n} if knob else {}
        return PrefillCost(n, self.costs.rows(n, rows), exact, rows, cache, cache, **knob)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0,
                plan: PromptPlan | None = None) -> PrefillResult:
        """Prefill a 1 x N prompt (or a prompt minus its last token, `for_generation`). `held_back` must be 0:
        which rows are exact depends on the whole prompt (the plan's `exact_tail` is 1)."""
        if held_back:
            raise ValueError(f"held_back={held_back}: RaReCache chooses its exact rows from the whole prompt, "
                             "so none can be held back")
        ids = check_prompt(input_ids, self.target).to(self.device)
        n = ids.shape[1]
        prompt_rows = n + 1 if for_generation else n
        plan = plan if plan is not None else self.plan(prompt_rows)
        with self.forward_context():
            if self.chooser.whole_layers:
                return self._layer_prefix(ids, plan.setting, for_generation)
            free = prompt_rows - 1  # candidates: every prompt row but the last (always exact, counted in the budget)
            pick = min(max(plan.setting - 1, 0), free)
            if pick >= free:
                return self._exact(ids)
            return self._recompute(ids, free, pick, for_generation)

    def _recompute(self, ids: torch.Tensor, free: int, pick: int, for_generation: bool) -> PrefillResult:
        """The source's prefill mapped into the target's cache, `pick` chosen rows recomputed."""
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
            "selectors": [self.selector], "corrections": [], "splices": [],
            "source_num_parameters": sum(p.numel() for p in self.source.parameters()),
        }
