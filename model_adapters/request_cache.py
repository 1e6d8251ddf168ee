"""lm-eval's --use_cache database under a `PrefillLM`: one arm per database, custom request types cached too.

lm-eval's cache keys on request arguments only, so the adapter stores its arm (`ARM_KEY`: its settings, its
inputs' contents: weights, maps) in the database and refuses a database written by another arm; one written
by this arm on other weights or maps (changed in place) is emptied, so it reruns. The custom request types
(`token_logprobs`, `multiturn_generate`) go through the database as lm-eval's own types do (`_cached`), so a
killed run resumes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lm_eval.api.model import hash_args
from tqdm import tqdm

from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.model_adapters.config import ModelArgsError

log = logging.getLogger(__name__)

ARM_KEY = "rf-eval:arm"  # where the adapter records its arm in a --use_cache database
#: `hf` keys that never change a result (left out of the --use_cache arm fingerprint)
_NOT_RESULTS = {"device", "batch_size", "max_batch_size", "parallelize", "device_map", "max_memory_per_gpu",
                "max_cpu_memory", "offload_folder"}


#: what the arm's fingerprint records of its inputs' contents, beside its settings (name in a warning)
_CONTENTS = {"weights": "weights", "weights_sha256": "weights", "maps_sha256": "maps", "maps_metadata": "maps",
             "source_weights_sha256": "weights"}


def stale_contents(stored: str, fingerprint: dict[str, Any]) -> list[str] | None:
    """What changed between a cache's recorded arm and this arm when only their inputs' contents differ
    (weights or maps changed in place: the cache is stale), else None (another arm's settings)."""
    try:
        old = json.loads(stored)
    except json.JSONDecodeError:
        return None
    if not isinstance(old, dict):
        return None
    new = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))

    def settings(fp: dict[str, Any]) -> dict[str, Any]:
        arm = {k: v for k, v in (fp.get("arm") or {}).items() if k not in _CONTENTS}
        return {**{k: v for k, v in fp.items() if k not in _CONTENTS}, "arm": arm}

    if settings(old) != settings(new):
        return None
    pairs = [(old, new), (old.get("arm") or {}, new.get("arm") or {})]
    return sorted({_CONTENTS[k] for a, b in pairs for k in _CONTENTS if a.get(k) != b.get(k)})


class RequestCacheMixin:
    """The --use_cache side of `PrefillLM` (see the module docstring)."""

    def set_cache_hook(self, cache_hook) -> None:
        """Refuse a --use_cache database written by another arm (its keys are request args only); empty one
        written by this arm on other weights or maps (`stale_contents`: refit in place), so it reruns."""
        super().set_cache_hook(cache_hook)
        db = cache_hook.dbdict
        if db is None:
            return
        self.item_costs.db = db
        fingerprint = self.arm_fingerprint()
        mine = json.dumps(fingerprint, sort_keys=True, default=str)
        stored = db.get(ARM_KEY)
        if stored is None and len(db) > 0:
            raise ModelArgsError("the --use_cache database holds results of another model; give this arm its own path")
        if stored is not None and stored != mine:
            changed = stale_contents(stored, fingerprint)
            if changed is None:
                raise ModelArgsError(
                    f"the --use_cache database holds results of another arm ({stored}); this arm is {mine}. "
                    "Give each arm its own --use_cache path."
                )
            log.warning("the --use_cache database %s holds this arm's results from other %s: its %d entries are "
                        "dropped and recomputed", getattr(db, "filename", ""), " and ".join(changed), len(db) - 1)
            db.clear()
            stored = None
        if stored is None:
            db[ARM_KEY] = mine
            db.commit()

    def arm_fingerprint(self) -> dict[str, Any]:
        hf = {k: v for k, v in self._hf_args.items() if k not in _NOT_RESULTS}

        # the weights themselves, not only their path: weights changed in place get a fresh cache
        return {"adapter": type(self).__name__, "pretrained": self.settings.pretrained, "hf": hf,
                "arm": self.arm_info(), "max_length": self.max_length, "weights": weights_fingerprint(self.model)}

    def _cached(self, attr: str, requests: list, compute) -> list:
        """Results of a custom request type, through the --use_cache database like lm-eval's own types."""
        db = self.cache_hook.dbdict
        out = []
        for req in tqdm(requests, desc=f"Running {attr} requests", disable=self.rank != 0):
            sampled = _samples(req.args)
            key = hash_args(attr, req.args) if db is not None and not sampled else None
            if key is not None and key in db:
                out.append(db[key])
                continue
            res = compute(*req.args)
            self.cache_hook.add_partial(attr, req.args, res)
            out.append(res)
        return out


def _samples(args: tuple) -> bool:
    """True for requests that sample (lm-eval does not cache those)."""
    kwargs = args[-1] if args else None
    items = kwargs if isinstance(kwargs, list) else [kwargs]
    return any(isinstance(k, dict) and k.get("do_sample") for k in items)
