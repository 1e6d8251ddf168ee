"""Public Python API: `RidgeFill.from_pretrained(...)`, `.prefill`, `.extend`, `.generate`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rf_eval import engine
from rf_eval.arm import Arm
from rf_eval.engine import FILL_SOURCES, Plan, PrefillResult
from rf_eval.maps import RidgeMaps, config_hash, identity_fill, load_maps, resolve_map_file

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """A torch dtype from a name; `auto`/None picks bf16 on CUDA and fp32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class RidgeFill:
    """A causal LM whose prompt prefill runs through the partial-prefill engine.

    `fill`: exact | nofill | identity | ridge. `split` defaults to the maps' split
    (or L/2 without maps); `tail` is the count of last prompt rows kept exact.

    Arm options (paper sections 2.3, 2.4, 3.3, 6.6; each part is recorded by
    `provenance()`). String values use the one-line spec grammar of
    `rf_eval.spec` (`name(key=value;key=value)`, parts joined by `+`, no commas):

    - `selector`: a selector name or spec (`attention`, `question_hidden`,
      `random`, `longer_tail`, `probe`, `protected`, `lexical_net`, `special`,
      e.g. `"random(seed=3;of=attention(share=0.1))"`, `"probe+special"`), a
      dict `{"name": ..., **params}`, a `rf_eval.selectors.Selector`, or a bare
      callable `(PrefillContext) -> LongTensor of prefix rows`.
    - `selector_params`: parameters for a plain selector name (a dict).
    - `corrections`: `value_rescale(c=512)`, `key_rescale(c=512)`,
      `terminal_state(path=FILE)`, joined by `+`, or a list of specs/dicts.
      They need fill identity or ridge.
    - `splice`: `keys` | `values` | `both` (exact K/V of the filled rows).
    - `cost_match`: on a `nofill` arm, lengthen the tail per prompt to the
      MAC cost of the named arm, e.g. `"ridge"` or
      `"ridge(tail=4096;exact_share=0.1)"` (see `rf_eval.arm.CostMatch`).
    - `unigram`: the protected-token selectors' frequency table (default: the
      `unigram.safetensors` that `rf-eval fit` saved beside `maps`).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        maps: RidgeMaps | str | Path | None = None,
        split: int | None = None,
        tail: int = 1024,
        fill: str = "exact",
        chunk_size: int | None = None,
        selector: Any = None,
        selector_params: dict[str, Any] | None = None,
        corrections: Any = None,
        splice: str | None = None,
        cost_match: Any = None,
        unigram: str | Path | None = None,
    ):
        if fill not in FILL_SOURCES:
            raise ValueError(f"unknown fill {fill!r}; valid fills: {', '.join(FILL_SOURCES)}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        n_layers = engine.num_layers(model)
        maps_path = None
        if maps is not None and not isinstance(maps, RidgeMaps):
            maps_path = resolve_map_file(maps, split)
            maps = load_maps(maps, split)
        if maps is not None:
            maps.check_model(model.config)
            if split is not None and split != maps.split:
                raise ValueError(f"split {split} does not match the maps' split {maps.split}")
            split = maps.split
        if fill == "ridge" and maps is None:
            raise ValueError("fill='ridge' needs maps= (a folder or file written by `rf-eval fit`)")
        if split is None:
            split = n_layers // 2
        if not 1 <= split <= n_layers - 1:
            raise ValueError(f"split {split} is outside 1..{n_layers - 1} for this {n_layers}-layer model")
        self.maps = maps
        self.plan = Plan(split=split, tail=tail, fill=fill, chunk_size=chunk_size)
        if selector_params:
            if not isinstance(selector, str):
                raise ValueError("selector_params go with a selector name (selector='attention', ...)")
            from rf_eval.selectors import make_selector

            selector = make_selector(selector, **selector_params)
        resources: dict[str, Any] = {}
        if unigram is not None:
            resources["unigram"] = str(unigram)
        elif maps_path is not None and (maps_path.parent / "unigram.safetensors").is_file():
            resources["unigram"] = str(maps_path.parent / "unigram.safetensors")
        self.arm = Arm(model, tokenizer, self.plan, selector=selector, corrections=corrections, splice=splice,
                       cost_match=cost_match, resources=resources)
        self.selector = self.arm.selector
        for correction in self.arm.corrections:
            if hasattr(correction, "check"):
                correction.check(config_hash(model.config), self.plan, maps.sha256() if maps is not None else "")
        param = next(model.parameters())
        if fill == "ridge":
            self._fill = maps.fill_fn(param.dtype, param.device)
        elif fill == "identity":
            self._fill = identity_fill
        else:
            self._fill = None

    @classmethod
    def from_pretrained(
        cls,
        pretrained: str | Path,
        *,
        maps: RidgeMaps | str | Path | None = None,
        split: int | None = None,
        tail: int = 1024,
        fill: str = "exact",
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        trust_remote_code: bool = False,
        **options: Any,
    ) -> RidgeFill:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or default_device()
        torch_dtype = parse_dtype(dtype, device)
        model = AutoModelForCausalLM.from_pretrained(
            pretrained, dtype=torch_dtype, trust_remote_code=trust_remote_code
        ).to(device)
        tokenizer = AutoTokenizer.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, maps=maps, split=split, tail=tail, fill=fill, **options)

    @property
    def fill_fn(self) -> engine.FillFn | None:
        """The fill function this arm's filled rows use (None for exact and nofill)."""
        return self._fill

    def is_plain(self, n: int) -> bool:
        """True when an n-token prompt is prefilled by the plain model (no filled rows), bitwise."""
        return engine.runs_plain(self.arm.plan_for(self.plan, n), n, self.selector is not None)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prefill(self, input_ids: torch.Tensor, plan: Plan | None = None) -> PrefillResult:
        """Prefill a 1 x N prompt; `.cache` is the model's own cache, `.logits` the last row's."""
        return self.arm.prefill(input_ids.to(self.device), plan or self.plan, self._fill)

    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """Run the stock model over `tokens` (1 x k) after the prompt; returns their logits (1, k, V).

        Continuation tokens are never filled: they read the prompt's cache like
        decoding steps. Caches whose late layers hold fewer rows (nofill) are
        extended one token at a time, since the stock mask assumes equal lengths.
        """
        return engine.extend(self.model, result, tokens.to(self.device))

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """`model.generate` over an engine-prefilled cache; kwargs are generate's own."""
        input_ids = input_ids.to(self.device)
        n = input_ids.shape[1]
        if n < 2:
            return self.model.generate(input_ids, **kwargs)
        # The engine prefills all but the last prompt row (with the tail shortened by one,
        # so every row keeps its class); generate then runs that row exactly, as a tail row.
        shorter = dataclasses.replace(self.plan, tail=max(self.plan.tail - 1, 1))
        result = self.prefill(input_ids[:, :-1], shorter)
        return self.model.generate(input_ids, cache=result.cache, **kwargs)

    def provenance(self) -> dict[str, Any]:
        """What ran: the arm and the maps' identity, for results files."""
        info: dict[str, Any] = {
            "fill": self.plan.fill,
            "split": self.plan.split,
            "tail": self.plan.tail,
            "chunk_size": self.plan.chunk_size,
            **self.arm.describe(),  # selector, corrections, splice, cost_match
            "model_type": self.model.config.model_type,
            "model_name": getattr(self.model.config, "_name_or_path", ""),
        }
        if self.maps is not None:
            info["maps_sha256"] = self.maps.sha256()
            info["maps_metadata"] = {k: v for k, v in self.maps.metadata.items() if k != "file_sha256"}
        return info
