"""Generation requests of `PrefillLM`: generate_until and multiturn_generate.

Formats: see `rf_eval.model_adapters.ridgefill`. The engine prefills all but
the last prompt token; `transformers`' own `generate` runs that token and
decodes over the cache, with lm-eval's stop sequences and `hf`'s kwargs rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import torch
from tqdm import tqdm

log = logging.getLogger(__name__)


class GenerationMixin:
    def generate_tokens(
        self, engine: Any, prompt: list[int], gen_kwargs: dict, state: dict | None = None
    ) -> tuple[list[int], list[str]]:
        """Generate after `prompt` over an engine-prefilled cache; returns (new tokens, stop strings).

        `state` (multi-turn) carries the cache between calls ({"result": PrefillResult});
        the tokens of `prompt` not yet in the cache are then run by the stock model.
        """
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
        from lm_eval.models.utils_hf import stop_sequences_criteria

        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=self.tok_decode([self.eot_token_id], False))
        max_gen_toks = kwargs.pop("max_gen_toks")
        max_length = kwargs.pop("max_length", len(prompt) + max_gen_toks)
        if kwargs.get("temperature", 0.0) == 0.0 and not kwargs.get("do_sample"):
            kwargs["do_sample"] = False
            kwargs.pop("temperature", None)
        if kwargs.get("do_sample") and self.config.seed is not None:
            digest = hashlib.sha256(json.dumps([self.config.seed, prompt]).encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:4], "little"))
        state = state if state is not None else {}
        result = state.get("result")
        if result is None:
            if len(prompt) >= 2 and not self._is_plain(engine, len(prompt)):
                result = self._prefill(engine, prompt[:-1], for_generation=True)
            else:  # no filled rows: `generate` prefills the prompt itself, exactly as under `hf`
                from rf_eval.engine import PrefillResult, new_cache

                result = PrefillResult(new_cache(self.model), None, torch.arange(0), prompt_length=0)
        pending = prompt[result.prompt_length : -1]
        if pending and result.ragged:  # the stock mask cannot cover several new tokens over a ragged cache
            self._extend(engine, result, torch.tensor([pending], device=self.device))
        ids = torch.tensor([prompt], device=self.device)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=None if result.ragged else torch.ones_like(ids),
            cache=result.cache,
            max_length=max_length,
            stopping_criteria=stop_sequences_criteria(self.tokenizer, until, len(prompt), 1),
            pad_token_id=self.tokenizer.pad_token_id,
            use_cache=True,
            **kwargs,
        )
        new = out[0, len(prompt) :].tolist()
        result.prompt_length = len(prompt) + len(new) - 1  # generate does not run its last token
        state["result"] = result
        return new, until

    def _answer(self, tokens: list[int], until: list[str]) -> str:
        from lm_eval.models.utils import postprocess_generated_text

        return postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=None)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        from lm_eval.models.utils import normalize_gen_kwargs

        out: list[str | None] = [None] * len(requests)
        plain, engine = [], []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            budget = self.max_length - kwargs["max_gen_toks"]
            if budget < 1:
                raise ValueError(f"max_gen_toks {kwargs['max_gen_toks']} must be below max_length {self.max_length}")
            ids = self.encode_prompt(context)[-budget:]  # `hf`'s left truncation
            sampled_with_seed = kwargs.get("do_sample") and self.config.seed is not None
            if self._is_plain(self.arm, len(ids)) and not sampled_with_seed:
                plain.append(i)
            else:
                engine.append((i, ids))
        if plain:  # `hf`'s own code, batched as `hf` batches
            for i, text in zip(plain, self.hf.generate_until([requests[i] for i in plain], disable_tqdm)):
                out[i] = text
        for i, ids in tqdm(engine, desc="Running generate_until requests (engine)", disable=disable_tqdm or self.rank != 0):
            context, gen_kwargs = requests[i].args
            tokens, until = self.generate_tokens(self.arm, ids, gen_kwargs)
            out[i] = self._answer(tokens, until)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), out[i])
        return out  # type: ignore[return-value]

    def multiturn_generate(self, requests: list) -> list[dict[str, Any]]:
        """Custom request type: later turns appended to the cache of the earlier ones (no second prefill)."""
        return self._cached("multiturn_generate", requests, self._multiturn)

    def _multiturn(self, turns: list[str], gen_kwargs: dict | list[dict]) -> dict[str, Any]:
        if not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError("multiturn_generate: turns must be a non-empty list of strings")
        per_turn = gen_kwargs if isinstance(gen_kwargs, list) else [gen_kwargs] * len(turns)
        if len(per_turn) != len(turns):
            raise ValueError(f"multiturn_generate: {len(turns)} turns but {len(per_turn)} gen_kwargs")
        out = {"answers": self._run_turns(self.arm, turns, per_turn)}
        if getattr(self.config, "reference", None) == "exact":
            out["exact_answers"] = self._run_turns(self.exact, turns, per_turn)
        return out

    def _run_turns(self, engine: Any, turns: list[str], per_turn: list[dict]) -> list[str]:
        from lm_eval.models.utils import normalize_gen_kwargs

        first_budget = self.max_length - normalize_gen_kwargs(per_turn[0], self.max_gen_toks)["max_gen_toks"]
        seq = self.encode_prompt(turns[0])[-first_budget:]
        state: dict[str, Any] = {}
        answers = []
        for index, (text, kwargs) in enumerate(zip(turns, per_turn)):
            if index:
                seq = seq + self.tok_encode(text, add_special_tokens=False)
            if len(seq) > self.max_length:
                log.warning("multiturn_generate: turn %d runs to %d tokens, past max_length", index, len(seq))
            tokens, until = self.generate_tokens(engine, seq, kwargs, state)
            seq = seq + tokens
            answers.append(self._answer(tokens, until))
        return answers
