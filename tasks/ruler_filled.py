"""`<ruler task>_filled`: RULER scored on the filled region (paper section 3.1, appendix C); `ruler_filled`:
the four needle tasks of the reference study pooled into one task (`RulerFilledPool`).

The samples are lm-eval's own (`ruler_data.generate`); the official scorer is
lm-eval's (`string_match_all`, `string_match_part` for QA). Each sample's
needles are located in its final prompt string with the model's tokenizer
(`needles.mark`) when its request is built, so the chat template and the
prompt protocol are included; with the tail length this fixes the
filled-region subset, shared by every arm and split. The tail is the run's:
metadata `tail` or model_args `tail` (lm-eval merges model_args into task
metadata), else the running rf-eval arm's own tail, else the shared default
(`rf_eval.engine.plan.DEFAULT_TAIL`, 4,096, the paper's); a `--metadata`
tail that contradicts the arm's is refused (`common.filled_tail`).

Needles (metadata `needles`, niah tasks): `all` (default, the paper's
condition, appendix D) counts a sample as filled only if every needle the
generator inserted lies in the prefix, the queried one and, in
niah_multikey_1, the three distractor keys' needles; `queried` looks at the
needles holding the answer only. In niah_multikey_2/3 the haystack itself is
made of needle sentences and the generator inserts one needle, the queried
one, so both settings mark the same span. The setting used is recorded in the
task's metadata (`needles`, with `tail`) in the results.

With no `pretrained` / `tokenizer` in the run (`lm_eval --model ridgefill
--tasks ruler_filled`), samples are sized and marked with the tokenizer of the
adapter's model (the embedded demo model), and the demo's lengths are the
default `max_seq_lengths` (`common.with_run_defaults`).

Sample order (`balanced_order`): lm-eval's generators emit a task's samples
length by length (500 of the first length, then 500 of the next), so lm-eval's
`--limit N` would run the first length only. The paper runs the same number of
samples per task and length (25, section 3.2) and resamples within task
strata (section 3.4), so the docs are reordered, one sample of each (task,
length) cell in turn: `--limit N` over k lengths (and, pooled, t tasks) takes
N / (k t) of each cell, and a `--samples` id is a position in that order. A
sample's identity is its doc's `ruler_task`, `max_length` (the RULER length
setting) and `index` (the generator's index within that task and length), all
logged with the doc in `--log_samples`; the `doc_id` is its position in the
balanced order.

Excluded samples are not dropped: every sample is run and logged, and carries
a `filled` flag (0/1) and `needle_rows_from_end` (prompt rows after its last
needle token; filled iff >= tail, so the subset for any other tail can be
recomputed from a samples file). Filled-region metrics are
`None` on excluded samples and are averaged over the filled ones only.

Metrics: `acc_filled` (filled-region accuracy), `acc_all` (the official
score on every sample), `n_filled` / `n_excluded` (counts), `filled` (share),
`cap_hits` (answers that hit `max_gen_toks`, counted over every sample by
`common.cap_hit`; 0/1 per sample, section 4.5), and per length L: `acc_filled_L`, `acc_all_L`, `n_filled_L`, `n_excluded_L`.
Scores are RULER's, in [0, 1].

Options (`--metadata` JSON; `--model_args` values are seen too): `tail`,
`needles` (all | queried), `protocol` (official | serving | serving_vllm, appendix E), `max_seq_lengths`,
`essay_haystack`, `squad_json`, `hotpotqa_json`, `seed`, `numpy_seed`, `subset_tail` (a subset tail set apart
from the arm's on purpose: the longer-tail controls).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from lm_eval.api.task import ConfigurableTask

from rf_eval.engine.plan import DEFAULT_TAIL
from rf_eval.tasks import needles, prompts, ruler_data
from rf_eval.tasks.common import (
    CAP_METRICS,
    COST_METRICS,
    cap_hit,
    cost_fields,
    filled_tail,
    max_gen_toks,
    mean_present,
    median_present,
    metric_list,
    option,
    run_model,
    strip_task_keys,
    sum_present,
    tokenizer_from,
    with_run_defaults,
)
from rf_eval.tasks.positions import as_lengths, refuse_beyond, refuse_unfilled

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TAIL", "NEEDLE_MODES", "RulerFilledPool", "RulerFilledTask"]
NEEDLE_MODES = ("all", "queried")


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


def balanced_order(tasks: list[str], lengths: list[int]) -> list[int]:
    """Row positions reordered so that every prefix is as balanced as it can be across (task, length).

    `tasks[i]`, `lengths[i]` are row i's RULER task and length; within a (task, length) cell rows keep
    the generator's order. Each turn takes the next row of every cell; a turn visits the cells so
    that consecutive rows change task and also change length: with t tasks and k lengths, cell c
    of a turn is task c mod t and length (c + c // lcm(t, k)) mod k (the shift once per lcm(t, k)
    cells reaches the pairs plain c mod t, c mod k misses when t and k share a factor), so the
    first max(t, k) rows of a turn already hold every task and every length. `--limit N` with N a
    multiple of t * k then runs N / (t k) samples of each cell, the paper's design of equal samples
    per task and length (section 3.2). A cell the generator left short (it skips samples it cannot
    build) just ends early.
    """
    task_names = list(dict.fromkeys(tasks))
    length_names = list(dict.fromkeys(int(x) for x in lengths))
    cells: dict[tuple[str, int], list[int]] = {}
    for i, (task, n) in enumerate(zip(tasks, lengths, strict=True)):
        cells.setdefault((task, int(n)), []).append(i)
    t, k = len(task_names), len(length_names)
    period = math.lcm(t, k)
    turn = [(task_names[c % t], length_names[(c + c // period) % k]) for c in range(t * k)]
    rounds = max((len(rows) for rows in cells.values()), default=0)
    return [cells[cell][r] for r in range(rounds) for cell in turn if r < len(cells.get(cell, ()))]


def balanced_dataset(parts: dict[str, Any]):
    """The `test` split of each RULER task's samples ({task: dataset}) as one `datasets.Dataset`
    in `balanced_order`, each row tagged with its `ruler_task` (so a samples file can be stratified
    by task and `max_length`)."""
    import datasets

    tagged = [ds.add_column("ruler_task", [task] * len(ds)) for task, ds in parts.items()]
    whole = tagged[0] if len(tagged) == 1 else datasets.concatenate_datasets(tagged)
    return whole.select(balanced_order(list(whole["ruler_task"]), list(whole["max_length"])))


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
        meta = with_run_defaults(cfg.get("metadata"))
        from lm_eval.tasks.ruler.common_utils import DEFAULT_SEQ_LENGTHS

        self.tail = filled_tail(meta)
        meta["tail"] = self.tail
        self.needle_set = self.needle_mode(option(meta, "needles", "all", str))
        if ruler_kind(self.base_task) == "niah":
            meta["needles"] = self.needle_set
        cfg["metadata"] = meta
        self.protocol = prompts.check_protocol(option(meta, "protocol", "official", str))
        self.lengths = as_lengths(option(meta, "max_seq_lengths", list(DEFAULT_SEQ_LENGTHS), lambda x: x))
        run = run_model() or {}
        refuse_beyond(str(cfg.get("task")), self.lengths, run.get("max_length"), "the running model's max_length")
        if run and meta.get("subset_tail") in (None, ""):  # scored by a run: one with nothing to score is refused
            refuse_unfilled(str(cfg.get("task")), self.lengths, self.tail, "the running arm's")
        self._marks: dict[tuple[int, int], needles.NeedleMark] = {}
        self._requests: dict[tuple, Any] = {}  # each sample's request prompt: its cost record's key
        cfg["metric_list"] = metric_list(self.metric_spec())
        cfg["process_results"] = self.process_results
        super().__init__(config=cfg)

    def needle_mode(self, value: str) -> str:
        if value not in NEEDLE_MODES:
            raise ValueError(f"needles={value!r} is not valid; valid: {', '.join(NEEDLE_MODES)}")
        return value

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
        return {**spec, **CAP_METRICS, **COST_METRICS}

    def cap_hit(self, response: Any) -> int | None:
        """Whether `response` hit the task's length cap (`common.cap_hit`, the run's tokenizer)."""
        return cap_hit(tokenizer_from(self.config.metadata), response, max_gen_toks(self.config.generation_kwargs))

    # ---- data and prompts

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """lm-eval's samples, reordered so that `--limit` takes the same count of each length (`balanced_order`)."""
        test = ruler_data.generate(self.base_task, dict(self.config.metadata or {}))["test"]
        self.dataset = {"test": balanced_dataset({self.base_task: test})}

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
        original, prompt = prompt, rendered_prompt(tokenizer, prompt)
        task = self.task_of(doc)
        which = "queried" if task in ruler_data.NEEDLE_HAYSTACK else self.needle_set
        result = needles.mark(tokenizer, ruler_kind(task), prompt, doc, self.tail, task, which)
        if not result.spans:
            log.warning("%s: no needle found in sample %s; it counts as excluded", self.config.task, self.key_of(doc))
        self._marks[self.key_of(doc)] = result
        self._requests[self.key_of(doc)] = original
        return result

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any):
        self.mark_prompt(doc, ctx)
        return super().construct_requests(doc, ctx, **kwargs)

    def task_of(self, doc: dict[str, Any]) -> str:
        """The RULER task a sample comes from (one task here; several in the pooled `ruler_filled`)."""
        return self.base_task

    def key_of(self, doc: dict[str, Any]) -> tuple:
        return doc_key(doc)

    def _mark_of(self, doc: dict[str, Any]) -> needles.NeedleMark:
        key = self.key_of(doc)
        if key not in self._marks:
            # requests loaded from lm-eval's request cache skip construct_requests
            for inst in self.instances or []:
                if self.key_of(inst.doc) == key:
                    return self.mark_prompt(inst.doc, inst.arguments[0])
            raise KeyError(f"{self.config.task}: no request was built for sample {key}")
        return self._marks[key]

    # ---- scoring

    def process_results(self, doc: dict[str, Any], results: list[str]) -> dict[str, Any]:
        score = ruler_score(self.task_of(doc), doc, results[0])
        m = self._mark_of(doc)
        filled = m.filled
        out: dict[str, Any] = {
            "acc_filled": score if filled else None,
            "acc_all": score,
            "n_filled": int(filled),
            "n_excluded": int(not filled),
            "filled": int(filled),
            "needle_rows_from_end": m.rows_from_end,
            "cap_hits": self.cap_hit(results[0]),
            **cost_fields(self._requests.get(self.key_of(doc))),
        }
        length = int(doc["max_length"])
        for L in self.lengths:
            same = L == length
            out[f"acc_filled_{L}"] = score if same and filled else None
            out[f"acc_all_{L}"] = score if same else None
            out[f"n_filled_{L}"] = int(filled) if same else None
            out[f"n_excluded_{L}"] = int(not filled) if same else None
        return out


class RulerFilledPool(RulerFilledTask):
    """`ruler_filled`: several RULER tasks (config `ruler_tasks`) as one lm-eval task, so that lm-eval's
    printed `acc_filled` is the paper's figure, the mean over every filled sample of every task (pooled,
    section 3.2). A group cannot print it: lm-eval weighs each member task by all its samples
    (`sample_len`), not by its filled ones. Per-task figures are metrics of their own (`acc_filled_<task>`,
    `acc_all_<task>`, `n_filled_<task>`), and each sample records its `ruler_task`. The tasks' samples
    are interleaved with the lengths (one of each task and length in turn, `balanced_order`), so
    `--limit N` takes N / (tasks x lengths) of each task and length."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None) -> None:
        cfg, extra = strip_task_keys(config, "ruler_tasks")
        self.base_tasks = [str(t) for t in extra.get("ruler_tasks") or ()]
        unknown = [t for t in self.base_tasks if t not in ruler_data.RULER_TASKS]
        if not self.base_tasks or unknown:
            raise ValueError(f"{cfg.get('task')}: ruler_tasks must name RULER tasks; unknown: {unknown or '(none given)'}; "
                             f"valid: {', '.join(ruler_data.RULER_TASKS)}")
        kinds = {ruler_kind(t) for t in self.base_tasks}
        if len(kinds) > 1:  # one task has one generation setting
            raise ValueError(f"{cfg.get('task')}: ruler_tasks mixes kinds {sorted(kinds)}; pool tasks of one kind")
        super().__init__(data_dir, cache_dir, download_mode, {**cfg, "ruler_task": self.base_tasks[0]})

    def metric_spec(self) -> dict[str, tuple[Any, bool]]:
        spec = super().metric_spec()
        for task in self.base_tasks:
            spec[f"acc_filled_{task}"] = (mean_present, True)
            spec[f"acc_all_{task}"] = (mean_present, True)
            spec[f"n_filled_{task}"] = (sum_present, True)
        return spec

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Every task's samples, one of each (task, length) in turn (`balanced_order`)."""
        meta = dict(self.config.metadata or {})
        self.dataset = {"test": balanced_dataset({t: ruler_data.generate(t, meta)["test"] for t in self.base_tasks})}

    def task_of(self, doc: dict[str, Any]) -> str:
        return str(doc["ruler_task"])

    def key_of(self, doc: dict[str, Any]) -> tuple:
        return (self.task_of(doc), *doc_key(doc))

    def process_results(self, doc: dict[str, Any], results: list[str]) -> dict[str, Any]:
        out = super().process_results(doc, results)
        mine = self.task_of(doc)
        for task in self.base_tasks:
            same = task == mine
            out[f"acc_filled_{task}"] = out["acc_filled"] if same else None
            out[f"acc_all_{task}"] = out["acc_all"] if same else None
            out[f"n_filled_{task}"] = out["n_filled"] if same else None
        return out
