"""The fill's quality on real weights, measured in process: loss on the tokens that need the prefix, and
filled-region needles.

The lm-eval tasks (`keytoken_nll`, `<task>_filled`) are the protocol users run; this module measures the
same quantities for many arms of one loaded model without an `lm_eval` process per arm, so that the demo's
settings can be chosen by a sweep (`benchmarks/demo_sweep.py`) and the quality tests on the demo model
(tests/demo/test_quality.py) stay fast. Definitions are the paper's (RidgeFill sections 3.1 and 4.7):

- each document is read as context (all but its last `score_tokens` tokens) and scored tokens; an arm
  prefills the context (`Method.prefill`) and the stock model scores the tokens over its cache
  (`extend`), as the `token_logprobs` request type does;
- key tokens: the exact arm's loss rises by more than 2 nats when its context is cut to the last
  `key_context` tokens (`token_masks.key_mask`); novel tokens: in no repeated 8-token run;
- ΔNLL: the arm's mean loss minus the exact arm's over a document's key (or novel) tokens, documents
  weighted equally; KL(exact || arm) per scored position, averaged over each document, then documents;
- needles: lm-eval's RULER samples (`ruler_data.generate`), rendered as a chat turn with the generator's
  answer prefix, greedy decoding, RULER's own `string_match_all`; a sample counts only when every needle
  lies in the filled region (`needles.mark`, which="all", the paper's appendix D condition).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rf_eval.tasks import needles, prompts, ruler_data, token_masks

KEY_THRESHOLD = 2.0  # nats (section 3.1)
NOVEL_NGRAM = 8


@dataclass
class DocumentLoss:
    """One arm's losses on one document's scored tokens (nats per token)."""

    nll: list[float]
    kl: list[float]


@dataclass
class LossReport:
    """Per arm: mean key-token and novel-token ΔNLL against exact, and mean KL(exact || arm)."""

    dnll_key: dict[str, float] = field(default_factory=dict)
    dnll_novel: dict[str, float] = field(default_factory=dict)
    kl: dict[str, float] = field(default_factory=dict)
    n_key: int = 0
    n_novel: int = 0
    documents: int = 0
    #: per arm and measure ("key", "novel", "kl"), one value per document (for "key" and "novel": the
    #: documents with such tokens, the same ones for every arm), for paired intervals between arms
    per_document: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"dnll_key": self.dnll_key, "dnll_novel": self.dnll_novel, "kl": self.kl,
                "n_key": self.n_key, "n_novel": self.n_novel, "documents": self.documents}


def _scored_logprobs(method: Any, context: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """(k, V) fp64 log-probabilities of the k scored tokens' positions: the prefill's last row, then the
    stock model over the cache for the first k-1 scored tokens."""
    with torch.no_grad():
        result = method.prefill(context)
        rest = method.extend(result, scored[:, :-1])[0] if scored.shape[1] > 1 else result.logits[:0]
        logits = torch.cat([result.logits.reshape(1, -1), rest.reshape(-1, rest.shape[-1])], 0)
    return torch.log_softmax(logits.double(), -1)


def document_losses(
    arms: Mapping[str, Any], exact: Any, ids: torch.Tensor, score_tokens: int
) -> tuple[dict[str, DocumentLoss], list[float]]:
    """Each arm's per-token loss and KL(exact || arm) on the last `score_tokens` tokens of `ids` (1 x M);
    also the exact arm's own per-token loss (the reference)."""
    context, scored = ids[:, :-score_tokens], ids[:, -score_tokens:]
    target = scored[0].unsqueeze(1)
    ref = _scored_logprobs(exact, context, scored)
    ref_nll = (-ref.gather(1, target)[:, 0]).tolist()
    out = {}
    for name, method in arms.items():
        lp = _scored_logprobs(method, context, scored)
        kl = (ref.exp() * (ref - lp)).sum(-1).clamp_min(0)
        out[name] = DocumentLoss(nll=(-lp.gather(1, target)[:, 0]).tolist(), kl=kl.tolist())
    return out, ref_nll


def key_tokens(exact: Any, ids: torch.Tensor, score_tokens: int, key_context: int,
               full_nll: Sequence[float]) -> list[bool]:
    """Scored tokens whose exact loss rises by > KEY_THRESHOLD nats with the context cut to its last
    `key_context` tokens."""
    cut = ids[:, -(score_tokens + key_context):]
    lp = _scored_logprobs(exact, cut[:, :-score_tokens], cut[:, -score_tokens:])
    cut_nll = (-lp.gather(1, cut[0, -score_tokens:].unsqueeze(1))[:, 0]).tolist()
    # key_mask compares log-probabilities: full-context minus cut-context
    return token_masks.key_mask([-x for x in full_nll], [-x for x in cut_nll], KEY_THRESHOLD)


def loss_report(arms: Mapping[str, Any], exact: Any, documents: Sequence[torch.Tensor], score_tokens: int,
                key_context: int) -> LossReport:
    """Key-token and novel-token ΔNLL and KL of every arm over `documents` (each 1 x M token ids)."""
    report = LossReport(documents=len(documents))
    per_doc: dict[str, dict[str, list[float]]] = {name: {"key": [], "novel": [], "kl": []} for name in arms}
    for ids in documents:
        losses, ref_nll = document_losses(arms, exact, ids, score_tokens)
        key = key_tokens(exact, ids, score_tokens, key_context, ref_nll)
        novel = token_masks.novel_mask(ids[0].tolist(), ids.shape[1] - score_tokens, NOVEL_NGRAM)
        report.n_key += sum(key)
        report.n_novel += sum(novel)
        for name, loss in losses.items():
            diffs = [a - r for a, r in zip(loss.nll, ref_nll)]
            for subset, mask in (("key", key), ("novel", novel)):
                value = token_masks.masked_mean(diffs, mask)
                if value is not None:
                    per_doc[name][subset].append(value)
            per_doc[name]["kl"].append(sum(loss.kl) / len(loss.kl))
    report.per_document = per_doc
    for name, values in per_doc.items():
        report.dnll_key[name] = _mean(values["key"])
        report.dnll_novel[name] = _mean(values["novel"])
        report.kl[name] = _mean(values["kl"])
    return report


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class NeedleSample:
    """One RULER sample rendered for the model: prompt ids, the answers, and whether it is filled."""

    index: int
    length: int
    ids: torch.Tensor
    outputs: tuple[str, ...]
    filled: bool


#: The first this many samples of each length (lm-eval's RULER generator at its default seeds) are report
#: data: the demo's study and the quality tests draw from them; development (`benchmarks/demo_sweep.py`,
#: `development=True`) only from the samples after them, so no needle that chose a setting is reported.
REPORT_NEEDLES = 32


def needle_samples(tokenizer: Any, tokenizer_path: str, lengths: Sequence[int], per_length: int, tail: int,
                   base_task: str = "niah_single_1", filled_only: bool = True, development: bool = False
                   ) -> list[NeedleSample]:
    """The first `per_length` samples of each length (filled ones only, by default) of lm-eval's RULER
    `base_task`, each rendered as one chat turn plus the generator's answer prefix; from the report samples
    (the first `REPORT_NEEDLES` of each length), or with `development` from those after them."""
    kind = ruler_data.RULER_TASKS[base_task][2]
    data = ruler_data.generate(base_task, {"tokenizer": tokenizer_path, "max_seq_lengths": list(lengths)})["test"]
    taken: dict[int, int] = {}
    seen: dict[int, int] = {}  # samples of each length met so far, filled or not: their rank in the set
    out = []
    for doc in data:
        length = int(doc["max_length"])
        rank = seen[length] = seen.get(length, 0) + 1
        if (rank <= REPORT_NEEDLES) == development or taken.get(length, 0) >= per_length:
            continue
        user, prefix = prompts.ruler_prompt(doc, "official")
        text = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True) + (prefix or "")
        filled = needles.mark(tokenizer, kind, text, doc, tail, base_task, which="all").filled
        if filled_only and not filled:
            continue
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        out.append(NeedleSample(int(doc["index"]), length, ids, tuple(doc["outputs"]), filled))
        taken[length] = taken.get(length, 0) + 1
    return out


def needle_hits(method: Any, tokenizer: Any, samples: Sequence[NeedleSample], max_new_tokens: int = 16
                ) -> list[bool]:
    """Greedy answers of `method` on each sample, scored by RULER's string_match_all (every answer found)."""
    from lm_eval.tasks.ruler.common_utils import string_match_all

    hits = []
    for sample in samples:
        with torch.no_grad():
            out = method.generate(sample.ids, max_new_tokens=max_new_tokens, do_sample=False,
                                  pad_token_id=tokenizer.pad_token_id)
        answer = tokenizer.decode(out[0, sample.ids.shape[1]:], skip_special_tokens=True)
        hits.append(string_match_all([answer], [list(sample.outputs)]) == 1.0)
    return hits


#: The README's sentence on what the map at layer S costs (tests/demo/test_quality.py checks it).
MAP_AT_S_MARKERS = ("<!-- map at S: figures checked by tests/demo/test_quality.py -->", "<!-- end map at S -->")


def map_at_s_sentence(report: LossReport, default: str, with_map: str) -> str:
    """What reading A_S x_S + b_S at layer S (`map_split=true`) changes against the default arm `default`,
    in words, from a `loss_report` holding both arms."""
    def change(measure: dict[str, float], digits: int) -> str:
        return f"{measure[with_map] - measure[default]:+.{digits}f}"

    return (f"On the demo model, with the quick demo's maps and documents, `map_split=true` changes key-token "
            f"ΔNLL by {change(report.dnll_key, 3)} nats, novel-token ΔNLL by {change(report.dnll_novel, 3)} and "
            f"KL(exact‖arm) by {change(report.kl, 4)} (`python benchmarks/demo_sweep.py --candidates demo "
            f"--sizes quick --map-split`).")
