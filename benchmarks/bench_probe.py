"""Where the probe arm's prefill time goes, phase by phase, against what the MAC model charges each phase.

The probe (paper section 2.4) runs at ~0.77 of its MAC-model ceiling on CPU where ridge runs at ~0.95.
This benchmark accounts for the gap on bench_engine's model (random Llama, hidden 512, 16 layers, S = L/2,
tail --tail, ridge-shaped maps). Per prompt length it times, round-robin, the probe arm and ridge with the
probe's own exact rows given directly (no choosing: `fixed rows`), and splits the probe's time into

  lower   layers 0..S-1 over every row;
  base    the base rules that count its rows (protected tokens, digits, lower-layer attention);
  sweep   the probe sweep: every prefix row's late K/V from its predicted input, the probe rows' late layers;
  late    the late layers of the exact rows (the filled rows' K/V come from the sweep);

each beside its MAC share converted to seconds at the plain forward's measured MAC rate. "excess" is
measured minus charged, as a share of the probe's total: the gap the ceiling does not see. The MAC model
charges no base rules; lexical-net rows and rank sorting are inside "base" and "sweep" as measured.

    python benchmarks/bench_probe.py [--n 4096 8192 16384] [--tail 1024] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from functools import partial

import torch
from bench_engine import PROBE_ROWS, make_model, random_maps, timed_round_robin
from bench_rows import make_prompt

import rf_eval.selectors.probe as probe_module
from rf_eval.cost.mac_model import layer_costs, prefill_macs, speedup_ceiling
from rf_eval.engine import Plan, PredictedInput, plain_prefill, prefill
from rf_eval.fills import fill_named
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.testing import build_tokenizer

PHASES = ("lower", "base", "sweep", "late")


def charged_macs(config, n: int, split: int, tail: int, exact_rows: int, probe_rows: int) -> dict[str, int]:
    """MACs of each probe phase under the cost model (`rf_eval.cost.mac_model`, full causal attention)."""
    costs = layer_costs(config)
    prefix, head = n - tail, config.hidden_size * config.vocab_size
    lower = sum(n * (c.write + c.rest) + c.attn_per_key * n * (n + 1) // 2 for c in costs[:split])
    late_costs = costs[split:]
    ridge = fill_named("ridge")
    filled_row = {c.index: ridge.filled_row_macs(config, c, mapped=c.index > split) for c in late_costs}  # map + K/V
    sweep = sum(prefix * filled_row[c.index] + probe_rows * (c.write + c.rest)
                + c.attn_per_key * (probe_rows * prefix + probe_rows * (probe_rows + 1) // 2) for c in late_costs)
    late = prefill_macs(config, n, split=split, tail=tail, exact_rows=exact_rows, fill="ridge") - lower - head
    late -= sum((prefix - exact_rows) * filled_row[c.index] for c in late_costs)  # the filled rows': in the sweep
    return {"lower": lower, "base": 0, "sweep": sweep, "late": late + head}


class PhaseClock:
    """Seconds per probe phase over the runs it sees (the base rules and the sweep timed where they run)."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.pending: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.pending[name] = self.pending.get(name, 0.0) + time.perf_counter() - start
        return timed

    def close_run(self, result) -> None:
        t = result.timings
        self.seconds["lower"].append(t["lower"])
        self.seconds["base"].append(self.pending.get("base", 0.0))
        self.seconds["sweep"].append(self.pending.get("sweep", 0.0))
        self.seconds["late"].append(t["late"] + t["select"] - self.pending.get("base", 0.0)
                                    - self.pending.get("sweep", 0.0))  # the select phase's remainder: ranking
        self.pending = {}


def account(model, tokenizer, n: int, split: int, tail: int, repeats: int, device: str, dtype) -> dict:
    ids = make_prompt(tokenizer, n).to(device)
    fill = random_maps(model, split).fill_fn(dtype, device)
    plan = Plan(split, tail, "ridge")
    unigram = torch.randint(0, 1000, (len(tokenizer),), generator=torch.Generator().manual_seed(2))
    probe_arm = partial(prefill_arm, model, tokenizer,
                        RidgeFillArm(fill="ridge", split=split, tail=tail, selector="probe"),
                        resources={"unigram": unigram})
    clock = PhaseClock()
    selector = probe_arm.args[2].selector_obj  # the arm's own selector object
    selector.base_rows = clock.wrap("base", selector.base_rows)
    probe_module.probe_sweep = clock.wrap("sweep", probe_module.probe_sweep)
    with torch.no_grad():
        chosen = probe_arm(ids, plan, PredictedInput(fill)).exact_rows
    rows = chosen[chosen < n - tail]
    clock.pending = {}

    def probe():
        result = probe_arm(ids, plan, PredictedInput(fill))
        clock.close_run(result)

    median = timed_round_robin({
        "plain": lambda: plain_prefill(model, ids),
        "exact": lambda: prefill(model, ids, Plan(split, tail, "exact")),
        "probe": probe,
        "fixed rows": lambda: prefill(model, ids, plan, fill=fill, select=lambda ctx: rows),
    }, repeats, device)
    config = model.config
    e = int(rows.numel())
    charged = charged_macs(config, n, split, tail, e, PROBE_ROWS)
    seconds_per_mac = median["plain"] / prefill_macs(config, n)
    measured = {phase: statistics.median(clock.seconds[phase][1:] or clock.seconds[phase]) for phase in PHASES}
    total = sum(measured.values())
    phases = {phase: {"seconds": measured[phase], "charged_seconds": charged[phase] * seconds_per_mac,
                      "excess_share": (measured[phase] - charged[phase] * seconds_per_mac) / total}
              for phase in PHASES}
    ceiling = speedup_ceiling(config, n, split=split, tail=tail, fill="ridge", exact_rows=e, probe_rows=PROBE_ROWS)
    fixed_ceiling = speedup_ceiling(config, n, split=split, tail=tail, fill="ridge", exact_rows=e)
    return {"N": n, "exact_rows": e, "seconds": median, "phases": phases,
            "probe_of_ceiling": median["exact"] / median["probe"] / ceiling,
            "fixed_rows_of_ceiling": median["exact"] / median["fixed rows"] / fixed_ceiling,
            "exact_of_charged": median["exact"] / (prefill_macs(config, n) * seconds_per_mac)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--tail", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    tokenizer = build_tokenizer()
    model = make_model(a.layers, a.hidden, a.device, dtype, len(tokenizer))
    blocks = []
    for n in a.n:
        block = account(model, tokenizer, n, a.layers // 2, a.tail, a.repeats, a.device, dtype)
        blocks.append(block)
        print(f"N={n}: probe {block['probe_of_ceiling']:.3f} of its ceiling (with its sweep), the same "
              f"{block['exact_rows']} rows given directly {block['fixed_rows_of_ceiling']:.3f}", flush=True)
        print(f"  {'phase':6s} {'measured s':>10s} {'charged s':>10s} {'excess / probe total':>21s}")
        for phase, row in block["phases"].items():
            print(f"  {phase:6s} {row['seconds']:10.3f} {row['charged_seconds']:10.3f} {row['excess_share']:21.1%}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"tail": a.tail, "lengths": blocks}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
