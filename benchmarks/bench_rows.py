"""Time cost of exact prefix rows and of the two-sweep probe (paper appendix H, section 2.4).

A random Llama-style model (16 layers, hidden 512) on CPU, one prompt of N
tokens, split 6 (3/8 depth), a 1/8-of-N tail, a random ridge-shaped map
(d x d per filled layer, so the maps' cost is charged). It measures

- tau_exact, the plain model's prefill, and tau(E) for E scattered exact
  prefix rows (seeded random rows, E in --counts); a least-squares line
  tau(E) = tau0 + E * sigma gives tau0, sigma and the break-even count
  E* = (tau_exact - tau0) / sigma past which the arm is no faster than exact;
- the probe's share of a `probe+special` arm's prefill time (its selection
  time, base rules included, over the arm's total), and the probe sweep alone.

Times are this process's CPU seconds (all its threads; robust to other load
on a shared machine; on an idle machine wall time is about CPU / threads),
with wall seconds beside them; each is the minimum of --repeats runs after
one warm-up prefill of a short prompt.

    python benchmarks/bench_rows.py [--n 4096] [--repeats 1] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from functools import partial

import torch

from rf_eval.engine import Plan, PredictedInput, plain_prefill
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.selectors import Request, Selector, selector_from
from rf_eval.selectors.probe import probe_attention
from rf_eval.testing import build_tokenizer

WORDS = ("the of and to in is was for on that with as by at from his her it an were which are this be or had "
         "Vault Falcon Quill Zeta Kappa river mountain ledger cipher amber signal harbor lantern meadow").split()


def make_model(layers: int, hidden: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=int(hidden * 2.6875),
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         head_dim=64, max_position_embeddings=1 << 17, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval(), tokenizer


def make_prompt(tokenizer, n: int, seed: int = 0) -> torch.Tensor:
    rng = random.Random(seed)
    parts, length = [], 0
    while length < n + 16:
        word = rng.choice(WORDS) if rng.random() > 0.08 else str(rng.randint(0, 99999))
        parts.append(word + (". " if rng.random() < 0.1 else " "))
        length += len(parts[-1])
    return tokenizer("".join(parts), return_tensors="pt").input_ids[:, :n]


def random_map(model, split: int, seed: int = 1):
    """A ridge-shaped fill: x_S A_l^T + b_l with A_l near identity (the engine's cost, not a fit)."""
    d = model.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    weights = {i: (torch.eye(d) + 0.01 * torch.randn(d, d, generator=gen)).t().contiguous()
               for i in range(split, model.config.num_hidden_layers)}
    bias = torch.zeros(d)

    def fill(layer: int, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, x.reshape(-1, d), weights[layer]).view(*x.shape[:-1], d)

    return fill


def best_of(fn, repeats: int) -> tuple[float, float, object]:
    """(min CPU seconds, min wall seconds, last result) over `repeats` runs."""
    cpu, wall, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
    return cpu, wall, out


class Timed(Selector):
    """A selector wrapper that records its selection's CPU and wall time."""

    def __init__(self, inner: Selector):
        self.inner, self.cpu, self.wall = inner, 0.0, 0.0
        self.name = inner.name

    def captures(self, req):
        return self.inner.captures(req)

    def select(self, req):
        c0, w0 = time.process_time(), time.perf_counter()
        out = self.inner.select(req)
        self.cpu, self.wall = time.process_time() - c0, time.perf_counter() - w0
        return out


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, r^2)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys) or 1.0
    return a, b, 1 - ss_res / ss_tot


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--split", type=int, default=6)
    p.add_argument("--tail", type=int, default=None, help="default N/8")
    p.add_argument("--counts", type=int, nargs="+", default=[0, 512, 1024, 2048])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tail = args.tail or args.n // 8
    model, tok = make_model(args.layers, args.hidden)
    ids = make_prompt(tok, args.n)
    fill = random_map(model, args.split)
    plan = Plan(split=args.split, tail=tail, fill="ridge")
    unigram = torch.randint(0, 1000, (len(tok),), generator=torch.Generator().manual_seed(2))
    print(f"model: llama-style, {args.layers} layers, hidden {args.hidden}; N={args.n}, split {args.split}, "
          f"tail {tail}; {args.threads} threads; min of {args.repeats} runs")

    with torch.no_grad():
        plain_prefill(model, ids[:, :256])  # warm-up
        tau_exact, wall_exact, _ = best_of(lambda: plain_prefill(model, ids), args.repeats)
        print(f"tau_exact      {tau_exact:8.2f} s CPU  ({wall_exact:7.2f} s wall)")
        taus, walls = [], []
        for count in args.counts:
            arm = partial(prefill_arm, model, tok, RidgeFillArm(
                fill="ridge", split=args.split, tail=tail, selector=selector_from(f"random(count={count};seed=0)")))
            tau, wall, _ = best_of(lambda arm=arm: arm(ids, plan, PredictedInput(fill)), args.repeats)
            taus.append(tau)
            walls.append(wall)
            print(f"tau(E={count:5d})  {tau:8.2f} s CPU  ({wall:7.2f} s wall)")
        prefix = args.n - tail
        line = {}
        for kind, ys, ref in (("CPU", taus, tau_exact), ("wall", walls, wall_exact)):
            tau0, sigma, r2 = fit_line([float(c) for c in args.counts], ys)
            breakeven = (ref - tau0) / sigma if sigma > 0 else float("inf")
            line[kind] = {"tau0": tau0, "sigma": sigma, "r2": r2, "breakeven": breakeven}
            print(f"[{kind:4s}] tau0 = {tau0:.2f} s   sigma = {sigma * 1e3:.3f} ms/row   (r^2 = {r2:.4f})   "
                  f"break-even E* = (tau_exact - tau0)/sigma = {breakeven:.0f} rows ({breakeven / prefix:.1%} "
                  f"of the {prefix}-row prefix)")

        timed = Timed(selector_from("probe+special"))
        arm = partial(prefill_arm, model, tok, RidgeFillArm(fill="ridge", split=args.split, tail=tail, selector=timed),
                      resources={"unigram": unigram})
        tau_probe, wall_probe, result = best_of(lambda: arm(ids, plan, PredictedInput(fill)), args.repeats)
        exact_rows = result.exact_rows.numel() - tail
        req = Request(model, tok, ids, plan, fill).attach(_context(model, ids, plan, fill))
        sweep, sweep_wall, _ = best_of(lambda: probe_attention(req, 256), args.repeats)
        refill, _, _ = best_of(lambda: _filled_kv(req, args.n - 256), args.repeats)
        print(f"probe arm      {tau_probe:8.2f} s CPU  ({wall_probe:7.2f} s wall), {exact_rows} exact prefix rows "
              f"({exact_rows / prefix:.1%} of the prefix)")
        print(f"probe share    {timed.cpu / tau_probe:.1%} of the arm's prefill CPU time (selection {timed.cpu:.2f} s "
              f"incl. base rules; wall {timed.wall / wall_probe:.1%}); the probe sweep alone {sweep:.2f} s CPU = "
              f"{sweep / tau_probe:.1%}, of which {refill:.2f} s CPU ({refill / tau_probe:.1%}) recompute the filled "
              f"K/V that the second sweep computes again")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"prefix": args.n - tail, "tau_exact": tau_exact, "wall_exact": wall_exact, "counts": args.counts, "taus": taus,
                       "walls": walls, "line": line, "probe_total": tau_probe, "probe_select": timed.cpu,
                       "probe_sweep": sweep, "probe_refill": refill, "probe_exact_rows": exact_rows}, fh, indent=1)


def _filled_kv(req, rows: int) -> None:
    """The part of the probe sweep that recomputes the filled rows' K/V (maps, norm, projections, RoPE)."""
    ctx = req.ctx
    x = ctx.inputs.x_split[:, :rows]
    cos, sin = ctx.inputs.cos[:, :rows], ctx.inputs.sin[:, :rows]
    for index in range(req.plan.split, len(req.layers())):
        layer = req.layers()[index]
        x_hat = x if index == req.plan.split else req.fill(index, x)
        ctx.family.kv(layer.self_attn, layer.input_layernorm(x_hat), cos, sin)


def _context(model, ids, plan, fill):
    """The engine's context after the lower layers (what the probe reads), for timing the sweep alone."""
    from rf_eval.engine import PrefillContext, new_cache, run_lower_layers
    from rf_eval.families import family_for

    cache = new_cache(model)
    inputs, lower = run_lower_layers(model, ids, plan.split, cache)
    return PrefillContext(model, family_for(model.config), ids, plan, inputs, cache, lower)


if __name__ == "__main__":
    main()
