"""Paired statistics for approximate-prefill studies (installed as `rf_eval.stats`).

The names below are imported lazily, so `import rf_eval.stats` stays cheap:

- `paired_bootstrap`, `paired_bootstraps` (bootstrap), `binomial_floor`,
  `noninferiority` (margin), `sign_test`, `mcnemar_exact`
  (discordance), `perplexity_gap` (perplexity), `location` (tails),
  `control_margin` (controls): the statistics of paper section 3.4;
- `load_runs` (runs), `pair_arms` (pairing), `study_summary` with its
  `SummaryOptions` (summary): lm-eval output folders in, report data out;
- `append_entry`, `verify_ledger` (ledger): the run ledger of paper section 9.

No exported name is also the name of a submodule: importing a submodule sets
the package attribute of its name, so a function named like its module would
be the function or the module depending on what was imported first
(tests/stats/test_exports.py checks this).
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "paired_bootstrap": "bootstrap", "paired_bootstraps": "bootstrap", "PairedBootstrap": "bootstrap",
    "binomial_floor": "margin", "noninferiority": "margin", "NonInferiority": "margin",
    "sign_test": "discordance", "mcnemar_exact": "discordance", "perplexity_gap": "perplexity",
    "location": "tails", "control_margin": "controls", "load_runs": "runs", "pair_arms": "pairing",
    "study_summary": "summary", "SummaryOptions": "summary", "append_entry": "ledger", "verify_ledger": "ledger",
}  # fmt: skip
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"rf_eval.stats.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rf_eval.stats' has no attribute {name!r}")
