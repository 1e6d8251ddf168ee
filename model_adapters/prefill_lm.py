"""`PrefillLM`: an lm-eval model whose prompts are prefilled by an approximate-prefill engine.

Shared by the rf-eval adapters. A subclass names its config class and says how
to build its engines, prefill a prompt and extend a cache; this class does the
rest the way lm-eval's `hf` model does it (tokenization, left truncation to
max_length, chat templates, stop sequences, data parallel ranks, the
--use_cache hook), so that two runs differ only in the prefill. The request
formats are documented in `rf_eval.model_adapters.ridgefill`; the request
types themselves live in `scoring.py` and `generation.py`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, ClassVar

import torch
from lm_eval.api.model import TemplateLM, hash_args
from lm_eval.models.utils import _add_special_kwargs, configure_pad_token, has_bos_prefix, resolve_max_length
from tqdm import tqdm

from rf_eval.model_adapters.config import ModelArgs, ModelArgsError, parse_model_args
from rf_eval.model_adapters.generation import GenerationMixin
from rf_eval.model_adapters.scoring import ScoringMixin

log = logging.getLogger(__name__)

ARM_KEY = "rf-eval:arm"  # where the adapter records its arm in a --use_cache database


class PrefillLM(ScoringMixin, GenerationMixin, TemplateLM):
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


def _samples(args: tuple) -> bool:
    """True for requests that sample (lm-eval does not cache those)."""
    kwargs = args[-1] if args else None
    items = kwargs if isinstance(kwargs, list) else [kwargs]
    return any(isinstance(k, dict) and k.get("do_sample") for k in items)
