import torch

from rf_eval.ridge.sums import RidgeSums


def make_docs(seed=0, d=32, n_docs=5):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(d, d, generator=g) * 0.3
    docs = []
    for i in range(n_docs):
        n = 20 + 17 * i
        x = torch.randn(n, d, generator=g) * 2 + 3  # non-zero mean: centring matters
        y = x @ W + 0.3 * torch.randn(n, d, generator=g) - 1
        docs.append((x, {2: y, 3: torch.tanh(y) + 0.5}))
    return docs


def one_shot(docs, layer, lam):
    X = torch.cat([x for x, _ in docs]).double()
    Y = torch.cat([ys[layer] for _, ys in docs]).double()
    mx, my = X.mean(0), Y.mean(0)
    Xc, Yc = X - mx, Y - my
    cxx = Xc.T @ Xc
    alpha = lam * torch.trace(cxx) / X.shape[1]
    A = Yc.T @ Xc @ torch.linalg.inv(cxx + alpha * torch.eye(X.shape[1], dtype=torch.float64))
    return A, my - A @ mx


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def test_streaming_fit_equals_one_shot_solve():
    docs = make_docs()
    sums = RidgeSums(split=2, d_in=32, layers=[2, 3])
    for x, ys in docs:
        sums.add_document(x, ys)
    assert sums.count == sum(x.shape[0] for x, _ in docs)
    for lam in (1e-3, 0.1):
        A, b = sums.solve(lam)
        for layer in (2, 3):
            A_ref, b_ref = one_shot(docs, layer, lam)
            assert rel(A[layer], A_ref) <= 1e-6
            assert rel(b[layer], b_ref) <= 1e-6


def test_merging_two_halves_equals_one_stream():
    docs = make_docs(seed=1)
    whole = RidgeSums(split=2, d_in=32, layers=[2, 3])
    for x, ys in docs:
        whole.add_document(x, ys)
    a, b = RidgeSums(split=2, d_in=32, layers=[2, 3]), RidgeSums(split=2, d_in=32, layers=[2, 3])
    for i, (x, ys) in enumerate(docs):
        (a if i % 2 == 0 else b).add_document(x, ys)
    # the raw sums are additive: the same identity all_reduce relies on
    raw = lambda s: s.cxx + s.count * torch.outer(s.mean_x, s.mean_x)  # noqa: E731
    torch.testing.assert_close(raw(a) + raw(b), raw(whole), rtol=1e-12, atol=1e-9)


def test_saved_sums_round_trip(tmp_path):
    docs = make_docs(seed=2)
    sums = RidgeSums(split=2, d_in=32, layers=[2, 3])
    for x, ys in docs:
        sums.add_document(x, ys)
    sums.save(tmp_path / "s.safetensors", {"config_hash": "abc"})
    loaded, meta = RidgeSums.load(tmp_path / "s.safetensors")
    assert meta["config_hash"] == "abc" and loaded.count == sums.count
    A1, b1 = sums.solve(0.05)
    A2, b2 = loaded.solve(0.05)
    assert all(torch.equal(A1[k], A2[k]) and torch.equal(b1[k], b2[k]) for k in A1)


def test_lambda_must_be_positive():
    sums = RidgeSums(split=2, d_in=4, layers=[2])
    sums.add_document(torch.randn(5, 4), {2: torch.randn(5, 4)})
    for bad in (0.0, -1.0):
        try:
            sums.solve(bad)
        except ValueError as err:
            assert f"lambda must be > 0, got {bad}" in str(err)
        else:
            raise AssertionError("accepted lambda <= 0")
