"""What each README block must have done (tests/test_readme.py runs the blocks, then calls these).

A `check_<section>(root, ran, values)` reads what the block wrote under the
shared folder `root` and what it printed (`ran.output`); `values` are the
paths and ports its substitutions filled in. `check_family_block` checks the
"Adding a model family" block, which is not run but is the shipped module.
"""

from __future__ import annotations

import ast
import json
import re
import socket
from pathlib import Path

import torch
from readme_blocks import ROOT, Block, Ran


def check_family_block(block: Block) -> None:
    """The block is rf_eval/families/mistral.py word for word, the registry finds it, and it runs a tiny Mistral."""
    import transformers as tf

    from rf_eval import families
    from rf_eval.cli.check_equivalence import compare
    from rf_eval.engine import Plan, plain_prefill, prefill
    from rf_eval.ridge.maps import identity_fill
    from rf_eval.ridgefill.method import RidgeFill
    from rf_eval.testing import random_model

    header = "# rf_eval/families/mistral.py\n"
    assert block.text.startswith(header)
    assert block.text[len(header):] == (ROOT / "rf_eval" / "families" / "mistral.py").read_text()
    assert "mistral" in families.registered_families()  # found by itself: no list names it
    shipped = families.family_class("mistral")
    assert families.supported_model_types()["mistral"] == "mistral"
    assert shipped.tiny_config(259).sliding_window is None  # its tiny model is one the engine serves

    def tiny(**overrides):
        config = tf.MistralConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  max_position_embeddings=4096, tie_word_embeddings=False, **overrides)
        return random_model(config)

    model, n, tail = tiny(sliding_window=None), 48, 8
    family = families.family_for(model.config)
    assert type(family) is shipped and type(family).__module__ == "rf_eval.families.mistral"
    ids = torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(0))
    ref = plain_prefill(model, ids)
    # fill off: bitwise the plain forward
    for plan, fill in [(Plan(split=3, tail=1, fill="exact"), None), (Plan(split=3, tail=n, fill="ridge"), identity_fill)]:
        assert compare(prefill(model, ids, plan, fill=fill), ref) is None, plan
    # filled rows: the late layers cache the K/V of x_S, rotated by Mistral's own RoPE
    plan = Plan(split=2, tail=tail, fill="identity")
    got = prefill(model, ids, plan, fill=identity_fill)
    assert (got.logits - ref.logits).abs().max() > 1e-3
    with torch.no_grad():
        x_split = model(input_ids=ids, output_hidden_states=True).hidden_states[2]
        attn = model.model.layers[4].self_attn
        h = model.model.layers[4].input_layernorm(x_split)
        k = attn.k_proj(h).view(1, n, -1, attn.head_dim).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x_split, torch.arange(n)[None])
        _, k = tf.models.mistral.modeling_mistral.apply_rotary_pos_emb(k, k, cos, sin)
    torch.testing.assert_close(got.cache.layers[4].keys[:, :, : n - tail], k[:, :, : n - tail], rtol=1e-6, atol=1e-6)
    # every prefix row selected exact: the arm is the model again
    every = prefill(model, ids, plan, fill=identity_fill, select=lambda ctx: torch.arange(n - tail))
    torch.testing.assert_close(every.logits, ref.logits, rtol=1e-5, atol=1e-5)
    want = model.generate(ids[:, :32], max_new_tokens=6, do_sample=False)
    assert torch.equal(RidgeFill(model, split=3, tail=4, fill="exact").generate(ids[:, :32], max_new_tokens=6,
                                                                                 do_sample=False), want)
    # the README's note: a sliding-window checkpoint (v0.1) runs inside its window
    windowed = tiny(sliding_window=16)
    every = prefill(windowed, ids, plan, fill=identity_fill, select=lambda ctx: torch.arange(n - tail))
    torch.testing.assert_close(every.logits, plain_prefill(windowed, ids).logits, rtol=1e-5, atol=1e-5)


def results(run_dir: Path) -> tuple[dict, list[dict]]:
    """(results JSON, samples of the one task) of an lm_eval --output_path folder."""
    files = sorted(run_dir.rglob("results_*.json"))
    assert files, f"no results under {run_dir}"
    samples = sorted(run_dir.rglob("samples_*.jsonl"))
    assert len(samples) == 1, samples
    return json.loads(files[-1].read_text()), [json.loads(x) for x in samples[0].read_text().splitlines() if x]


def check_fitting(root: Path, ran: Ran, values: dict) -> None:
    from rf_eval.ridge.maps import load_maps

    for split in (2, 3):
        fitted, refit, sharded = (load_maps(root / d, split) for d in ("maps", "maps-0.01", "maps-dp"))
        assert len(json.loads(fitted.metadata["lambda_scores"])) == 9  # the held-out grid 1e-4..1
        assert float(refit.metadata["lambda"]) == 0.01 and refit.metadata["rows"] == fitted.metadata["rows"]
        # two processes, documents sharded, sums all-reduced: the same maps
        assert sharded.metadata["lambda"] == fitted.metadata["lambda"]
        assert sharded.metadata["rows"] == fitted.metadata["rows"]
        for layer in fitted.layers:
            torch.testing.assert_close(sharded.A[layer], fitted.A[layer], rtol=1e-4, atol=1e-5)


def check_python_api(root: Path, ran: Ran, values: dict) -> None:
    from rf_eval.ridge.maps import load_maps

    line = next(x for x in reversed(ran.output.splitlines()) if x.startswith("{'method': 'ridgefill'"))
    provenance = ast.literal_eval(line)
    assert (provenance["fill"], provenance["split"], provenance["tail"]) == ("ridge", 3, 256)
    assert provenance["maps_sha256"] == load_maps(root / "maps", 3).sha256()
    assert provenance["maps_metadata"]["split"] == "3"


def check_gpu_runs(root: Path, ran: Ran, values: dict) -> None:
    from datetime import datetime

    from rf_eval.fills import arm_fills
    from rf_eval.stats.ledger import verify_ledger

    # per length: the exact fill at tail 1, then every registered fill with the tail covering the prompt, but
    # those whose rules refuse the model or its maps, each named once on a SKIP line
    checked = re.findall(r"^OK +N=(256|1024) fill=(\w+) tail=(\d+):", ran.output, re.M)
    skipped = re.findall(r"^SKIP fill=(\w+): ", ran.output, re.M)
    assert "FAIL" not in ran.output and {"identity", "nofill", "ridge"} <= {f for _, f, _ in checked}, ran.output
    for n in ("256", "1024"):
        assert [(f, t) for m, f, t in checked if m == n] == [("exact", "1")] + [
            (f, n) for f in arm_fills() if f not in skipped], ran.output
    out = root / "runs"
    state = json.loads((out / "study.json").read_text())
    assert list(state["arms"]) == ["exact", "identity", "ridge"] and (out / "report.html").is_file()
    # the study's claim, registered before any arm ran, then its report's record of the result files
    entry, results_entry = verify_ledger(root / "ledger.jsonl")
    assert list(entry.arms) == ["exact", "identity", "ridge"] and entry.kind == "claim"
    assert results_entry.kind == "results" and any("samples_" in path for path, _ in results_entry.files)
    for fill in ("exact", "identity", "ridge"):
        done = json.loads((out / "arms" / fill / "done.json").read_text())
        assert entry.time < datetime.fromisoformat(done["started"])
        res, samples = results(out / "arms" / fill)
        info = res["config"]["rf_eval"]
        assert info["fill"] == fill and len(samples) == 2 and all(s["filled"] == 1 for s in samples)
        if fill != "exact":
            assert (info["split"], info["tail"]) == (3, 256)
        # the samples the study built before registering, read by every arm instead of generated again
        log = (out / "logs" / f"{fill}.log").read_text()
        assert "RULER samples read from" in log and "Generating synthetic samples" not in log, fill
    # data parallel over two processes: the same samples, the same answers
    res, dp = results(out / "ridge_dp")
    _, single = results(out / "arms" / "ridge")
    assert res["config"]["rf_eval"]["fill"] == "ridge"
    key = lambda s: s["doc_id"]  # noqa: E731
    assert [(s["doc_id"], s["resps"]) for s in sorted(dp, key=key)] == \
           [(s["doc_id"], s["resps"]) for s in sorted(single, key=key)]


def check_study(root: Path, ran: Ran, values: dict) -> None:
    assert "[identity] " in ran.output and "MAC cost / exact: N=1024:" in ran.output  # the plan
    for arm in ("exact", "identity", "ridge"):  # the study again: every arm done, only the report runs
        assert f"{arm}: done before (fingerprint matches), skipped" in ran.output
    status = [line.split() for line in ran.output.splitlines() if line.startswith("  ")]
    assert [row[:2] for row in status if row[:1] in (["exact"], ["identity"], ["ridge"])][-3:] == [
        ["exact", "done"], ["identity", "done"], ["ridge", "done"]]  # `rf-eval study status`


def check_rarecache(root: Path, ran: Ran, values: dict) -> None:
    assert (root / "transfer" / "rarecache_maps.safetensors").is_file()
    res, samples = results(root / "runs" / "rare")
    info = res["config"]["rf_eval"]
    assert (info["method"], info["rho"], info["selector"]) == ("rarecache", 0.3, "rank")
    assert info["maps_metadata"]["k"] == "2" and len(samples) == 2


def check_serving(root: Path, ran: Ran, values: dict) -> None:
    _, samples = results(root / "runs" / "serve_identity")
    assert len(samples) == 2 and all("filled" in s for s in samples)
    ttft = json.loads((root / "ttft.json").read_text())
    assert ttft["kind"] == "rf-eval-ttft" and [r["length"] for r in ttft["speed"]] == [600, 1100]
    assert ttft["speed"][0]["arm"] == "fill=ridge,tail=128"
    load = json.loads((root / "load.json").read_text())
    assert load["kind"] == "rf-eval-load" and [(r["length"], r["rate"]) for r in load["rows"]] == [(256, 20), (256, 40)]
    assert all(s["completed"] + s["cut"] + s["failed"] == s["sent"] for s in load["sweeps"])
    assert load["server_scheduler"]["max_batch"] == 32 and "saturation_a" in load["lengths"][0]
    assert re.search(r"^OK: 0 of \d+ prompts differ$", ran.output, re.M), ran.output[-2000:]
    for port in (values["port_a"], values["port_b"]):  # `kill $(jobs -p)` ended both servers
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(port))) != 0, f"a server still listens on {port}"


def check_reports(root: Path, ran: Ran, values: dict) -> None:
    for name in ("report.html", "tables.tex", "report.md"):
        assert (root / name).stat().st_size > 0, name
    md = (root / "report.md").read_text()
    for arm in ("identity", "ridge"):  # registered in the ledger before their runs
        assert re.search(rf"^\| {arm} \|.*\| registered \|$", md, re.M), md[:3000]
    assert "follow-up" not in md and "not registered" not in md
    assert "fill=ridge,tail=128" in md  # the ttft speed rows joined the report
    assert re.search(r"2 entries, chain intact; \d+ recorded result files unchanged", ran.output), ran.output[-2000:]
