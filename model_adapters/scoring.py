"""Scoring requests of `PrefillLM`: loglikelihood, loglikelihood_rolling, token_logprobs.

Formats: see `rf_eval.model_adapters.ridgefill`. A prompt with filled rows is
prefilled once by the engine; its continuations are read by the stock model
over that cache. Requests with no filled rows run through lm-eval's own `hf`
code (`PrefillLM.hf`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm


class ScoringMixin:
    def score_continuations(self, engine: Any, prompt: list[int], conts: list[list[int]]) -> list[torch.Tensor]:
        """Log-softmax rows (len(cont), V) predicting each continuation after `prompt`.

        The engine prefills `prompt` once: the first row is the prefill's last-row
        logits, the others come from the stock model over the prompt's cache,
        `batch_size` continuations at a time over copies of it (the last batch uses
        the cache itself). A prompt with no filled rows (the engine would run the plain
        model) runs with its continuation as one stock forward, exactly as `hf` does,
        so such results are bitwise `hf`'s at batch size 1.
        """
        if self._is_plain(engine, len(prompt)):
            return self._score_plain(prompt, conts)
        result = self._prefill(engine, prompt)
        first = F.log_softmax(result.logits, dim=-1)  # (1, V), in the logits' dtype, as `hf`
        rows: list[torch.Tensor] = [first] * len(conts)
        longer = [j for j, c in enumerate(conts) if len(c) > 1]
        step = self.batch_size
        for start in range(0, len(longer), step):
            chunk = longer[start : start + step]
            last = start + step >= len(longer)
            cache = result.cache if last else copy.deepcopy(result.cache)
            if len(chunk) > 1:
                cache.reorder_cache(torch.zeros(len(chunk), dtype=torch.long, device=self.device))
            tokens = _right_padded([conts[j][:-1] for j in chunk], self.tokenizer.pad_token_id or 0)
            logits = self._extend(engine, dataclasses.replace(result, cache=cache), tokens.to(self.device))
            for row, j in enumerate(chunk):
                rest = F.log_softmax(logits[row, : len(conts[j]) - 1], dim=-1)
                rows[j] = torch.cat([first, rest], 0)
        return rows

    @torch.no_grad()
    def _score_plain(self, prompt: list[int], conts: list[list[int]]) -> list[torch.Tensor]:
        """The stock model over prompt + continuation in one forward (`hf`'s computation)."""
        inputs: dict[tuple[int, ...], list[int]] = {}  # like `hf`, one forward per distinct input
        for j, cont in enumerate(conts):
            inputs.setdefault(tuple(prompt + cont[:-1]), []).append(j)
        rows: list[torch.Tensor | None] = [None] * len(conts)
        keys = sorted(inputs, key=len, reverse=True)
        for start in range(0, len(keys), self.batch_size):
            chunk = keys[start : start + self.batch_size]
            batch = _right_padded([list(k) for k in chunk], 0).to(self.device)
            logprobs = F.log_softmax(self.model(batch).logits, dim=-1)
            for row, key in enumerate(chunk):
                for j in inputs[key]:
                    rows[j] = logprobs[row, len(prompt) - 1 : len(prompt) - 1 + len(conts[j])]
        return rows  # type: ignore[return-value]

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

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **_: Any) -> list[tuple[float, bool]]:
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[int]] = {}
        plain = []
        for i, (_key, context, continuation) in enumerate(requests):
            prompt, _cut = self._truncate(context, continuation)
            if self._is_plain(self.arm, len(prompt)):
                plain.append(i)
            else:
                groups.setdefault(tuple(prompt), []).append(i)
        if plain:  # `hf`'s own code (it truncates, batches and writes --use_cache entries itself)
            for i, answer in zip(plain, self.hf._loglikelihood_tokens([requests[i] for i in plain], disable_tqdm)):
                results[i] = answer
        bar = tqdm(total=sum(map(len, groups.values())), desc="Running loglikelihood requests (engine)",
                   disable=disable_tqdm or self.rank != 0 or not groups)
        for prompt in sorted(groups, key=len, reverse=True):  # longest first, as `hf`: memory errors show early
            members = groups[prompt]
            conts = [requests[i][2] for i in members]
            for i, cont, rows in zip(members, conts, self.score_continuations(self.arm, list(prompt), conts)):
                target = torch.tensor(cont, device=rows.device)[None]  # (1, k), summed as `hf` sums
                greedy = bool((rows.argmax(-1)[None] == target).all())
                answer = (float(rows[None].gather(2, target[..., None])[..., 0].sum()), greedy)
                results[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
                bar.update(1)
        bar.close()
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for req in tqdm(requests, desc="Running loglikelihood_rolling requests", disable=disable_tqdm or self.rank != 0):
            (text,) = req.args
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1,
            )
            pieces = [(None, *make_disjoint_window(w)) for w in windows]
            total = sum(lp for lp, _ in self._loglikelihood_tokens(pieces, disable_tqdm=True))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def token_logprobs(self, requests: list) -> list[dict[str, Any]]:
        """Custom request type: per-token log-probabilities of a continuation over a filled prompt."""
        return self._cached("token_logprobs", requests, self._token_logprobs)

    def _token_logprobs(self, context: str, continuation: str | dict) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if isinstance(continuation, dict):
            k = int(continuation.get("exact_greedy", 0))
            if k < 1 or set(continuation) != {"exact_greedy"}:
                raise ValueError(f"token_logprobs: continuation dict must be {{'exact_greedy': k >= 1}}, got {continuation}")
            ctx = self.encode_prompt(context)
            kept = ctx[-(self.max_length - k) :]
            cont, _ = self.generate_tokens(self.exact, kept, {"until": [], "max_gen_toks": k, "do_sample": False})
            extra = {"text": self.tok_decode(cont)}
            ctx_truncated = len(ctx) - len(kept)
        else:
            ctx, cont = self._encode_request(context, continuation)
            kept, ctx_truncated = self._truncate(ctx, cont)
        if not cont:
            raise ValueError("token_logprobs: empty continuation")
        target = torch.tensor(cont, device=self.device)
        arm = self.score_continuations(self.arm, kept, [cont])[0].float()
        out: dict[str, Any] = {
            "tokens": cont,
            "logprobs": arm.gather(1, target[:, None])[:, 0].tolist(),
            "greedy": (arm.argmax(-1) == target).tolist(),
            "context_tokens": len(kept),
            "truncated": ctx_truncated,
            **extra,
        }
        if getattr(self.config, "reference", None) == "exact":
            exact = self.score_continuations(self.exact, kept, [cont])[0].float()
            out["exact_logprobs"] = exact.gather(1, target[:, None])[:, 0].tolist()
            out["kl"] = (exact.exp() * (exact - arm)).sum(-1).clamp_min(0).tolist()
            out["top1_agree"] = (exact.argmax(-1) == arm.argmax(-1)).tolist()
        return out


def _right_padded(seqs: list[list[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out
