"""lm-eval model `ridgefill`: every prompt is prefilled by the RidgeFill engine.

    lm_eval --model ridgefill \\
        --model_args pretrained=PATH,fill=ridge,maps=MAPS_DIR,tail=4096[,split=S][,reference=exact] \\
        --tasks ...

Everything after the prompt is the stock `transformers` model reading the
engine's cache (continuation tokens, generated tokens, later turns are never
filled), so a run differs from lm-eval's `hf` model in nothing but the prefill.
Requests whose prompt has no filled rows (fill=exact, or a prompt no longer
than the tail) are run by lm-eval's own `hf` code over the same model object,
batched as `hf` batches them: the exact arm is `hf`, bitwise, at any batch size.

model_args (parsed once into `RidgeFillConfig`, see `config.py`; unknown,
missing or contradictory keys fail before the model loads):
  pretrained   HF folder or hub id; `demo` or absent: the embedded demo model (rf_eval.demo)
  tokenizer    another tokenizer folder/id
  fill         exact | nofill | identity | ridge (required, except with the demo model, where it
               defaults to ridge with the demo's own maps, fitted on first use)
  maps     folder or file written by `rf-eval fit` (required for fill=ridge)
  split    first filled layer (default: the maps' split, else L/2)
  tail     last prompt rows kept exact (default 1024)
  chunk_size  lower layers run in chunks of this many rows (memory)
  reference   `exact`: also run the exact arm on the same inputs (see token_logprobs,
              multiturn_generate); other request types ignore it
  selector, corrections, splice, cost_match, unigram
              the engine's parts, as one-line specs (rf_eval.spec; no commas, so they fit
              model_args): selector=attention(share=0.1), selector=random(seed=3;of=attention),
              corrections=value_rescale(c=512)+terminal_state(path=F), splice=keys|values|both,
              cost_match=ridge(tail=4096;exact_share=0.1) (fill=nofill). Rows are chosen once per
              prompt; continuation tokens and later turns never choose rows.
  device, dtype (auto | float32 | bfloat16 | float16), max_length, trust_remote_code,
  add_bos_token (as for `hf`)
  seed        sampled generation draws from a torch seed made of (seed, prompt tokens), per
              request, so arms and resumed runs sample the same stream (without it: lm-eval's
              --seed, one stream for the run, as `hf`)
  batch_size  (or lm-eval's --batch_size; model_args win) requests with no filled rows: as `hf`
              (auto included). Prompts with filled rows are prefilled one at a time (the engine
              takes 1 x N); batch_size continuations of one prompt are then scored together over
              copies of its cache.
  max_batch_size  as `hf` (batch_size=auto)

Request types
-------------
loglikelihood        args (context, continuation) -> (logprob, is_greedy), as `hf`.
    Tokenized and left-truncated to max_length exactly like `hf`. The context is
    prefilled by the engine (once per distinct context); the first continuation
    token is scored from the prefill's last-row logits, the rest by the stock
    model over the cache.
loglikelihood_rolling  args (text,) -> logprob, with `hf`'s windows: disjoint
    windows of max_length tokens, each conditioned on the token before it; the
    first window's context is the prefix token (BOS, else EOS), the last window
    gets a full context. Each window's context is prefilled, its tokens scored as
    a continuation. Since continuation tokens are never filled, nearly every token
    here is scored exactly: rolling perplexity shows the fill only on the last
    window of documents longer than max_length. Use token_logprobs to measure
    loss over a filled prompt.
generate_until       args (context, gen_kwargs) -> str, as `hf` (until, max_gen_toks,
    do_sample, temperature, ...; --apply_chat_template / --system_instruction).
token_logprobs       args (context, continuation) -> dict
    `continuation` is a string, or {"exact_greedy": k}: the exact model's greedy
    continuation of k tokens (to measure decode agreement and KL against it).
    One engine prefill of the context and one stock pass over the continuation per
    request (never one request per token). Returns, per continuation token:
      {"tokens": [int], "logprobs": [float], "greedy": [bool],   # arm; greedy: argmax == token
       "context_tokens": int, "truncated": int}                   # prompt rows, tokens cut on the left
    and with reference=exact also
      {"exact_logprobs": [float], "kl": [float],                   # KL(exact || arm), nats
       "top1_agree": [bool]}                                        # argmax arm == argmax exact
    and for {"exact_greedy": k} also {"text": str}. Tokenization and truncation as
    loglikelihood (the continuation must fit in max_length).
multiturn_generate   args (turns, gen_kwargs) -> dict
    turns: [str, ...]. turns[0] is the prompt, prefilled by the engine (rows chosen
    once); the answer is generated over that cache. Each later turn's text is
    tokenized without special tokens and appended after the tokens of the previous
    answer exactly as generated (including the stop string or EOS token that ended
    it) through the stock model: no second prefill, no new row choice. Tasks write
    any chat formatting of later turns into the turn text themselves.
    gen_kwargs: one dict for every turn, or a list with one dict per turn.
    Returns {"answers": [str per turn]} (stop strings removed, as generate_until)
    and with reference=exact also {"exact_answers": [str per turn]}, the exact
    arm's own multi-turn run on the same turns.

Results of every request type are written to lm-eval's --use_cache database as
they finish (custom types included, except sampled generations), so a killed
run resumes. The cache keys on request arguments only (lm-eval's design): the
adapter stores its arm in the database and refuses a database written by
another arm.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry imports them only when empty)
import torch
from lm_eval.api.registry import register_model

from rf_eval.model_adapters.config import ModelArgsError, RidgeFillConfig
from rf_eval.model_adapters.prefill_lm import PrefillLM


@register_model("ridgefill")
class RidgeFillLM(PrefillLM):
    """`--model ridgefill`: prompts prefilled by `rf_eval.RidgeFill`; see the module docstring."""

    config_class = RidgeFillConfig
    config: RidgeFillConfig

    def _preflight(self) -> None:
        """Maps made for another model, or a split outside the model: an error before the weights load."""
        from transformers import AutoConfig

        from rf_eval.maps import config_hash, load_maps

        cfg = self.config
        model_config = AutoConfig.from_pretrained(cfg.pretrained, trust_remote_code=cfg.trust_remote_code)
        n_layers = getattr(model_config, "num_hidden_layers", None)
        if cfg.split is not None and n_layers is not None and not 1 <= cfg.split <= n_layers - 1:
            raise ModelArgsError(f"split={cfg.split} is outside 1..{n_layers - 1} for this {n_layers}-layer model")
        if cfg.maps is not None:
            self._maps = load_maps(cfg.maps, cfg.split)
            if self._maps.metadata.get("config_hash") != config_hash(model_config):
                raise ModelArgsError(f"maps={cfg.maps!r} were fitted for another model than {cfg.pretrained!r}")

    def _build_engines(self) -> tuple[Any, Any]:
        from rf_eval.api import RidgeFill

        cfg = self.config
        maps = getattr(self, "_maps", None)
        arm = RidgeFill(
            self.model, self.tokenizer, maps=maps, split=cfg.split, tail=cfg.tail, fill=cfg.fill,
            chunk_size=cfg.chunk_size, selector=cfg.selector, corrections=cfg.corrections, splice=cfg.splice,
            cost_match=cfg.cost_match, unigram=cfg.unigram,
        )
        exact = RidgeFill(self.model, self.tokenizer, split=arm.plan.split, tail=arm.plan.tail, fill="exact")
        return arm, exact

    def _prefill(self, engine: Any, ids: list[int], for_generation: bool = False):
        # For generation the last prompt token is left to `generate` (it runs it exactly, as a
        # tail row), so the engine prefills the rest with the tail shortened by one: every
        # prompt row keeps its class. The same convention as RidgeFill.generate.
        plan = dataclasses.replace(engine.plan, tail=max(engine.plan.tail - 1, 1)) if for_generation else None
        return engine.prefill(torch.tensor([ids], device=self.device), plan)

    def arm_info(self) -> dict[str, Any]:
        """The engine's provenance (fill, split, tail, selector, corrections, splice, cost_match, maps sha256
        and fit metadata) plus the adapter's own settings."""
        info = self.arm.provenance()
        info.update(method="ridgefill", reference=self.config.reference, maps_path=self.config.maps)
        return info

    def _is_plain(self, engine: Any, n: int) -> bool:
        return engine.is_plain(n)
