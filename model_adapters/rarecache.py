"""lm-eval model `rarecache`: the target's prompt cache mapped from a source model's, with selective recomputation.

    lm_eval --model rarecache \\
        --model_args pretrained=TARGET,source=SOURCE,maps=MAPS_DIR,rho=0.3[,selector=rank][,seed=0] \\
        --tasks ...

RaReCache (paper section 3): the source prefills each prompt; the maps written
by `rf-eval fit-transfer` predict the target's cache; the target recomputes
ceil(rho * T) positions (the last prompt row included) chosen by `selector`
and reads the mapped cache elsewhere. Everything after the prompt is the stock
target model, so a run differs from lm-eval's `hf` model (on the target) in
nothing but the prefill; rho=1 is bitwise `hf`.

model_args (unknown, missing or contradictory keys fail before any model loads):
  pretrained (required)  the target: HF folder or hub id
  source (required)      the source model; must share the target's tokenizer
  maps (required)        folder or file written by `rf-eval fit-transfer` for this pair
  rho                    recompute budget in [0, 1] (default 0.3)
  selector               rank (default) | random | attention | oracle-attention | oracle-l2 |
                         layer-prefix. The oracle-* selectors read the target's own prefill
                         (CacheBlend-like l2 error; the target's attention): analysis only,
                         and flagged `oracle: true` in the results' config. layer-prefix is
                         the DroidSpeak-like baseline: ceil(rho * L) first layers recomputed.
  seed                   the random selector's seed (default 0); also seeds sampled generation
  reference, device, dtype, max_length, trust_remote_code, add_bos_token, tokenizer,
  batch_size             as for `ridgefill`

Request types are `ridgefill`'s (loglikelihood, loglikelihood_rolling,
generate_until, token_logprobs, multiturn_generate): see
`rf_eval.model_adapters.ridgefill` for their formats. The results' config
records the arm (`rf_eval` in get_model_info): budget, selector, oracle flag,
both models, the maps' sha256 and metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry imports them only when empty)
import torch
from lm_eval.api.registry import register_model

from rf_eval.model_adapters.config import REFERENCES, ModelArgs, ModelArgsError
from rf_eval.model_adapters.prefill_lm import PrefillLM


@dataclass(frozen=True, kw_only=True)
class RaReCacheConfig(ModelArgs):
    """model_args of `--model rarecache`; see model_adapters/rarecache.py."""

    source: str
    maps: str
    rho: float = 0.3
    selector: str = "rank"
    reference: str | None = None

    def check(self) -> None:
        super().check()
        from rf_eval.rarecache.selectors import SELECTORS

        if not 0 <= self.rho <= 1:
            raise ModelArgsError(f"rho must be in [0, 1], got {self.rho}")
        if self.selector not in SELECTORS:
            raise ModelArgsError(f"selector={self.selector!r} is not valid; valid selectors: {', '.join(SELECTORS)}")
        if self.reference is not None and self.reference not in REFERENCES:
            raise ModelArgsError(f"reference={self.reference!r} is not valid; valid: {', '.join(REFERENCES)}")


@register_model("rarecache")
class RaReCacheLM(PrefillLM):
    """`--model rarecache`: prompts prefilled by `rf_eval.rarecache.RaReCache`; see the module docstring."""

    config_class = RaReCacheConfig
    config: RaReCacheConfig

    def _preflight(self) -> None:
        """Tokenizers that differ, or maps fitted for another pair: an error before any weights load."""
        from transformers import AutoConfig, AutoTokenizer

        from rf_eval.maps import MapError
        from rf_eval.rarecache.maps import TokenizerMismatch, check_tokenizers, load_transfer_maps

        cfg = self.config
        remote = dict(trust_remote_code=cfg.trust_remote_code)
        try:
            check_tokenizers(AutoTokenizer.from_pretrained(cfg.source, **remote),
                             AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.pretrained, **remote))
            self._maps = load_transfer_maps(cfg.maps)
            self._maps.check_pair(AutoConfig.from_pretrained(cfg.source, **remote),
                                  AutoConfig.from_pretrained(cfg.pretrained, **remote))
        except (MapError, TokenizerMismatch) as err:
            raise ModelArgsError(f"rarecache: {err}") from err

    def _build_engines(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM

        from rf_eval.api import RidgeFill, parse_dtype
        from rf_eval.rarecache.api import RaReCache

        cfg = self.config
        dtype = "auto" if cfg.dtype == "auto" else parse_dtype(cfg.dtype, str(self.device))
        source = AutoModelForCausalLM.from_pretrained(cfg.source, dtype=dtype, trust_remote_code=cfg.trust_remote_code)
        # The tokenizers were compared in _preflight (before configure_pad_token could touch this one).
        arm = RaReCache(self.model, source.to(self.device).eval(), None, maps=self._maps, rho=cfg.rho,
                        selector=cfg.selector, seed=cfg.seed or 0)
        return arm, RidgeFill(self.model, self.tokenizer, fill="exact")

    def _prefill(self, engine: Any, ids: list[int], for_generation: bool = False):
        tensor = torch.tensor([ids], device=self.device)
        if engine is self.arm:
            return engine.prefill(tensor, for_generation=for_generation)
        return engine.prefill(tensor)

    def _is_plain(self, engine: Any, n: int) -> bool:
        return engine is not self.arm or self.arm.is_plain(n)

    def arm_info(self) -> dict[str, Any]:
        info = self.arm.provenance()
        info.update(selectors=[info["selector"]], corrections=[], splices=[], reference=self.config.reference,
                    maps_path=self.config.maps, source_path=self.config.source,
                    source_num_parameters=sum(p.numel() for p in self.arm.source.parameters()))
        return info
