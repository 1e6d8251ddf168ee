"""`<ruler task>_filled`: RULER scored on the filled region (paper section 3.1, appendix C).

The samples are lm-eval's own (`ruler_data.generate`); the official scorer is
lm-eval's (`string_match_all`, `string_match_part` for QA). Each sample's
needles are located in its final prompt string with the model's tokenizer
(`needles.mark`) when its request is built, so the chat template and the
prompt protocol are included; with the tail length (metadata `tail`, default
4,096) this fixes the filled-region subset, shared by every arm and split.

Excluded samples keep their lm-eval sample ids: every sample is run and
logged, and carries a `filled` flag (0/1) and `needle_rows_from_end` (prompt
rows after its last needle token; filled iff >= tail, so the subset for any
other tail can be recomputed from a samples file). Filled-region metrics are
`None` on excluded samples and are averaged over the filled ones only.

Metrics: `acc_filled` (filled-region accuracy), `acc_all` (the official
score on every sample), `n_filled` / `n_excluded` (counts), `filled` (share),
and per length L: `acc_filled_L`, `acc_all_L`, `n_filled_L`, `n_excluded_L`.
Scores are RULER's, in [0, 1].

Options (`--metadata` JSON; `--model_args` values are seen too): `tail`,
`protocol` (official | serving | serving_vllm, appendix E), `max_seq_lengths`,
`essay_haystack`, `squad_json`, `hotpotqa_json`, `seed`, `numpy_seed`.
"""

from __future__ import annotations

import logging
from typing import Any

from lm_eval.api.task import ConfigurableTask

from rf_eval.tasks import needles, prompts, ruler_data
from rf_eval.tasks.common import (
    mean_present,
    median_present,
    metric_list,
    option,
    strip_task_keys,
    sum_present,
    tokenizer_from,
)

log = logging.getLogger(__name__)

DEFAULT_TAIL = 4096


def rendered_prompt(tokenizer: Any, prompt: Any) -> str:
    """The prompt string the model reads: chat messages in JSON are rendered with the chat template."""
    text = getattr(prompt, "prompt", prompt)
    if text is not prompt:  # lm-eval's JsonChatStr: a JSON list of {"role", "content"} messages
        import json

        return tokenizer.apply_chat_template(json.loads(text), tokenize=False, add_generation_prompt=True)
    return text


def doc_key(doc: dict[str, Any]) -> tuple[int, int]:
    """A RULER sample's identity within a task: (length, index)."""
    return int(doc["max_length"]), int(doc["index"])


def ruler_score(base_task: str, doc: dict[str, Any], response: str) -> float:
    """RULER's official score of one response (lm-eval's implementation)."""
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all, string_match_part

    pred = postprocess_pred([response])
    scorer = string_match_part if ruler_kind(base_task) == "qa" else string_match_all
    return float(scorer(pred, [list(doc["outputs"])]))


def ruler_kind(base_task: str) -> str:
    return ruler_data.RULER_TASKS[base_task][2]


class RulerFilledTask(ConfigurableTask):
    """A RULER task of lm-eval, scored on the samples whose needles all lie in the prefix."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None) -> None:
        cfg, extra = strip_task_keys(config, "ruler_task")
        self.base_task: str = extra.get("ruler_task") or str(cfg["task"]).removesuffix("_filled")
        if self.base_task not in ruler_data.RULER_TASKS:
            raise ValueError(f"unknown RULER task {self.base_task!r}")
        meta = dict(cfg.get("metadata") or {})
        from lm_eval.tasks.ruler.common_utils import DEFAULT_SEQ_LENGTHS

        self.tail = option(meta, "tail", DEFAULT_TAIL, int)
        self.protocol = prompts.check_protocol(option(meta, "protocol", "official", str))
        self.lengths = [int(x) for x in option(meta, "max_seq_lengths", DEFAULT_SEQ_LENGTHS, list)]
        self._marks: dict[tuple[int, int], needles.NeedleMark] = {}
        cfg["metric_list"] = metric_list(self.metric_spec())
        cfg["process_results"] = self.process_results
        super().__init__(config=cfg)

    # ---- metrics

    def metric_spec(self) -> dict[str, tuple[Any, bool]]:
        spec: dict[str, tuple[Any, bool]] = {
            "acc_filled": (mean_present, True),
            "acc_all": (mean_present, True),
            "n_filled": (sum_present, True),
            "n_excluded": (sum_present, False),
            "filled": (mean_present, True),
            "needle_rows_from_end": (median_present, True),
        }
        for length in self.lengths:
            spec[f"acc_filled_{length}"] = (mean_present, True)
            spec[f"acc_all_{length}"] = (mean_present, True)
            spec[f"n_filled_{length}"] = (sum_present, True)
            spec[f"n_excluded_{length}"] = (sum_present, False)
        return spec

    # ---- data and prompts

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.dataset = ruler_data.generate(self.base_task, dict(self.config.metadata or {}))

    def doc_to_text(self, doc: dict[str, Any], doc_to_text: Any = None) -> str:
        return prompts.ruler_prompt(doc, self.protocol)[0]

    def doc_to_prefix(self, doc: dict[str, Any]) -> str | None:
        return prompts.ruler_prompt(doc, self.protocol)[1]

    # ---- needle marks

    def mark_prompt(self, doc: dict[str, Any], prompt: Any) -> needles.NeedleMark:
        """Mark one sample's needles in its final prompt string and remember the result.

        lm-eval's chat API models (`local-chat-completions`) hand over the messages
        as JSON (`JsonChatStr`); the server renders them with the model's chat
        template, so the needles are marked in that rendering.
        """
        tokenizer = tokenizer_from(self.config.metadata)
        prompt = rendered_prompt(tokenizer, prompt)
        result = needles.mark(tokenizer, ruler_kind(self.base_task), prompt, doc, self.tail, self.base_task)
        if not result.spans:
            log.warning("%s: no needle found in sample %s; it counts as excluded", self.config.task, doc_key(doc))
        self._marks[doc_key(doc)] = result
        return result

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any):
        self.mark_prompt(doc, ctx)
        return super().construct_requests(doc, ctx, **kwargs)

    def _mark_of(self, doc: dict[str, Any]) -> needles.NeedleMark:
        key = doc_key(doc)
        if key not in self._marks:
            # requests loaded from lm-eval's request cache skip construct_requests
            for inst in self.instances or []:
                if doc_key(inst.doc) == key:
                    return self.mark_prompt(inst.doc, inst.arguments[0])
            raise KeyError(f"{self.config.task}: no request was built for sample {key}")
        return self._marks[key]

    # ---- scoring

    def process_results(self, doc: dict[str, Any], results: list[str]) -> dict[str, Any]:
        score = ruler_score(self.base_task, doc, results[0])
        m = self._mark_of(doc)
        filled = m.filled
        out: dict[str, Any] = {
            "acc_filled": score if filled else None,
            "acc_all": score,
            "n_filled": int(filled),
            "n_excluded": int(not filled),
            "filled": int(filled),
            "needle_rows_from_end": m.rows_from_end,
        }
        length = int(doc["max_length"])
        for L in self.lengths:
            same = L == length
            out[f"acc_filled_{L}"] = score if same and filled else None
            out[f"acc_all_{L}"] = score if same else None
            out[f"n_filled_{L}"] = int(filled) if same else None
            out[f"n_excluded_{L}"] = int(not filled) if same else None
        return out
