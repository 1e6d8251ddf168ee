"""`keytoken_nll`: loss on the tokens that need the prefix (paper sections 3.1, 3.2 and 4.7).

Each long document is scored on its last `score_tokens` tokens (default 512)
with per-token log-probabilities from one `token_logprobs` request: one
engine prefill of the rest of the document, one stock pass over the scored
tokens (the adapter's request type; `--model ridgefill` / `rarecache`).

Subsets (`token_masks`): novel tokens (no repeated `ngram`-token run, default
8), key tokens (exact loss rises by more than `key_threshold` nats, default 2,
when the context is cut to its last `key_context` tokens, default 4,096),
copyable tokens (section 4.7). Key tokens are decided from the exact arm and
shared by every arm, from one of two sources (metadata `key_reference`):

- a path: the samples file (`--log_samples`) of an earlier run of this task on
  the exact arm (`fill=exact`, or any arm with `reference=exact`); one request
  per document;
- `inprocess` (default): a second request per document scores the same tokens
  after the cut context. The exact losses come from the arm itself when it is
  exact (`fill=exact`) or from the adapter's `reference=exact` pass.

Per-document metrics (loss in nats per token, documents weighted equally):
`nll_all`, `nll_novel`, `nll_key`; against the exact losses (same-run
`reference=exact`, else the reference file) `dnll_all`, `dnll_novel`,
`dnll_key`; with a same-run reference `kl` (the document's mean KL(exact||arm),
averaged over documents) and `top1_agree`; `copyable_share`; counts
`n_tokens`, `n_novel`, `n_key`.

Agreement protocol (section 4.7): `kl_median` and `kl_mean` are the median
and mean of KL(exact||arm) over every scored position of every document
(positions pooled: the median is the paper's "median position"). With
metadata `lengths` (a list of N), each document is read at each N as its
first N + `score_tokens` tokens: the first N are the context and the last
`score_tokens` (default 512) are scored; a document shorter than that is
left out at that N. Its id is then `<doc_id>@<N>`, and per length N the
metrics `kl_median_N`, `kl_mean_N`, `top1_agree_N`, `dnll_all_N` are added.

One stretch of text for every model (section 3.2: "its last 512 tokens under
the Qwen3.8 tokenizer"): metadata `score_tokenizer` (a tokenizer name or local
folder) fixes the scored text as the characters of its last `score_tokens`
tokens, and `lengths` N count its tokens, so two models read and score the
same characters (each in its own tokens: their counts differ, `n_tokens`).
The key-token cut stays `key_context` of the model's own tokens. Default: the
model's own tokenizer fixes both. The task's metadata records which
(`scored_text`), and reports print it.

Documents (metadata `docs`): a folder of `.txt` files (one document each, id
= file name, domain = subfolder name) and/or `.jsonl` files (one
{"text", optional "id", "domain"} per line), or one such file; they and the
`key_reference` file are read and checked in `keytoken_files`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from lm_eval.api.task import ConfigurableTask

from rf_eval.tasks import request_types, token_masks
from rf_eval.tasks.common import (
    COST_METRICS,
    as_bool,
    cost_fields,
    mean_present,
    metric_list,
    option,
    strip_task_keys,
    sum_present,
    tokenizer_from,
    with_run_defaults,
)
from rf_eval.tasks.keytoken_files import (  # noqa: F401  (documents_folder, load_documents: the task's API)
    DOCS_OPTION,
    KeyTokenDataError,
    documents_folder,
    exact_logprobs,
    load_documents,
    read_reference,
)

log = logging.getLogger(__name__)

def pooled(values: list[Any]) -> list[float]:
    """Per-position values of every document with any (a document's value: a list, or None)."""
    return [float(x) for v in values if v is not None for x in v]


def pooled_median(values: list[Any]) -> float:
    import statistics

    xs = pooled(values)
    return float(statistics.median(xs)) if xs else math.nan


def pooled_mean(values: list[Any]) -> float:
    xs = pooled(values)
    return sum(xs) / len(xs) if xs else math.nan


def length_grid(tokenizer: Any, docs: list[dict[str, str]], lengths: list[int], score_tokens: int) -> list[dict[str, Any]]:
    """Each document cut to its first N + score_tokens tokens (of `tokenizer`: the scoring tokenizer), for every
    N it is long enough for."""
    out = []
    for n in lengths:
        for doc in docs:
            offsets = tokenizer(doc["text"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) < n + score_tokens:
                continue
            out.append({**doc, "doc_id": f"{doc['doc_id']}@{n}", "text": doc["text"][: offsets[n + score_tokens - 1][1]],
                        "length": n})
    if not out:
        raise KeyTokenDataError(f"lengths {lengths}: no document has N + {score_tokens} tokens at any N")
    return out


def _offsets(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


def split_document(tokenizer: Any, text: str, score_tokens: int, key_context: int,
                   score_tokenizer: Any = None) -> dict[str, Any]:
    """The document cut into (context, scored text) at its last `score_tokens` tokens (of `score_tokenizer`,
    default `tokenizer`), plus the context cut to its last `key_context` tokens of `tokenizer` (None when
    the context is not longer)."""
    offsets = _offsets(score_tokenizer or tokenizer, text)
    if len(offsets) <= score_tokens:
        raise KeyTokenDataError(f"document of {len(offsets)} tokens is not longer than score_tokens={score_tokens}")
    at = offsets[len(offsets) - score_tokens][0]
    context = text[:at]
    own = offsets[: len(offsets) - score_tokens] if score_tokenizer is None else _offsets(tokenizer, context)
    n_context = len(own)
    cut = context[own[n_context - key_context][0] :] if n_context > key_context else None
    return {"context": context, "continuation": text[at:], "cut_context": cut, "context_tokens": n_context}


def score_tokenizer_from(name: str | None) -> Any:
    """The tokenizer that fixes the scored text (`score_tokenizer`), or None for the model's own."""
    if not name:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise KeyTokenDataError(f"score_tokenizer={name!r}: cannot load it ({err}); offline, give a local "
                                "tokenizer folder") from None


request_types.install()


class KeyTokenTask(ConfigurableTask):
    """Per-document loss on all, novel and key tokens of a long document's last tokens."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None) -> None:
        cfg, _ = strip_task_keys(config)
        meta = with_run_defaults(cfg.get("metadata"))
        cfg["metadata"] = meta
        self.lengths = [int(x) for x in option(meta, "lengths", [], list)]
        self.score_tokens = option(meta, "score_tokens", 512, int)
        self.key_context = option(meta, "key_context", 4096, int)
        self.ngram = option(meta, "ngram", 8, int)
        self.key_threshold = option(meta, "key_threshold", 2.0, float)
        self.key_reference = str(option(meta, "key_reference", "inprocess", str))
        meta["key_threshold"], meta["key_context"] = self.key_threshold, self.key_context  # for reports' notes
        self._said_no_keys = False
        self.score_tokenizer_name = option(meta, "score_tokenizer", None, str)
        self._score_tokenizer = score_tokenizer_from(self.score_tokenizer_name)
        under = f"the {self.score_tokenizer_name} tokenizer (the same text for every model)" \
            if self.score_tokenizer_name else "each model's own tokenizer"
        meta["scored_text"] = f"the last {self.score_tokens} tokens of each document under {under}"
        self.arm_exact = str(meta.get("fill", "")) == "exact"
        self.same_run_reference = str(meta.get("reference", "")) == "exact"
        self.verify_tokens = as_bool(option(meta, "verify_tokens", True))
        self._reference: dict[str, dict[str, Any]] | None = None
        self._splits: dict[str, dict[str, Any]] = {}
        cfg["metric_list"] = metric_list(self.metric_spec())
        cfg["process_results"] = self.process_results
        super().__init__(config=cfg)

    def metric_spec(self) -> dict[str, tuple[Any, bool]]:
        spec: dict[str, tuple[Any, bool]] = {}
        for name in ("nll_all", "nll_novel", "nll_key", "dnll_all", "dnll_novel", "dnll_key", "kl"):
            spec[name] = (mean_present, False)
        spec["nll_key"] = (self.key_token_mean, False)
        spec["kl_median"] = (pooled_median, False)
        spec["kl_mean"] = (pooled_mean, False)
        for n in self.lengths:
            spec[f"kl_median_{n}"] = (pooled_median, False)
            spec[f"kl_mean_{n}"] = (pooled_mean, False)
            spec[f"top1_agree_{n}"] = (mean_present, True)
            spec[f"dnll_all_{n}"] = (mean_present, False)
        spec["top1_agree"] = (mean_present, True)
        spec["copyable_share"] = (mean_present, False)
        for name in ("n_tokens", "n_novel", "n_key"):
            spec[name] = (sum_present, True)
        spec["arm_exact"] = (mean_present, True)
        return {**spec, **COST_METRICS}

    def no_key_tokens(self, outcome: str) -> None:
        """Warn, once, that no document has a key token: nll_key and dnll_key have nothing to average."""
        if not self._said_no_keys:
            self._said_no_keys = True
            log.warning("keytoken_nll: %s; nll_key and dnll_key %s",
                        token_masks.no_key_tokens(self.key_threshold, self.key_context), outcome)

    def key_token_mean(self, values: list[Any]) -> float:
        """The mean over documents with key tokens (`mean_present`); with none, nan and a warning saying why,
        not a bare nan in lm-eval's table. (`dnll_key` is empty exactly when this is, given exact losses.)"""
        values = list(values)
        if values and all(v is None for v in values):
            self.no_key_tokens(f"are nan over these {len(values)} documents")
        return mean_present(values)

    def build_all_requests(self, *args: Any, **kwargs: Any) -> None:
        """lm-eval's, then, before the model runs: a warning when no document's context is longer than
        key_context (in-process key tokens), as none can then have a key token."""
        super().build_all_requests(*args, **kwargs)
        if self._splits and self.reference() is None and all(s["cut_context"] is None for s in self._splits.values()):
            self.no_key_tokens(f"will be nan: no document's context is longer than {self.key_context} tokens")

    # ---- data

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        import datasets

        docs = load_documents(documents_folder(self.config.metadata, "keytoken_nll"))
        if self.lengths:
            scorer = self._score_tokenizer or tokenizer_from(self.config.metadata)
            docs = length_grid(scorer, docs, self.lengths, self.score_tokens)
        self.dataset = {"test": datasets.Dataset.from_list(docs)}

    def doc_to_text(self, doc: dict[str, Any], doc_to_text: Any = None) -> str:
        return ""

    def doc_to_target(self, doc: dict[str, Any], doc_to_target: Any = None) -> str:
        return ""

    def split(self, doc: dict[str, Any]) -> dict[str, Any]:
        key = doc["doc_id"]
        if key not in self._splits:
            tok = tokenizer_from(self.config.metadata)
            try:
                self._splits[key] = split_document(tok, doc["text"], self.score_tokens, self.key_context,
                                                   self._score_tokenizer)
            except KeyTokenDataError as err:
                raise KeyTokenDataError(f"document {key!r}: {err}") from err
        return self._splits[key]

    def reference(self) -> dict[str, dict[str, Any]] | None:
        if self.key_reference == "inprocess":
            return None
        if self._reference is None:
            self._reference = read_reference(self.key_reference)
        return self._reference

    # ---- requests

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any):
        from lm_eval.api.instance import Instance

        kwargs.pop("apply_chat_template", None)
        kwargs.pop("chat_template", None)
        parts = self.split(doc)
        reqs = [Instance(request_type="token_logprobs", doc=doc,
                         arguments=(parts["context"], parts["continuation"]), idx=0, **kwargs)]
        if self.reference() is None and parts["cut_context"] is not None:
            if not (self.arm_exact or self.same_run_reference):
                raise KeyTokenDataError(
                    "keytoken_nll finds key tokens from exact losses: run the exact arm (fill=exact), add "
                    "reference=exact to --model_args, or pass --metadata "
                    "'{\"key_reference\": \"<samples file of an exact run>\"}'"
                )
            reqs.append(Instance(request_type="token_logprobs", doc=doc,
                                 arguments=(parts["cut_context"], parts["continuation"]), idx=1, **kwargs))
        return reqs

    # ---- scoring

    def token_sequence(self, doc: dict[str, Any], resp: dict[str, Any]) -> tuple[list[int], int]:
        """(the tokens the model read then scored, index of the first scored token)."""
        tok = tokenizer_from(self.config.metadata)
        scored = list(resp["tokens"])
        ids = tok(doc["text"], add_special_tokens=False)["input_ids"]
        if self.verify_tokens and ids[-len(scored) :] != scored:
            log.warning("keytoken_nll: %s: scored tokens differ from the document's own tokenization", doc["doc_id"])
        context = ids[: len(ids) - len(scored)]
        seen = int(resp.get("context_tokens", len(context)))
        context = context[-seen:] if seen else []
        return context + scored, len(context)

    def key_tokens(self, doc: dict[str, Any], results: list[dict[str, Any]]) -> tuple[list[bool] | None, list[float] | None]:
        """(key-token mask, exact full-context log-probabilities) for one document."""
        ref = self.reference()
        n = len(results[0]["tokens"])
        if ref is not None:
            entry = ref.get(doc["doc_id"])
            if entry is None:
                raise KeyTokenDataError(f"key_reference holds no document {doc['doc_id']!r}")
            if entry["tokens"] != list(results[0]["tokens"]):
                raise KeyTokenDataError(f"key_reference scored other tokens for {doc['doc_id']!r} (another tokenizer?)")
            cut = entry["cut_exact"]
            mask = [False] * n if cut is None else token_masks.key_mask(entry["exact"], cut, self.key_threshold)
            same = exact_logprobs(results[0], False)
            return mask, same if same is not None else entry["exact"]
        full = exact_logprobs(results[0], self.arm_exact)
        if len(results) < 2:  # context not longer than key_context: cutting removes nothing
            return [False] * n, full
        cut = exact_logprobs(results[1], self.arm_exact)
        return token_masks.key_mask(full, cut, self.key_threshold), full

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        resp = results[0]
        arm_lp = list(resp["logprobs"])
        seq, start = self.token_sequence(doc, resp)
        novel = token_masks.novel_mask(seq, start, self.ngram)
        key, exact_lp = self.key_tokens(doc, results)
        nll = [-x for x in arm_lp]
        out: dict[str, Any] = {
            "nll_all": token_masks.masked_mean(nll),
            "nll_novel": token_masks.masked_mean(nll, novel),
            "nll_key": token_masks.masked_mean(nll, key),
            "n_tokens": len(nll),
            "n_novel": sum(novel),
            "n_key": sum(key),
            "copyable_share": token_masks.copyable_share(seq, start, self.ngram),
            "arm_exact": int(self.arm_exact),
        }
        if exact_lp is not None:
            diff = [e - a for a, e in zip(arm_lp, exact_lp)]  # arm loss minus exact loss
            out["dnll_all"] = token_masks.masked_mean(diff)
            out["dnll_novel"] = token_masks.masked_mean(diff, novel)
            out["dnll_key"] = token_masks.masked_mean(diff, key)
        else:
            out["dnll_all"] = out["dnll_novel"] = out["dnll_key"] = None
        out["kl"] = token_masks.masked_mean(resp["kl"]) if "kl" in resp else None
        out["top1_agree"] = token_masks.masked_mean([float(x) for x in resp["top1_agree"]]) if "top1_agree" in resp else None
        out["kl_median"] = out["kl_mean"] = list(resp["kl"]) if "kl" in resp else None
        for n in self.lengths:
            same = doc.get("length") == n
            out[f"kl_median_{n}"] = out[f"kl_mean_{n}"] = out["kl_median"] if same else None
            out[f"top1_agree_{n}"] = out["top1_agree"] if same else None
            out[f"dnll_all_{n}"] = out["dnll_all"] if same else None
        return {**out, **cost_fields(self.split(doc)["context"])}  # the full-context request's prefill
