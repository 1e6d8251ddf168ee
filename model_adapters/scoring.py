"""Scoring requests of `PrefillLM`: loglikelihood (and through it loglikelihood_rolling), token_logprobs.

A prompt with filled rows is prefilled once by the method; its continuations
are read by the stock model over that cache. Requests whose prompt has no
filled row go to `HFLM`'s own code.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from rf_eval.engine import PrefillResult, shared_rows
from rf_eval.methods.requests import batched_prefills, timed_prefill


class ScoringMixin:
    def score_continuations(self, method: Any, prompt: list[int], conts: list[list[int]],
                            result: PrefillResult | None = None, plan: Any = None) -> list[torch.Tensor]:
        """Log-softmax rows (len(cont), V) predicting each continuation after `prompt`, inside the caller's
        forward context of `method`.

        The method prefills `prompt` once (`result`, when the caller prefilled it
        in a batch): the first row is the prefill's last-row logits, the others come
        from the stock model over the prompt's cache, `batch_size` continuations at a
        time over copies of it (the last batch uses the cache itself). A plain prompt
        runs with its continuation as one stock forward, as `hf` does. `plan`: the
        prompt's (`Method.plan`, the request's one decision; None: asked of the method here).
        """
        plan = plan if plan is not None else method.plan(len(prompt))
        if plan.plain:
            return self._score_plain(prompt, conts)
        if result is None:
            result = method.prefill(self.ids_tensor(prompt), plan=plan)
        first = F.log_softmax(result.logits, dim=-1)  # (1, V), in the logits' dtype, as `hf`
        rows: list[torch.Tensor] = [first] * len(conts)
        longer = [j for j, c in enumerate(conts) if len(c) > 1]
        step = self.continuation_batch
        for start in range(0, len(longer), step):
            chunk = longer[start : start + step]
            last = start + step >= len(longer)
            cache = result.cache if last else copy.deepcopy(result.cache)
            if len(chunk) > 1:
                cache.reorder_cache(torch.zeros(len(chunk), dtype=torch.long, device=self.input_device))
            tokens = _right_padded([conts[j][:-1] for j in chunk], self.tokenizer.pad_token_id or 0)
            logits = method.extend(dataclasses.replace(result, cache=cache), tokens.to(self.input_device))
            for row, j in enumerate(chunk):
                rest = F.log_softmax(logits[row, : len(conts[j]) - 1], dim=-1)
                rows[j] = torch.cat([first, rest], 0)
        return rows

    @torch.no_grad()
    def _score_plain(self, prompt: list[int], conts: list[list[int]]) -> list[torch.Tensor]:
        """The stock model over prompt + continuation in one forward (`hf`'s computation), its logits only
        for the rows that predict a continuation token (`logits_to_keep`): `hf` computes the vocabulary's
        logits for every prompt row and throws them away, N x V floats (16 GB in fp32 at 32K tokens and a
        128K vocabulary); the kept rows are the same sums (tests/model_adapters/test_adapter_requests.py)."""
        inputs: dict[tuple[int, ...], list[int]] = {}  # like `hf`, one forward per distinct input
        for j, cont in enumerate(conts):
            inputs.setdefault(tuple(prompt + cont[:-1]), []).append(j)
        rows: list[torch.Tensor | None] = [None] * len(conts)
        keys = sorted(inputs, key=len, reverse=True)
        step = self.continuation_batch
        first = len(prompt) - 1  # the row that predicts the first continuation token
        shared = len(keys) == 1 and shared_rows.active()  # one forward alone: rows another arm may share
        for start in range(0, len(keys), step):
            chunk = keys[start : start + step]
            logprobs = self._shared_logprobs(chunk[0], first) if shared else self._plain_logprobs(chunk, first)
            for row, key in enumerate(chunk):
                for j in inputs[key]:
                    rows[j] = logprobs[row, : len(conts[j])]
        return rows  # type: ignore[return-value]

    def _plain_logprobs(self, inputs: list[tuple[int, ...]], first: int) -> torch.Tensor:
        """Log-softmax of the stock model's logits from row `first` on, for `inputs` right-padded into one batch."""
        batch = _right_padded([list(k) for k in inputs], 0).to(self.input_device)
        logits = self.model(batch, logits_to_keep=batch.shape[1] - first).logits
        return F.log_softmax(logits, dim=-1)

    def _shared_logprobs(self, tokens: tuple[int, ...], first: int) -> torch.Tensor:
        """`_plain_logprobs` of one input inside `shared_rows.shared_rows()`: the rows an earlier arm of this
        process computed from the same weights and tokens, else computed and kept for the next."""
        key = shared_rows.model_key(self.model, self.input_device)
        if key is None:  # weights not all in memory: nothing to share under
            return self._plain_logprobs([tokens], first)
        found = shared_rows.lookup(key, tokens, first, self.input_device)
        if found is None:
            found = self._plain_logprobs([tokens], first)
            shared_rows.keep(key, tokens, first, found)
        return found

    def _encode_request(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context, continuation) tokens exactly as lm-eval's loglikelihood makes them (empty context included)."""
        if context:
            return self._encode_pair(context, continuation)
        cont = self.tok_encode(continuation, add_special_tokens=False)
        if cont and cont[0] == self.prefix_token_id:
            return cont[:1], cont[1:]
        return [self.prefix_token_id], cont

    def _truncate(self, context: list[int], continuation: list[int]) -> tuple[list[int], int]:
        """`hf`'s left truncation: the prompt that precedes `continuation` in max_length + 1 tokens."""
        whole = (context + continuation)[-(self.max_length + 1) :]
        if len(continuation) >= len(whole):
            raise ValueError(f"continuation of {len(continuation)} tokens does not fit max_length {self.max_length}")
        return whole[: len(whole) - len(continuation)], len(context) + len(continuation) - len(whole)

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:
        """`hf`'s loglikelihood for plain prompts; one method prefill per distinct prompt for the others."""
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[int]] = {}
        plans: dict[int, Any] = {}  # by prompt length: one decision per length (the plan is a function of it)
        plain = []
        for i, (_key, context, continuation) in enumerate(requests):
            prompt, _cut = self._truncate(context, continuation)
            plan = plans.get(len(prompt)) or plans.setdefault(len(prompt), self.method.plan(len(prompt)))
            if plan.plain:
                plain.append(i)
            else:
                groups.setdefault(tuple(prompt), []).append(i)
        if plain:  # `hf`'s own code (it truncates, batches and writes --use_cache entries itself)
            answers = super()._loglikelihood_tokens([requests[i] for i in plain], disable_tqdm, override_bs)
            for i, answer in zip(plain, answers):
                results[i] = answer
                # exact's cost; no seconds: the prompt and its continuation run as one forward
                n = len(self._truncate(*requests[i][1:])[0])
                self.item_costs.record(_context(requests[i]), self.plain_cost(plans[n]))
        bar = tqdm(total=sum(map(len, groups.values())), desc="Running loglikelihood requests (engine)",
                   disable=disable_tqdm or self.rank != 0 or not groups)
        prompts = list(groups)  # longest first, as `hf` (memory errors show early), `batch_size` prompts at a time
        prompt_plans = [plans[len(p)] for p in prompts]
        with self.method.forward_context() if groups else nullcontext():  # once, around every filled prompt
            for p, prefilled, cost in batched_prefills(self.method, prompts, prompt_plans, self.continuation_batch):
                members = groups[prompts[p]]
                conts = [requests[i][2] for i in members]
                for i in members:
                    self.item_costs.record(_context(requests[i]), cost)
                scored = self.score_continuations(self.method, list(prompts[p]), conts, prefilled, prompt_plans[p])
                for i, cont, rows in zip(members, conts, scored):
                    target = torch.tensor(cont, device=rows.device)[None]  # (1, k), summed as `hf` sums
                    greedy = bool((rows.argmax(-1)[None] == target).all())
                    answer = (float(rows[None].gather(2, target[..., None])[..., 0].sum()), greedy)
                    results[i] = answer
                    if requests[i][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
                    bar.update(1)
        bar.close()
        return results  # type: ignore[return-value]

    def token_logprobs(self, requests: list) -> list[dict[str, Any]]:
        """Custom request type: per-token log-probabilities of a continuation over a filled prompt.

        args (context, continuation) -> dict. `continuation` is a string, or
        {"exact_greedy": k}: the exact model's greedy continuation of k tokens
        (to measure decode agreement and KL against it). One method prefill of
        the context and one stock pass over the continuation per request (never
        one request per token). Tokenization and left truncation as
        loglikelihood (the continuation must fit in max_length). Returns, per
        continuation token:
          {"tokens": [int], "logprobs": [float], "greedy": [bool],   # arm; greedy: argmax == token
           "context_tokens": int, "truncated": int}                   # prompt rows, tokens cut on the left
        with reference=exact also
          {"exact_logprobs": [float], "kl": [float],                   # KL(exact || arm), nats
           "top1_agree": [bool]}                                        # argmax arm == argmax exact
        and for {"exact_greedy": k} also {"text": str}.
        """
        return self._cached("token_logprobs", requests, self._token_logprobs)

    def _token_logprobs(self, context: str, continuation: str | dict) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if isinstance(continuation, dict):
            k = int(continuation.get("exact_greedy", 0))
            if k < 1 or set(continuation) != {"exact_greedy"}:
                raise ValueError(f"token_logprobs: continuation dict must be {{'exact_greedy': k >= 1}}, got {continuation}")
            ctx = self.encode_prompt(context)
            kept = ctx[-(self.max_length - k) :]
            with self.exact.forward_context():
                cont, _ = self.generate_tokens(self.exact, kept, {"until": [], "max_gen_toks": k, "do_sample": False})
            extra = {"text": self.tok_decode(cont)}
            ctx_truncated = len(ctx) - len(kept)
        else:
            ctx, cont = self._encode_request(context, continuation)
            kept, ctx_truncated = self._truncate(ctx, cont)
        if not cont:
            raise ValueError("token_logprobs: empty continuation")
        target = torch.tensor(cont, device=self.input_device)
        plan = self.method.plan(len(kept))  # the request's one decision
        paired = self.settings.reference == "exact" and self.settings.paired_timing and not plan.plain
        exact_first = paired and self._exact_goes_first()
        exact_seconds = self._exact_prefill_seconds(kept) if exact_first else None
        with self.method.forward_context():
            prefilled, cost = ((None, self.plain_cost(plan)) if plan.plain
                               else timed_prefill(self.method, self.ids_tensor(kept), plan))
            arm = self.score_continuations(self.method, kept, [cont], prefilled, plan)[0]
        if paired and not exact_first:
            exact_seconds = self._exact_prefill_seconds(kept)
        self.item_costs.record(context, dataclasses.replace(cost, exact_prefill_seconds=exact_seconds))
        arm = arm.float().to(self.input_device)
        out: dict[str, Any] = {
            "tokens": cont,
            "logprobs": arm.gather(1, target[:, None])[:, 0].tolist(),
            "greedy": (arm.argmax(-1) == target).tolist(),
            "context_tokens": len(kept),
            "truncated": ctx_truncated,
            **extra,
        }
        if self.settings.reference == "exact":
            with self.exact.forward_context():
                exact = self.score_continuations(self.exact, kept, [cont])[0].float().to(self.input_device)
            out["exact_logprobs"] = exact.gather(1, target[:, None])[:, 0].tolist()
            out["kl"] = (exact.exp() * (exact - arm)).sum(-1).clamp_min(0).tolist()
            out["top1_agree"] = (exact.argmax(-1) == arm.argmax(-1)).tolist()
        return out

    def _exact_goes_first(self) -> bool:
        """Whether the exact prefill runs before the arm's on this request: in turn, so neither side always
        meets the warmer caches."""
        self._exact_turn = not getattr(self, "_exact_turn", False)
        return self._exact_turn

    def _exact_prefill_seconds(self, prompt: list[int]) -> float | None:
        """The exact model's prefill of `prompt`, timed as the arm's is (`timed_prefill`) beside it in this
        process: the measured speedup's reference paired in time (#55 item 6). Its cache is not kept; the
        `reference=exact` scores come from the stock forward they always came from."""
        with self.exact.forward_context():
            _, cost = timed_prefill(self.exact, self.ids_tensor(prompt), self.exact.plan(len(prompt)))
        return cost.prefill_seconds


def _context(request: tuple) -> str | None:
    """The context string of a `_loglikelihood_tokens` request ((context, continuation) key, tokens...)."""
    key = request[0]
    return key[0] if isinstance(key, tuple) and key else None


def _right_padded(seqs: list[list[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out
