"""SQuAD v2's dev set, the documents and questions of RULER's `ruler_qa_squad`."""

from __future__ import annotations

from rf_eval.tasks.data_sources.ruler_qa import RulerQA


class Squad(RulerQA):
    name = "squad"
    what = "SQuAD v2's dev set (RULER QA)"
    path = "squad.json"
    option = "squad_json"
    host = "rajpurkar.github.io"
    ruler_tasks = frozenset({"ruler_qa_squad"})
    reader = "read_squad"
