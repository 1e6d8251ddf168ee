"""Generation requests of `PrefillLM`: generate_until and multiturn_generate.

The method prefills all but the last prompt token (`rf_eval.methods.requests.generation_cache`'s rule,
timed); `transformers`' own `generate` runs that token and decodes over the cache
(`requests.generate_after`, the one generation loop), with lm-eval's stop sequences and `hf`'s kwargs rules.
Plain prompts go to `HFLM`.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch
from tqdm import tqdm

from rf_eval.methods.requests import (
    batched_prefills,
    empty_result,
    generate_after,
    generation_cache_needed,
    generation_prompt,
    sampling_seed,
    timed_prefill,
)

log = logging.getLogger(__name__)


class GenerationMixin:
    def encode_prompt(self, context: str, budget: int | None = None) -> list[int]:
        """A generation prompt's tokens, as `hf`'s generate_until makes them (left-truncated to `budget`)."""
        ids, _mask = self.tok_batch_encode([context], left_truncate_len=budget, truncation=self.truncation)
        return ids[0].tolist()

    def generate_tokens(
        self, method: Any, prompt: list[int], gen_kwargs: dict, state: dict | None = None, plan: Any = None
    ) -> tuple[list[int], list[str]]:
        """Generate after `prompt` over the method's cache, inside the caller's forward context; returns (new
        tokens, stop strings).

        `state` (multi-turn) carries the cache between calls ({"result": PrefillResult});
        the tokens of `prompt` not yet in the cache are then run by the stock model.
        `plan`: the prompt's (`Method.plan`, decided once; asked here when no cache is given and none is).
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
        if kwargs.get("do_sample") and self.settings.seed is not None:
            torch.manual_seed(sampling_seed(self.settings.seed, prompt))
        state = state if state is not None else {}
        result = state.get("result")
        if result is None:
            plan = plan if plan is not None else method.plan(len(prompt))
            if generation_cache_needed(plan):
                ids = self.ids_tensor(generation_prompt(method, prompt))
                result, state["cost"] = timed_prefill(method, ids, plan, for_generation=True)
            else:  # a plain prompt: `generate` prefills it itself, as under `hf`
                result = empty_result(self.model)
        out, fed = generate_after(
            method, prompt, result, max_length=max_length,
            criteria=lambda fed: stop_sequences_criteria(self.tokenizer, until, fed, 1),
            pad_token_id=self.tokenizer.pad_token_id, use_cache=True, **kwargs)
        state["result"] = result
        return out[0, fed:].tolist(), until

    def _answer(self, tokens: list[int], until: list[str]) -> str:
        from lm_eval.models.utils import postprocess_generated_text

        think = self.think_end_token if isinstance(self.think_end_token, str) else None  # as `hf`
        return postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=think)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """`hf`'s generate_until for plain prompts; the others over the method's cache, one at a time."""
        from lm_eval.models.utils import normalize_gen_kwargs

        out: list[str | None] = [None] * len(requests)
        plain, engine = [], []
        prompts: dict[int, list[int]] = {}
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            budget = self.max_length - kwargs["max_gen_toks"]
            if budget < 1:
                raise ValueError(f"max_gen_toks {kwargs['max_gen_toks']} must be below max_length {self.max_length}")
            ids = prompts[i] = self.encode_prompt(context, budget)  # `hf`'s left truncation
            sampled_with_seed = kwargs.get("do_sample") and self.settings.seed is not None
            plan = self.method.plan(len(ids))  # the request's one decision
            if plan.plain and not sampled_with_seed:
                plain.append((i, plan))
            else:
                engine.append((i, ids, plan))
        if plain:  # `hf`'s own code, batched as `hf` batches (a single prompt's prefill timed: `_model_generate`)
            for (i, _), text in zip(plain, super().generate_until([requests[i] for i, _ in plain], disable_tqdm)):
                out[i] = text
            for i, plan in plain:
                seconds = self._plain_seconds.get(hash(tuple(prompts[i])))
                self.item_costs.record(requests[i].args[0], self.plain_cost(plan, seconds))
            self._plain_seconds.clear()
        bar = tqdm(total=len(engine), desc="Running generate_until requests (engine)",
                   disable=disable_tqdm or self.rank != 0 or not engine)
        with self.method.forward_context() if engine else nullcontext():  # once, around every engine request
            for i, ids, plan, state in self._generation_states(engine):
                context, gen_kwargs = requests[i].args
                tokens, until = self.generate_tokens(self.method, ids, gen_kwargs, state, plan)
                self.item_costs.record(context, self._first_cost(self.method, plan, state))
                out[i] = self._answer(tokens, until)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), out[i])
                bar.update(1)
        bar.close()
        return out  # type: ignore[return-value]

    def _first_cost(self, method: Any, plan: Any, state: dict | None) -> Any:
        """The cost of a generation's prompt under `method` (`plan`: its plan): the method's prefill's
        (`timed_prefill`), else exact's (the stock `generate` prefilled it: a plain prompt, or one of a single
        token)."""
        cost = (state or {}).get("cost")
        return cost if cost is not None else method.prefill_cost(plan.n, plan=plan)

    def _generation_states(self, engine: list[tuple[int, list[int], Any]]):
        """(request, prompt, its plan, generate_tokens state) for each engine request: the prompts
        `generation_cache` prefills (all but the last token) go `batch_size` at a time through
        `batched_prefills`, longest first; the others (plain, or a single token) start with no state, as
        `generation_cache` has it."""
        prefilled = [(i, ids, plan) for i, ids, plan in engine if generation_cache_needed(plan)]
        for i, ids, plan in engine:
            if not generation_cache_needed(plan):
                yield i, ids, plan, None
        heads = [generation_prompt(self.method, ids) for _, ids, _ in prefilled]
        plans = [plan for _, _, plan in prefilled]
        for p, result, cost in batched_prefills(self.method, heads, plans, self.continuation_batch,
                                                for_generation=True):
            i, ids, plan = prefilled[p]
            yield i, ids, plan, {"result": result, "cost": cost}

    def multiturn_generate(self, requests: list) -> list[dict[str, Any]]:
        """Custom request type: later turns appended to the cache of the earlier ones (no second prefill).

        args (turns, gen_kwargs) -> dict. turns: [str, ...]. turns[0] is the
        prompt, prefilled by the method (rows chosen once); the answer is
        generated over that cache. Each later turn's text is tokenized without
        special tokens and appended after the tokens of the previous answer
        exactly as generated (including the stop string or EOS token that ended
        it) through the stock model: no second prefill, no new row choice. Tasks
        write any chat formatting of later turns into the turn text themselves.
        gen_kwargs: one dict for every turn, or a list with one dict per turn.
        Returns {"answers": [str per turn]} (stop strings removed, as
        generate_until) and with reference=exact also {"exact_answers": [...]},
        the exact arm's own multi-turn run on the same turns.
        """
        return self._cached("multiturn_generate", requests, self._multiturn)

    def _multiturn(self, turns: list[str], gen_kwargs: dict | list[dict]) -> dict[str, Any]:
        if not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError("multiturn_generate: turns must be a non-empty list of strings")
        per_turn = gen_kwargs if isinstance(gen_kwargs, list) else [gen_kwargs] * len(turns)
        if len(per_turn) != len(turns):
            raise ValueError(f"multiturn_generate: {len(turns)} turns but {len(per_turn)} gen_kwargs")
        with self.method.forward_context():
            answers, first = self._run_turns(self.method, turns, per_turn)
        self.item_costs.record(turns, first)
        out = {"answers": answers}
        if self.settings.reference == "exact":
            with self.exact.forward_context():
                out["exact_answers"] = self._run_turns(self.exact, turns, per_turn)[0]
        return out

    def _run_turns(self, method: Any, turns: list[str], per_turn: list[dict]) -> tuple[list[str], Any]:
        """Each turn's answer, and the cost of the first turn's prefill (the only prefill: later turns are
        appended to its cache)."""
        from lm_eval.models.utils import normalize_gen_kwargs

        first_budget = self.max_length - normalize_gen_kwargs(per_turn[0], self.max_gen_toks)["max_gen_toks"]
        seq = self.encode_prompt(turns[0], first_budget)
        state: dict[str, Any] = {}
        answers, first = [], None
        plan = method.plan(len(seq))  # the first turn's prompt: the only one the method prefills
        for index, (text, kwargs) in enumerate(zip(turns, per_turn)):
            if index:
                seq = seq + self.tok_encode(text, add_special_tokens=False)
            if len(seq) > self.max_length:
                log.warning("multiturn_generate: turn %d runs to %d tokens, past max_length", index, len(seq))
            tokens, until = self.generate_tokens(method, seq, kwargs, state, plan)
            if index == 0:
                first = self._first_cost(method, plan, state)
            seq = seq + tokens
            answers.append(self._answer(tokens, until))
        return answers, first
