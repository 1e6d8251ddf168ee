"""HotpotQA's dev set, the documents and questions of RULER's `ruler_qa_hotpot`."""

from __future__ import annotations

from rf_eval.tasks.data_sources.ruler_qa import RulerQA


class HotpotQA(RulerQA):
    name = "hotpotqa"
    what = "HotpotQA's dev set (RULER QA)"
    path = "hotpotqa.json"
    option = "hotpotqa_json"
    host = "huggingface.co"
    ruler_tasks = frozenset({"ruler_qa_hotpot"})
    reader = "read_hotpotqa"
