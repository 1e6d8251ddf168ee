"""`PrefillLM`: an lm-eval model whose prompts are prefilled by an approximate-prefill engine.

Shared by the rf-eval adapters. A subclass names its config class and says how
to build its engines, prefill a prompt and extend a cache; this class does the
rest the way lm-eval's `hf` model does it (tokenization, left truncation to
max_length, chat templates, stop sequences, data parallel ranks, the
--use_cache hook), so that two runs differ only in the prefill. The request
formats are documented in `rf_eval.model_adapters.ridgefill`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM, hash_args
from lm_eval.models.utils import _add_special_kwargs, configure_pad_token, has_bos_prefix, resolve_max_length
from tqdm import tqdm

from rf_eval.model_adapters.config import ModelArgs, ModelArgsError, parse_model_args

log = logging.getLogger(__name__)

ARM_KEY = "rf-eval:arm"  # where the adapter records its arm in a --use_cache database


class PrefillLM(TemplateLM):
    config_class: ClassVar[type[ModelArgs]] = ModelArgs
    backend = "causal"
    max_gen_toks = 256  # lm-eval's `hf` default

    def __init__(self, config: ModelArgs | None = None, **model_args: Any) -> None:
        super().__init__()
        self.config = config if config is not None else parse_model_args(self.config_class, model_args)
        self._preflight()
        self._setup_distributed()
        self.tokenizer = self._load_tokenizer()
        self.model = self._load_model()
        self.tokenizer = configure_pad_token(self.tokenizer, model_config=self.model.config)
        self.arm, self.exact = self._build_engines()
        self._max_length = self.config.max_length or resolve_max_length(self.model.config, self.tokenizer)
        self.hf = self._plain_hf()

    # ---- what a subclass provides -------------------------------------------------

    def _preflight(self) -> None:
        """Checks that need files but not the model weights (before anything heavy loads)."""

    def _build_engines(self) -> tuple[Any, Any]:
        """(arm engine, exact engine) over `self.model`."""
        raise NotImplementedError

    def _prefill(self, engine: Any, ids: list[int], for_generation: bool = False):
        """PrefillResult of `ids`; `for_generation`: ids are a prompt minus its last token."""
        raise NotImplementedError

    def _extend(self, engine: Any, result: Any, tokens: torch.Tensor) -> torch.Tensor:
        return engine.extend(result, tokens)

    def _is_plain(self, engine: Any, n: int) -> bool:
        """True when the engine would prefill an n-token prompt with the plain model (no filled rows)."""
        raise NotImplementedError

    def arm_info(self) -> dict[str, Any]:
        raise NotImplementedError

    # ---- construction -------------------------------------------------------------

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls(parse_model_args(cls.config_class, arg_string, additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        return cls(parse_model_args(cls.config_class, arg_dict, additional_config))

    def _setup_distributed(self) -> None:
        """Data parallel under `accelerate launch -m lm_eval`, as lm-eval's `hf` model."""
        self.accelerator = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.num_processes > 1:
                self.accelerator = accelerator
                self._rank = accelerator.local_process_index
                self._world_size = accelerator.num_processes
                self._device = accelerator.device
                return
        device = self.config.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device.startswith("cuda") and not torch.cuda.is_available():
            log.warning("device %r requested but CUDA is not available: using cpu (as lm-eval's hf model)", device)
            device = "cpu"
        self._device = torch.device(device)

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        kwargs: dict[str, Any] = {"trust_remote_code": self.config.trust_remote_code}
        if self.config.add_bos_token is not None:
            kwargs["add_bos_token"] = self.config.add_bos_token
        return AutoTokenizer.from_pretrained(self.config.tokenizer or self.config.pretrained, **kwargs)

    def _load_model(self):
        from transformers import AutoModelForCausalLM

        from rf_eval.api import parse_dtype

        dtype = "auto" if self.config.dtype == "auto" else parse_dtype(self.config.dtype, str(self._device))
        model = AutoModelForCausalLM.from_pretrained(
            self.config.pretrained, dtype=dtype, trust_remote_code=self.config.trust_remote_code
        )
        return model.to(self._device).eval()

    def _plain_hf(self):
        """lm-eval's own `hf` model over the same model object: it runs every request with no filled rows.

        Where the engine would prefill with the plain model anyway, prompt and
        continuation (or generation) run through `hf`'s code, batched as `hf`
        batches, so the exact arm is `hf` itself (bitwise, at any batch size).
        """
        from lm_eval.models.huggingface import HFLM

        quiet = logging.getLogger("lm_eval.models.huggingface")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # it warns that it was given a loaded model: that is the point
        try:
            hf = HFLM(
                pretrained=self.model, tokenizer=self.tokenizer, batch_size=self.config.batch_size,
                max_batch_size=self.config.max_batch_size or 64, max_length=self.max_length,
                add_bos_token=self.config.add_bos_token,
            )
        finally:
            quiet.setLevel(level)
        hf._rank = self.rank  # progress bars on the main process only; data parallel is this adapter's
        return hf

    # ---- lm-eval plumbing -----------------------------------------------------------

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def batch_sizes(self) -> dict:
        """What lm-eval records as the batch sizes used (those `hf` chose for batch_size=auto)."""
        return self.hf.batch_sizes

    @property
    def batch_size(self) -> int:
        return self.config.continuation_batch

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.gather(tensor) if self.accelerator else tensor

    def gather_object(self, obj: Any, dst: int = 0) -> list | None:
        if self.world_size <= 1:
            return [obj]
        result = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj=obj, object_gather_list=result, dst=dst)
        return result

    def barrier(self) -> None:
        if self.accelerator:
            self.accelerator.wait_for_everyone()

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        import jinja2

        def render(history):
            return self.tokenizer.apply_chat_template(
                history,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt,
            )

        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:
            log.warning("chat template failed; retrying without the system message")
            return render([m for m in chat_history if m["role"] != "system"])

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, self.config.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def encode_prompt(self, string: str) -> list[int]:
        """A generation prompt, tokenized as `hf` tokenizes a generate_until batch."""
        special: dict[str, Any] = {}
        if has_bos_prefix(string, getattr(self.tokenizer, "bos_token", None)):
            special["add_special_tokens"] = False
        elif self.config.add_bos_token is not None:
            special["add_special_tokens"] = self.config.add_bos_token
        return self.tokenizer(string, **special)["input_ids"]

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def get_model_info(self) -> dict[str, Any]:
        """Recorded by lm-eval in the results JSON ("config")."""
        import rf_eval

        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": str(next(self.model.parameters()).dtype),
            "rf_eval_version": rf_eval.__version__,
            "rf_eval": self.arm_info(),
        }

    def set_cache_hook(self, cache_hook) -> None:
        """Refuse a --use_cache database written by another arm (its keys are request args only)."""
        super().set_cache_hook(cache_hook)
        self.hf.set_cache_hook(cache_hook)
        db = cache_hook.dbdict
        if db is None:
            return
        mine = json.dumps(self._arm_fingerprint(), sort_keys=True, default=str)
        stored = db.get(ARM_KEY)
        if stored is None and len(db) > 0:
            raise ModelArgsError("the --use_cache database holds results of another model; give this arm its own path")
        if stored is not None and stored != mine:
            raise ModelArgsError(
                f"the --use_cache database holds results of another arm ({stored}); this arm is {mine}. "
                "Give each arm its own --use_cache path."
            )
        if stored is None:
            db[ARM_KEY] = mine
            db.commit()

    def _arm_fingerprint(self) -> dict[str, Any]:
        skip = {"device", "batch_size", "max_batch_size", "seed"}  # do not change results
        args = {k: v for k, v in dataclasses.asdict(self.config).items() if k not in skip}
        return {"adapter": type(self).__name__, "args": args, "arm": self.arm_info(), "max_length": self.max_length}

    def _cached(self, attr: str, requests: list, compute) -> list:
        """Results of a custom request type, through the --use_cache database like lm-eval's own types."""
        db = self.cache_hook.dbdict
        out = []
        for req in tqdm(requests, desc=f"Running {attr} requests", disable=self.rank != 0):
            sampled = _samples(req.args)
            key = hash_args(attr, req.args) if db is not None and not sampled else None
            if key is not None and key in db:
                out.append(db[key])
                continue
            res = compute(*req.args)
            self.cache_hook.add_partial(attr, req.args, res)
            out.append(res)
        return out

    # ---- scoring -----------------------------------------------------------------

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

    # ---- generation ----------------------------------------------------------------

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


def _right_padded(seqs: list[list[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def _samples(args: tuple) -> bool:
    """True for requests that sample (lm-eval does not cache those)."""
    kwargs = args[-1] if args else None
    items = kwargs if isinstance(kwargs, list) else [kwargs]
    return any(isinstance(k, dict) and k.get("do_sample") for k in items)
