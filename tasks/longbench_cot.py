"""`longbench_v2_cot`: LongBench v2 under its official chain-of-thought protocol (paper section 4.6).

Per item, two generations (request type `two_pass_generate`, which
`request_types` gives every lm-eval model on top of its `generate_until`, so
`hf` runs it too):

1. the CoT prompt with the document, `cot_tokens` new tokens (default 1,024);
2. the extraction prompt with the first pass's reasoning in `$COT$` and without
   the document, `answer_tokens` new tokens (default 128).

Both sample at `temperature` 0.1 with a seed fixed per item and pass (from
metadata `seed` and the item id), so every arm draws the same random stream.
A pass-1 prompt longer than `max_prompt_tokens` (default 120,000) tokens is
cut in the middle: its first half and last half of that many tokens are kept.
The answer is read by the official rule (`extract_choice`); no match is wrong.

Prompts: the official prompt files `0shot_cot.txt` and `0shot_cot_ans.txt` are
read at run time from metadata `prompts_dir` (the `prompts/` folder of a
LongBench checkout) and their sha256 recorded in the task's metadata. Without
them the task uses prompts written for this project with the same placeholders
(`$DOC$`, `$Q$`, `$C_A$`..`$C_D$`, `$COT$`) and labels its results
"unofficial wording" (task alias and metadata `prompt_wording`).

Data: metadata `data`, a local copy of the dataset's JSON (a list of items
with `_id`, `domain`, `sub_domain`, `difficulty`, `length`, `question`,
`choice_A`..`choice_D`, `answer`, `context`), or the same items as .jsonl;
else `longbench_v2.json` in the data folder that `rf-eval fetch-data --tasks
longbench_v2_cot` writes (metadata `data_dir` or RF_EVAL_DATA; `rf_eval.tasks.data`).

Metrics: `acc` overall, by difficulty (`acc_easy`, `acc_hard`), by length
(`acc_short`, `acc_medium`, `acc_long`) and by domain (`acc_domain_<name>`);
`answered` (an answer could be extracted); `cap_hits`, the items whose first
pass hit its `cot_tokens` cap (`common.cap_hit`; section 4.6: "The first pass
hit its 1,024-token cap on 301 items").
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from lm_eval.api.task import ConfigurableTask

from rf_eval.errors import UserError
from rf_eval.files.data_files import check_items, iter_jsonl, read_json, read_text
from rf_eval.tasks import request_types
from rf_eval.tasks.common import (
    CAP_METRICS,
    COST_METRICS,
    cap_hit,
    cost_fields,
    mean_present,
    metric_list,
    option,
    strip_task_keys,
    tokenizer_from,
)
from rf_eval.tasks.data import local_copy, missing_message, why_missing

DATA_OPTION = "data"
PROMPTS_OPTION = "prompts_dir"
OFFICIAL_FILES = ("0shot_cot.txt", "0shot_cot_ans.txt")
UNOFFICIAL = "unofficial wording"
FIELDS = ("_id", "domain", "difficulty", "length", "question", "choice_A", "choice_B", "choice_C",
          "choice_D", "answer", "context")
#: the values the metrics split by (a value outside them would drop the item from its stratum unseen)
VALUES = {"answer": ("A", "B", "C", "D"), "difficulty": ("easy", "hard"), "length": ("short", "medium", "long")}
#: what each official prompt file must hold: pass 1 the document and question, pass 2 the reasoning
PLACEHOLDERS = {"0shot_cot.txt": ("$DOC$", "$Q$"), "0shot_cot_ans.txt": ("$Q$", "$COT$")}

# Written for rf-eval; the official wording is read from the user's own copy of the prompt files.
PROJECT_COT = """Read the document below and answer the multiple-choice question that follows it.

<document>
$DOC$
</document>

Question: $Q$
(A) $C_A$
(B) $C_B$
(C) $C_C$
(D) $C_D$

Work through the question step by step before you settle on a choice."""

PROJECT_COT_ANS = """A multiple-choice question was asked about a long document, which is left out here.

Question: $Q$
(A) $C_A$
(B) $C_B$
(C) $C_C$
(D) $C_D$

Reasoning written about the question:
$COT$

Based on that reasoning, give the final choice as "The correct answer is (X)", with X one of A, B, C or D."""

DOC_LEFT_OUT = "(The document is left out here.)"


class LongBenchDataError(UserError, RuntimeError):
    """Missing dataset file or prompt files."""


def load_items(path: str | Path | None) -> list[dict[str, Any]]:
    """LongBench v2 items from a local JSON list or .jsonl file, each checked: every field of FIELDS a
    string, `answer`, `difficulty` and `length` one of the dataset's values (a bad item is named by its
    place in the file and the field)."""
    if not path:
        raise LongBenchDataError(missing_message("longbench_v2_cot", ["longbench_v2"], why_missing(["longbench_v2"])))
    p = Path(path).expanduser()
    if not p.is_file():
        raise LongBenchDataError(f"{DATA_OPTION}: {p} does not exist")
    fields = {name: str for name in FIELDS}
    hint = f"each LongBench v2 item needs the string fields {', '.join(FIELDS)}"
    if p.suffix == ".jsonl":
        places = [(f"{p}:{n}", item) for n, item in iter_jsonl(p, fields, DATA_OPTION, hint)]
    else:
        items = check_items(read_json(p, DATA_OPTION), fields, p, hint)
        places = [(f"{p}: item {i}", item) for i, item in enumerate(items)]
    for where, item in places:
        for name, allowed in VALUES.items():
            if item[name] not in allowed:
                raise LongBenchDataError(f'{where}: "{name}" is {item[name]!r}; LongBench v2 uses '
                                         f"{', '.join(map(repr, allowed))}")
    return [item for _, item in places]


def load_templates(prompts_dir: str | Path | None) -> tuple[str, str, dict[str, Any]]:
    """(pass-1 template, pass-2 template, provenance) from the official files or the project's own. An
    official file must hold the placeholders the protocol fills (`PLACEHOLDERS`): one without them would
    leave out the document or the first pass's reasoning without a word."""
    if not prompts_dir:
        return PROJECT_COT, PROJECT_COT_ANS, {"prompt_wording": UNOFFICIAL, "prompt_sha256": {}}
    folder = Path(prompts_dir).expanduser()
    if not folder.is_dir():
        raise LongBenchDataError(f"{PROMPTS_OPTION}: folder {folder} does not exist (the LongBench `prompts/` folder)")
    texts, sums = [], {}
    for name in OFFICIAL_FILES:
        f = folder / name
        if not f.is_file():
            raise LongBenchDataError(f"{PROMPTS_OPTION}: {f} does not exist (the LongBench `prompts/` folder)")
        text = read_text(f, PROMPTS_OPTION)
        lacking = [mark for mark in PLACEHOLDERS[name] if mark not in text]
        if lacking:
            raise LongBenchDataError(f"{PROMPTS_OPTION}: {f} has no {' or '.join(lacking)} placeholder; give the "
                                     "`prompts/` folder of a LongBench checkout")
        sums[name] = hashlib.sha256(text.encode("utf-8")).hexdigest()  # the file's bytes: UTF-8 round-trips
        texts.append(text)
    return texts[0], texts[1], {"prompt_wording": "official", "prompt_sha256": sums}


def fill_template(template: str, item: dict[str, Any], document: str | None, cot: str | None = None) -> str:
    """Placeholders replaced in the official order: $DOC$, $Q$, $C_A$..$C_D$, then $COT$."""
    text = template.replace("$DOC$", (document if document is not None else DOC_LEFT_OUT).strip())
    text = text.replace("$Q$", item["question"].strip())
    for letter in "ABCD":
        text = text.replace(f"$C_{letter}$", item[f"choice_{letter}"].strip())
    if cot is not None:
        text = text.replace("$COT$", cot)
    return text


def middle_cut(tokenizer: Any, text: str, max_tokens: int) -> str:
    """The official truncation: over `max_tokens` tokens, keep the first max//2 and the last
    max - max//2 tokens and decode them (special tokens skipped)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    head = max_tokens // 2
    kept = ids[:head] + ids[len(ids) - (max_tokens - head) :]
    return tokenizer.decode(kept, skip_special_tokens=True)


def extract_choice(response: str) -> str | None:
    """The official answer rule: drop `*`, then "The correct answer is (X)", else "... is X"."""
    text = response.replace("*", "")
    for pattern in (r"The correct answer is \(([A-D])\)", r"The correct answer is ([A-D])"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return None


def item_seed(seed: int, item_id: str, pass_no: int) -> int:
    digest = hashlib.sha256(f"{seed}:{item_id}:{pass_no}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


request_types.install()


class LongBenchCoTTask(ConfigurableTask):
    """LongBench v2, official CoT protocol, results by domain, difficulty and length."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None) -> None:
        cfg, _ = strip_task_keys(config)
        meta = dict(cfg.get("metadata") or {})
        self.max_prompt_tokens = option(meta, "max_prompt_tokens", 120_000, int)
        self.cot_tokens = option(meta, "cot_tokens", 1024, int)
        self.answer_tokens = option(meta, "answer_tokens", 128, int)
        self.temperature = option(meta, "temperature", 0.1, float)
        self.seed = option(meta, "seed", 0, int)
        self.template_cot, self.template_ans, provenance = load_templates(meta.get(PROMPTS_OPTION))
        cfg["metadata"] = {**meta, **provenance}
        if provenance["prompt_wording"] == UNOFFICIAL:
            cfg["task_alias"] = f"{cfg['task']} ({UNOFFICIAL})"
        self.items = load_items(local_copy("longbench_v2", meta))  # `data`, else the data folder's copy
        self.domains = sorted({item["domain"] for item in self.items})
        self._contexts: dict[str, Any] = {}  # each item's first-pass prompt: its cost record's key
        cfg["metric_list"] = metric_list(self.metric_spec())
        cfg["process_results"] = self.process_results
        super().__init__(config=cfg)

    def metric_spec(self) -> dict[str, tuple[Any, bool]]:
        names = ["acc", "answered", "acc_easy", "acc_hard", "acc_short", "acc_medium", "acc_long"]
        names += [f"acc_domain_{slug(d)}" for d in self.domains]
        return {**{n: (mean_present, True) for n in names}, **CAP_METRICS, **COST_METRICS}

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        import datasets

        self.dataset = {"test": datasets.Dataset.from_list(self.items)}

    def doc_to_text(self, doc: dict[str, Any], doc_to_text: Any = None) -> str:
        prompt = fill_template(self.template_cot, doc, doc["context"])
        return middle_cut(tokenizer_from(self.config.metadata), prompt, self.max_prompt_tokens)

    def doc_to_target(self, doc: dict[str, Any], doc_to_target: Any = None) -> str:
        return doc["answer"]

    def gen_kwargs(self, max_gen_toks: int) -> dict[str, Any]:
        sample = self.temperature > 0
        return {"until": [], "max_gen_toks": max_gen_toks, "do_sample": sample, "temperature": self.temperature}

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any):
        from lm_eval.api.instance import Instance

        kwargs.pop("chat_template", None)
        chat = bool(kwargs.pop("apply_chat_template", False))
        template2 = fill_template(self.template_ans, doc, document=None)
        opts = {"chat": chat, "seeds": [item_seed(self.seed, doc["_id"], 1), item_seed(self.seed, doc["_id"], 2)]}
        args = (ctx, self.gen_kwargs(self.cot_tokens), template2, self.gen_kwargs(self.answer_tokens), opts)
        self._contexts[doc["_id"]] = ctx
        return Instance(request_type="two_pass_generate", doc=doc, arguments=args, idx=0, **kwargs)

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        pred = extract_choice(results[0]["response"])
        correct = float(pred == doc["answer"])
        out: dict[str, Any] = {"acc": correct, "answered": float(pred is not None),
                               "cap_hits": cap_hit(tokenizer_from(self.config.metadata), results[0]["cot"],
                                                   self.cot_tokens)}
        for level in ("easy", "hard"):
            out[f"acc_{level}"] = correct if doc["difficulty"] == level else None
        for level in ("short", "medium", "long"):
            out[f"acc_{level}"] = correct if doc["length"] == level else None
        for domain in self.domains:
            out[f"acc_domain_{slug(domain)}"] = correct if doc["domain"] == domain else None
        # the first pass's prompt: the document's prefill (the second pass's prompt is short)
        return {**out, **cost_fields(self._contexts.get(doc["_id"]))}
