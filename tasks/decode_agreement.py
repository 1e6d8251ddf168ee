"""`decode_agreement`: how long an arm follows the exact model's own decoding (paper section 3.1).

The exact arm's greedy continuation of each prompt (metadata `decode_tokens`,
default 512) is fed to the arm one token at a time, teacher-forced: one
`token_logprobs` request per document with the continuation
`{"exact_greedy": k}`; the adapter generates it with its exact method over
the same prompt, so every arm of a study scores the same tokens. At each step
the arm's most likely next token either matches the exact arm's or not. A
continuation ends early where the exact arm's greedy decoding ends (its EOS);
`n_steps` counts the steps scored.

Documents (metadata `docs`, as keytoken_nll reads them) are a seeded draw
(`seed`, default 0) of `n_docs` (default 20). With metadata `lengths` (a list
of N) a document's prompt is its first N tokens, and the draw is balanced
across the lengths (20 over 8,192, 16,384 and 32,768: 7, 7 and 6, as the
paper draws), each from the documents that long; the id is then
`<doc_id>@<N>`. Without `lengths` a prompt is the whole document (left-truncated
to the model's max_length less the continuation, as loglikelihood truncates).

Per-document metrics (documents weighted equally; paired across arms by
`doc_id` in --log_samples): `agreement` (share of steps where the arm's argmax
is the exact arm's token), `first_departure` (the first step where it is not;
`decode_tokens` when it never departs) with `first_departure_median`,
`full_agreement` (share of documents with no departure); with the adapter's
`reference=exact` also `kl` (the document's mean KL(exact||arm)), `kl_median`
and `kl_mean` (over every step of every document); `n_steps`.
"""

from __future__ import annotations

import random
from typing import Any

from lm_eval.api.task import ConfigurableTask

from rf_eval.tasks import request_types
from rf_eval.tasks.common import (
    COST_METRICS,
    cost_fields,
    mean_present,
    median_present,
    metric_list,
    option,
    strip_task_keys,
    sum_present,
    tokenizer_from,
    with_run_defaults,
)
from rf_eval.tasks.keytoken import (
    KeyTokenDataError,
    documents_folder,
    load_documents,
    pooled_mean,
    pooled_median,
)

request_types.install()


def quotas(n: int, groups: int) -> list[int]:
    """`n` split over `groups` as evenly as possible, the first groups taking the remainder."""
    return [n // groups + (1 if i < n % groups else 0) for i in range(groups)]


def draw(docs: list[dict[str, Any]], n_docs: int, seed: int, lengths: list[int], tokenizer: Any = None) -> list[dict[str, Any]]:
    """The seeded, length-balanced draw of prompts (see the module docstring)."""
    rng = random.Random(seed)
    if not lengths:
        picked = sorted(rng.sample(range(len(docs)), min(n_docs, len(docs))))
        return [docs[i] for i in picked]
    out = []
    for n, quota in zip(lengths, quotas(n_docs, len(lengths))):
        long_enough = []
        for doc in docs:
            offsets = tokenizer(doc["text"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) >= n:
                long_enough.append({**doc, "doc_id": f"{doc['doc_id']}@{n}", "length": n,
                                    "text": doc["text"][: offsets[n - 1][1]]})
        picked = sorted(rng.sample(range(len(long_enough)), min(quota, len(long_enough))))
        out += [long_enough[i] for i in picked]
    if not out:
        raise KeyTokenDataError(f"lengths {lengths}: no document is that long")
    return out


def first_departure(greedy: list[bool]) -> int:
    """Index of the first step whose arm argmax is not the exact token (len(greedy) if none)."""
    return next((i for i, same in enumerate(greedy) if not same), len(greedy))


class DecodeAgreementTask(ConfigurableTask):
    """Token agreement with the exact arm's greedy continuation, per document."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None) -> None:
        cfg, _ = strip_task_keys(config)
        meta = with_run_defaults(cfg.get("metadata"))
        cfg["metadata"] = meta
        self.decode_tokens = option(meta, "decode_tokens", 512, int)
        self.n_docs = option(meta, "n_docs", 20, int)
        self.seed = option(meta, "seed", 0, int)
        self.lengths = [int(x) for x in option(meta, "lengths", [], list)]
        if self.decode_tokens < 1 or self.n_docs < 1:
            raise ValueError("decode_agreement: decode_tokens and n_docs must be >= 1")
        cfg["metric_list"] = metric_list(self.metric_spec())
        cfg["process_results"] = self.process_results
        super().__init__(config=cfg)

    @staticmethod
    def metric_spec() -> dict[str, tuple[Any, bool]]:
        return {
            "agreement": (mean_present, True),
            "first_departure": (mean_present, True),
            "first_departure_median": (median_present, True),
            "full_agreement": (mean_present, True),
            "kl": (mean_present, False),
            "kl_median": (pooled_median, False),
            "kl_mean": (pooled_mean, False),
            "n_steps": (sum_present, True),
            **COST_METRICS,
        }

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        import datasets

        path = documents_folder(self.config.metadata, "decode_agreement")
        tokenizer = tokenizer_from(self.config.metadata) if self.lengths else None
        docs = draw(load_documents(path), self.n_docs, self.seed, self.lengths, tokenizer)
        self.dataset = {"test": datasets.Dataset.from_list(docs)}

    def doc_to_text(self, doc: dict[str, Any], doc_to_text: Any = None) -> str:
        return ""

    def doc_to_target(self, doc: dict[str, Any], doc_to_target: Any = None) -> str:
        return ""

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any):
        from lm_eval.api.instance import Instance

        kwargs.pop("apply_chat_template", None)
        kwargs.pop("chat_template", None)
        args = (doc["text"], {"exact_greedy": self.decode_tokens})
        return [Instance(request_type="token_logprobs", doc=doc, arguments=args, idx=0, **kwargs)]

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        resp = results[0]
        greedy = [bool(x) for x in resp["greedy"]]
        first = first_departure(greedy)
        kl = list(resp["kl"]) if "kl" in resp else None
        return {
            "agreement": sum(greedy) / len(greedy),
            "first_departure": first,
            "first_departure_median": first,
            "full_agreement": float(first == len(greedy)),
            "kl": sum(kl) / len(kl) if kl else None,
            "kl_median": kl,
            "kl_mean": kl,
            "n_steps": len(greedy),
            **cost_fields(doc["text"]),
        }
