"""FlexPrefill's and XAttention's chosen blocks (issue #56 items 2, 3) equal their authors' rules written out
here with loops on a small input, and each arm's MACs equal a count written here.

XAttention: mit-han-lab/x-attention `xattn/src/Xattention.py` (`xattn_estimate`, "inverse" mode) and
`xattn/src/utils.py` (`find_blocks_chunked`, causal). FlexPrefill: bytedance/FlexPrefill
`flex_prefill/ops/flex_prefill_attention.py` (`get_active_blocks`)."""

from __future__ import annotations

import math

import pytest
import torch

from rf_eval.cost.mac_model import prefill_macs
from rf_eval.sparse.flexprefill import FlexPrefill, active_blocks
from rf_eval.sparse.xattention import XAttention, block_scores, fewest_blocks

H, HKV, D, BLOCK = 4, 2, 8, 16


def qk(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, H, n, D, generator=g) * 2, torch.randn(1, HKV, n, D, generator=g) * 2


def xattention_rule(q, k, stride, threshold):
    """Per head: antidiagonal sums of each stride x stride tile (zero-padded rows), scaled 1/(sqrt(D) S), causal
    softmax over tiles, summed per block tile; per query block the sink and diagonal, then the others by
    descending score while the running sum is below threshold x the row's sum."""
    n = q.shape[2]
    blocks = -(-n // BLOCK)
    rows = blocks * BLOCK // stride
    valid = -(-n // stride)
    keep = torch.zeros(H, blocks, blocks, dtype=torch.bool)

    def tok(x, i):
        return x[i] if i < n else torch.zeros(D)

    for h in range(H):
        qh, kh = q[0, h], k[0, h // (H // HKV)]
        score = torch.zeros(blocks, blocks, dtype=torch.float64)
        for r in range(valid):
            logits = torch.tensor([sum(float(tok(qh, r * stride + stride - 1 - t) @ tok(kh, c * stride + t))
                                       for t in range(stride)) / (math.sqrt(D) * stride) for c in range(r + 1)])
            p = logits.softmax(0)
            for c in range(r + 1):
                score[r * stride // BLOCK, c * stride // BLOCK] += float(p[c])
        assert rows >= valid
        for i in range(blocks):
            kept = {0, i}
            total = sum(score[i, j] for j in range(blocks))
            running = sum(score[i, j] for j in kept)
            for j in sorted((j for j in range(i + 1) if j not in kept), key=lambda j: -score[i, j]):
                if running >= threshold * total:
                    break
                kept.add(j)
                running += score[i, j]
            for j in kept:
                keep[h, i, j] = True
    return keep


@pytest.mark.parametrize("n, stride, threshold", [(70, 4, 0.9), (96, 8, 0.6), (64, 16, 0.95)])
def test_xattention_keeps_its_authors_blocks(n, stride, threshold):
    q, k = qk(n, n)
    got = fewest_blocks(block_scores(q, k, stride, BLOCK), threshold)
    assert torch.equal(got, xattention_rule(q, k, stride, threshold))


def flexprefill_rule(q, k, gamma, tau, min_blocks, max_blocks):
    n = q.shape[2]
    blocks = -(-n // BLOCK)
    keep = torch.zeros(H, blocks, blocks, dtype=torch.bool)
    aware_heads = 0
    for h in range(H):
        qh, kh = q[0, h] / math.sqrt(D), k[0, h // (H // HKV)]
        last = range(n - BLOCK, n)
        probs = torch.zeros(BLOCK, n, dtype=torch.float64)
        for r, i in enumerate(last):
            probs[r, : i + 1] = torch.tensor([float(qh[i] @ kh[j]) for j in range(i + 1)]).softmax(0)
        vertical = probs.mean(0)
        slash = torch.zeros(n, dtype=torch.float64)  # index n - 1 - distance
        for r, i in enumerate(last):
            for j in range(i + 1):
                slash[n - 1 - (i - j)] += probs[r, j] / BLOCK

        def count(x):
            total, c = 0.0, 0
            for v in sorted(x.tolist(), reverse=True):
                total += v
                if total <= gamma:
                    c += 1
            return min(max((c + 1) // BLOCK + 1, min_blocks), max_blocks)

        nv, ns = count(vertical), count(slash)
        vb = [float(vertical[b * BLOCK:(b + 1) * BLOCK].sum()) for b in range(blocks)]
        sb = [float(slash[b * BLOCK:(b + 1) * BLOCK].sum()) for b in range(blocks)]
        mean_k = [kh[b * BLOCK:(b + 1) * BLOCK].mean(0) for b in range(blocks)]
        mean_last = qh[n - BLOCK:].mean(0)
        est = torch.tensor([float(mean_last @ mk) for mk in mean_k]).softmax(0).double()
        vt = torch.tensor(vb)
        m = (est + vt) / 2
        js = math.sqrt(0.5 * float((est * (est / m).log()).sum()) + 0.5 * float((vt * (vt / m).log()).sum()))
        aware = js < tau
        if aware:
            nv = ns = min_blocks
            aware_heads += 1
        vb[0], sb[-1] = math.inf, math.inf
        columns = sorted(range(blocks), key=lambda b: -vb[b])[:nv]
        distances = [blocks - 1 - b for b in sorted(range(blocks), key=lambda b: -sb[b])[:ns]]
        for i in range(blocks):
            for j in range(i + 1):
                keep[h, i, j] = j in columns or (i - j) in distances
        if aware:
            mean_q = [qh[b * BLOCK:(b + 1) * BLOCK].mean(0) for b in range(blocks)]
            table = []
            for i in range(blocks):
                row = torch.tensor([float(mean_q[i] @ mean_k[j]) if j <= i else -math.inf for j in range(blocks)])
                table += row.softmax(0).tolist()
            running = 0.0
            for index in sorted(range(len(table)), key=lambda x: -table[x]):
                running += table[index]
                if running <= gamma * blocks:
                    keep[h, index // blocks, index % blocks] = True
            keep[h, 0, 0] = True
    return keep, aware_heads


@pytest.mark.parametrize("n, gamma, tau, min_blocks, max_blocks", [
    (100, 0.9, 0.0, 1, 99),  # every head vertical-slash
    (100, 0.9, 1.0, 1, 99),  # every head query-aware
    (128, 0.5, 0.2, 2, 3),  # counts clamped by both budgets
])
def test_flexprefill_keeps_its_authors_blocks(n, gamma, tau, min_blocks, max_blocks):
    q, k = qk(n, 7)
    got, aware, _ = active_blocks(q, k, BLOCK, gamma, tau, min_blocks, max_blocks)
    want, want_aware = flexprefill_rule(q, k, gamma, tau, min_blocks, min(max_blocks, -(-n // BLOCK)))
    assert aware == want_aware
    assert torch.equal(got, want)


@pytest.mark.parametrize("method", ["xattention", "flexprefill"])
def test_each_adaptive_arm_costs_a_count_written_here(method, tiny, monkeypatch):
    """Exact's MACs less 2 x heads x head_dim per pair not computed in each layer, plus the estimation pass:
    XAttention's antidiagonal matmul (stride x D per causal pair of stride rows, per head); FlexPrefill's
    last-block scores (block x N x D per head), pooled scores (blocks x D per head) and each query-aware
    head's blocks x blocks x D."""
    import rf_eval.sparse.flexprefill as flexprefill
    import rf_eval.sparse.xattention as xattention

    model = tiny["llama"][0]
    cfg = model.config
    n, heads, stride = 200, cfg.num_attention_heads, 4
    dim = cfg.hidden_size // heads
    ids = torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(4))
    kept, aware = [], []
    if method == "xattention":
        arm = XAttention(model, None, block=BLOCK, stride=stride)
        choose = xattention.fewest_blocks
        monkeypatch.setattr(xattention, "fewest_blocks", lambda *a: kept.append(choose(*a)) or kept[-1])
    else:
        arm = FlexPrefill(model, None, block=BLOCK, min_budget=16, tau=0.13)  # tau splitting the heads of this input
        choose = flexprefill.active_blocks

        def spy(*a):
            keep, count, scores = choose(*a)
            kept.append(keep)
            aware.append(count)
            return keep, count, scores

        monkeypatch.setattr(flexprefill, "active_blocks", spy)
    result = arm.prefill(ids)
    assert len(kept) == cfg.num_hidden_layers
    blocks, rows = -(-n // BLOCK), -(-n // stride)
    skipped = 0.0
    for keep in kept:
        computed = [sum(1 for i in range(n) for j in range(i + 1)
                        if i // BLOCK == j // BLOCK or keep[h, i // BLOCK, j // BLOCK]) for h in range(heads)]
        skipped += n * (n + 1) / 2 - sum(computed) / heads
    if method == "xattention":
        estimate = cfg.num_hidden_layers * heads * rows * (rows + 1) // 2 * stride * dim
    else:
        estimate = cfg.num_hidden_layers * heads * (BLOCK * n + blocks) * dim + sum(aware) * blocks * blocks * dim
        assert 0 < sum(aware) < cfg.num_hidden_layers * heads  # both kinds of head ran
    cost = arm.prefill_cost(n, result)
    assert cost.prefill_macs == prefill_macs(cfg, n) - round(2 * heads * dim * skipped) + estimate
    assert cost.attention_density == pytest.approx(1 - skipped / cfg.num_hidden_layers / (n * (n + 1) / 2))


def test_a_budget_cuts_each_heads_blocks_lowest_score_first():
    """`within_pairs`, written out: per head the first key block and the diagonal, then the other kept blocks
    by descending score while the pairs taken stay within the cap."""
    from rf_eval.sparse.blocks import within_pairs

    n = 90
    blocks = -(-n // BLOCK)
    g = torch.Generator().manual_seed(5)
    keep = (torch.rand(H, blocks, blocks, generator=g) < 0.7).tril()
    scores = torch.rand(H, blocks, blocks, generator=g)

    def pairs(i, j):
        rows = [min(BLOCK, n - b * BLOCK) for b in range(blocks)]
        return rows[i] * (rows[i] + 1) // 2 if i == j else rows[i] * rows[j]

    cap = 0.5 * n * (n + 1) / 2
    got = within_pairs(keep, scores, n, BLOCK, cap)
    for h in range(H):
        taken = {(i, j) for i in range(blocks) for j in range(i + 1) if j == 0 or j == i}
        spent = sum(pairs(i, j) for i, j in taken)
        others = [(a, b) for a in range(blocks) for b in range(a + 1) if keep[h, a, b] and (a, b) not in taken]
        for a, b in sorted(others, key=lambda x: -float(scores[h, x[0], x[1]])):
            if spent + pairs(a, b) > cap:
                break
            taken.add((a, b))
            spent += pairs(a, b)
        assert {(i, j) for i in range(blocks) for j in range(blocks) if got[h, i, j]} == taken, h


@pytest.mark.parametrize("method", ["xattention", "flexprefill", "sinkwindow"])
def test_a_budget_keeps_every_sparse_arm_within_it(method, tiny):
    """At budget 0.9 each arm's recorded MACs are at most 0.9 of exact's, its knob value recorded; XAttention at
    threshold 1 (every block without a budget) is cut to the cap by its own scores."""
    from rf_eval.sparse.sinkwindow import SinkWindow

    model = tiny["llama"][0]
    n = 300
    ids = torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(2))
    arm = {"xattention": lambda: XAttention(model, None, block=BLOCK, stride=4, threshold=1.0, budget=0.9),
           "flexprefill": lambda: FlexPrefill(model, None, block=BLOCK, min_budget=16, budget=0.9),
           "sinkwindow": lambda: SinkWindow(model, None, block=BLOCK, budget=0.9)}[method]()
    plan = arm.plan(n)
    cost = arm.prefill_cost(n, arm.prefill(ids, plan=plan), plan)
    assert cost.macs_fraction <= 0.9 and cost.budget == 0.9 and cost.knob_value == plan.knob_value
    if method == "xattention":
        free = XAttention(model, None, block=BLOCK, stride=4, threshold=1.0)
        assert free.prefill_cost(n, free.prefill(ids)).macs_fraction > 0.9  # the cap did the cutting
