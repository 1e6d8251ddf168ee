"""`keytoken_nll` is read by its loss on the tokens that need the prefix (RidgeFill paper sections 3.1, 4.7).

ΔNLL (an arm's loss minus the reference's, nats per token) on key tokens and on novel tokens, the
perplexity gap exp(ΔNLL) - 1 on novel tokens (section 5.3), and the divergence KL(exact || arm) with its
median; the all-token loss beside them, secondary, never the headline.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from rf_eval.stats.measures.base import Measure, TaskMeasures
from rf_eval.tasks.token_masks import no_key_tokens


class KeyToken(TaskMeasures):
    name = "keytoken_nll"
    tasks = frozenset({"keytoken_nll"})
    title = "Loss on the tokens that need the prefix"
    measures = (
        Measure("key", "key-token ΔNLL", "nll_key", "delta"),
        Measure("novel", "novel-token ΔNLL", "nll_novel", "delta"),
        Measure("novel_gap", "perplexity gap, novel tokens", "nll_novel", "gap"),
        Measure("kl", "KL(exact‖arm)", "kl", "own"),
        Measure("all", "all-token ΔNLL (secondary)", "nll_all", "delta", secondary=True),
    )
    description = (
        "ΔNLL: the arm's loss minus the reference's, nats per token, per-document means; perplexity gap "
        "exp(ΔNLL) - 1 per document, domain-averaged; KL(exact‖arm): the arm's own mean per-token divergence "
        "from its same-run exact pass (mean, interval, median). All-token ΔNLL is secondary: most scored "
        "tokens do not depend on the prefix (paper sections 3.1, 4.7)."
    )
    missing = MappingProxyType({
        "nll_novel": "no document has novel tokens",
        "kl": "KL(exact‖arm) needs the arm's same-run exact pass (reference=exact in --model_args)",
        "nll_all": "no document was scored",
    })

    def missing_reason(self, metric: str, settings: Mapping[str, Any]) -> str:
        """`nll_key`: the run's `key_threshold` and `key_context` (keytoken_nll records them), as the task's
        own warning says (`token_masks.no_key_tokens`)."""
        if metric == "nll_key":
            return no_key_tokens(settings.get("key_threshold"), settings.get("key_context"))
        return super().missing_reason(metric, settings)
