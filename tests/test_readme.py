"""Every command block of README.md, run as written on tiny local models (CPU, offline).

The blocks run in README order in one shared folder, as a reader runs them:
later blocks read what earlier ones wrote (maps/, runs/, ledger.jsonl,
ttft.json). Before the first block the test writes what the README asks the
user to supply: calib.jsonl, docs/*.txt, heldout.jsonl, document.txt, the
essay haystack essays/ (with an offline nltk punkt_tab), arms.yaml.

Substitution table (`STEPS`): each `Sub` must find its `old` text in its
block, so a README edit that removes it fails here rather than running
something else.

| README text | runs as | why |
|---|---|---|
| meta-llama/Llama-3.1-8B-Instruct | a tiny llama folder | no hub, no GPU |
| Qwen/Qwen3-0.6B, Qwen/Qwen3-8B | a tiny qwen3 source/target pair sharing one tokenizer | as above |
| --splits 12 16, split 16 | 2 3, split 3 | the tiny model has 6 layers |
| --nproc_per_node 8 | 2 | two CPU processes, gloo |
| device="cuda", dtype="bfloat16" / dtype=bfloat16 | cpu, float32 | CPU |
| tails 4096 / 2048, max_new_tokens=64 | 256 / 128, 8 | short prompts |
| RULER lengths 8192..32768, 16384 | 1024 | short prompts |
| check-equivalence --lengths 1024 8192 | 256 1024 | time |
| --tasks ruler_filled | niah_single_1_filled, --limit 2 | time (one RULER task, 2 samples) |
| accelerate launch -m lm_eval | ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 ... | what accelerate does on a multi-GPU machine, on 2 CPU processes |
| fit-transfer --k 8 --rank 128 | --k 2 --rank 8 | the tiny source has 4 layers |
| ports 8000 / 8001, sleep 5 | free loopback ports, sleep 1 | parallel test runs |
| max_length=131072 | 8192 | the tiny model's context |
| ttft --lengths 9216 16384 --repeats 5 | 600 1100, --repeats 2 | time |

The "Two commands" block is not run (it installs packages): its parts are
checked against .ci/run and tests/test_demo.py. The "Adding a model family"
block is the shipped rf_eval/families/mistral.py, word for word, which the
registry finds by itself and which is checked on a tiny Mistral model.
"""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from readme_blocks import ROOT, TESTS, Ran, Sub, Workspace, load_helper, readme_blocks, substitute

LLAMA = Sub("meta-llama/Llama-3.1-8B-Instruct", "<llama>", "a tiny local llama")
SPLITS = Sub("--splits 12 16", "--splits 2 3", "the tiny model has 6 layers")
SPLIT_ARG = Sub("--split 16", "--split 3", "the tiny model has 6 layers")
SPLIT_KW = Sub("split=16", "split=3", "the tiny model has 6 layers")
TAIL_ARG = Sub("tail=4096", "tail=256", "short prompts")
TAIL_META = Sub('"tail":4096', '"tail":256', "short prompts")
BF16 = Sub("dtype=bfloat16", "dtype=float32", "CPU")
ONE_TASK = Sub("--tasks ruler_filled", "--tasks niah_single_1_filled", "time: one RULER task")
LIMIT = Sub("--log_samples", "--log_samples --limit 2", "time: 2 samples")


@dataclass(frozen=True)
class Step:
    section: str
    lang: str
    kind: str  # "run": run by test_readme_block; "ci", "family": checked by their own tests
    subs: tuple[Sub, ...] = ()
    timeout: float = 300.0
    check: str = ""  # name of the check function below


STEPS = (
    Step("Two commands", "bash", "ci"),
    Step("Fitting maps", "bash", "run", (
        LLAMA, SPLITS, Sub("--nproc_per_node 8", "--nproc_per_node 2", "two CPU processes (gloo)"),
    ), 300, "check_fitting"),
    Step("Python API", "python", "run", (
        LLAMA, SPLIT_KW, TAIL_ARG,
        Sub('device="cuda", dtype="bfloat16"', 'device="cpu", dtype="float32"', "CPU"),
        Sub("max_new_tokens=64", "max_new_tokens=8", "time"),
    ), 180, "check_python_api"),
    Step("Running on a real model (GPU)", "bash", "run", (
        LLAMA, SPLIT_ARG, SPLIT_KW, TAIL_ARG, TAIL_META, BF16, ONE_TASK,
        Sub("--lengths 1024 8192", "--lengths 256 1024", "time"),
        Sub("[8192,16384,32768]", "[1024]", "short prompts"),
        Sub("accelerate launch -m lm_eval",
            "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 -m lm_eval",
            "data parallel over 2 CPU processes (gloo), as accelerate does over the GPUs it finds"),
        Sub("--limit 100", "--limit 2", "time: 2 samples"),
        Sub("dtype: bfloat16", "dtype: float32", "CPU"),
        Sub("tasks: [ruler_filled]", "tasks: [niah_single_1_filled]", "time: one RULER task"),
        Sub("[8192, 16384, 32768]", "[1024]", "short prompts"), Sub("tail: 4096", "tail: 256", "short prompts"),
        Sub("split: 16", "split: 3", "the tiny model has 6 layers"), Sub("limit: 100", "limit: 2", "time: 2 samples"),
    ), 600, "check_gpu_runs"),
    Step("A whole study in one command", "bash", "run", (), 300, "check_study"),
    Step("RaReCache", "bash", "run", (
        Sub("Qwen/Qwen3-0.6B", "<source>", "a tiny qwen3 source"),
        Sub("Qwen/Qwen3-8B", "<target>", "a tiny qwen3 target (same tokenizer)"),
        Sub("--k 8 --rank 128", "--k 2 --rank 8", "the tiny source has 4 layers"),
        Sub("[8192]", "[1024]", "short prompts"), ONE_TASK, LIMIT,
    ), 300, "check_rarecache"),
    Step("Serving engines", "bash", "run", (
        LLAMA, SPLIT_ARG, TAIL_ARG, TAIL_META, ONE_TASK, LIMIT,
        Sub("8000", "<port_a>", "a free loopback port"),
        Sub("8001", "<port_b>", "a free loopback port"),
        Sub("sleep 5", "sleep 1", "time"),
        Sub("max_length=131072", "max_length=8192", "the tiny model's context"),
        Sub("[16384]", "[1024]", "short prompts"),
        Sub('"tail":2048', '"tail":128', "short prompts"),
        Sub("--lengths 9216 16384", "--lengths 600 1100", "short prompts"),
        Sub("--repeats 5", "--repeats 2", "time"),
    ), 400, "check_serving"),
    Step("Reports and the run ledger", "bash", "run", (), 180, "check_reports"),
    Step("Adding a model family", "python", "family"),
)
RUN_STEPS = [s for s in STEPS if s.kind == "run"]
PLACEHOLDERS = {"llama": "/m/llama", "source": "/m/source", "target": "/m/target", "port_a": "1", "port_b": "2"}


def blocks_by_section() -> dict[str, object]:
    return {b.section: b for b in readme_blocks()}


# ---------------------------------------------------------------------------------------------- fast checks


def test_every_block_is_run_or_accounted_for():
    found = [(b.section, b.lang) for b in readme_blocks()]
    planned = [(s.section, s.lang) for s in STEPS]
    assert found == planned, (
        "README.md's fenced blocks changed: run each new block in tests/test_readme.py (STEPS) or account "
        f"for it there.\nREADME: {found}\nSTEPS:  {planned}"
    )


@pytest.mark.parametrize("step", RUN_STEPS, ids=lambda s: s.section)
def test_substitutions_still_match_the_readme(step):
    text = substitute(blocks_by_section()[step.section], list(step.subs), PLACEHOLDERS)
    assert "..." not in text, f"a placeholder left in the block of '{step.section}'"


def test_two_commands_are_what_ci_runs():
    """Command 1 installs and runs the quick demo, command 2 the tests: CI runs the same."""
    first, second = blocks_by_section()["Two commands"].text.strip().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ").splitlines()
    assert second in ci
    *installs, demo = first.split(" && ")
    assert demo == "rf-eval demo --quick"
    assert installs and all(part in ci for part in installs), installs
    assert 'rf-eval = "rf_eval.cli:main"' in (ROOT / "pyproject.toml").read_text()  # `python -m rf_eval` is the same
    test_demo = (TESTS / "test_demo.py").read_text()
    assert '"-m", "rf_eval", "demo", "--quick"' in test_demo
    assert re.search(r"@pytest\.mark\.slow\s+def test_quick_demo_runs_end_to_end", test_demo)


def test_adding_a_model_family(one_torch_thread):
    """The README's family module is the shipped rf_eval/families/mistral.py, found with no list to edit,
    and runs a tiny Mistral."""
    import transformers as tf

    from rf_eval import families
    from rf_eval.cli.check_equivalence import compare
    from rf_eval.engine import Plan, plain_prefill, prefill
    from rf_eval.ridgefill.api import RidgeFill
    from rf_eval.ridgefill.maps import identity_fill

    block = blocks_by_section()["Adding a model family"]
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
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if p.dim() >= 2 and "norm" not in name:
                        p.normal_(0.0, 0.08)
        return model

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


# ---------------------------------------------------------------------------------------------- the runs

adapter_helpers = load_helper("model_adapters/adapter_helpers.py")
task_fixtures = load_helper("tasks/task_fixtures.py")
serving_helpers = load_helper("serving/serving_helpers.py")


@dataclass
class Runs:
    workspace: Workspace
    done: dict[str, Ran] = field(default_factory=dict)

    def through(self, section: str) -> Ran:
        """Run the README's blocks in order up to `section` (each once); its result."""
        blocks = blocks_by_section()
        for step in RUN_STEPS:
            if step.section not in self.done:
                failed = [r.section for r in self.done.values() if r.returncode != 0]
                if failed:
                    pytest.fail(f"not run: the earlier README block(s) {failed} failed")
                # ports taken just before the block, so that nothing else takes them meanwhile
                values = {**self.workspace.values, **dict(zip(("port_a", "port_b"), free_ports(2)))}
                script = substitute(blocks[step.section], list(step.subs), values)
                ran = self.workspace.run(step.section, step.lang, script, step.timeout)
                ran.values = values
                self.done[step.section] = ran
            if step.section == section:
                return self.done[section]
        raise KeyError(section)


def free_ports(count: int) -> list[str]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(serving_helpers.free_port())
    return [str(p) for p in sorted(ports)]


def write_inputs(root: Path) -> None:
    """What the README asks the user to supply."""
    sentences = task_fixtures.sentences
    with open(root / "calib.jsonl", "w") as fh:
        for i in range(6):
            fh.write(json.dumps({"text": " ".join(sentences(12, seed=i))}) + "\n")
    (root / "docs").mkdir()
    for i in range(2):
        (root / "docs" / f"doc{i}.txt").write_text(" ".join(sentences(12, seed=40 + i)) + "\n")
    with open(root / "heldout.jsonl", "w") as fh:
        for i in range(2):
            fh.write(json.dumps({"text": " ".join(sentences(12, seed=80 + i))}) + "\n")
    (root / "document.txt").write_text(task_fixtures.long_document(3000, seed=7) + "\n")
    task_fixtures.write_essays(root / "essays")
    (root / "arms.yaml").write_text("reference: exact\narms: [identity, ridge]\nsplit: 3\ntail: 256\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    from rf_eval.testing import make_tiny_model, make_tiny_pair

    models = tmp_path_factory.mktemp("readme_models")
    llama = make_tiny_model("llama", models / "llama")
    source, target = make_tiny_pair("qwen3", models / "pair")
    root = tmp_path_factory.mktemp("readme")
    write_inputs(root)
    nltk = task_fixtures.write_punkt(tmp_path_factory.mktemp("readme_nltk"))
    env = adapter_helpers.cli_env()  # offline, one torch thread per process
    env.update(NLTK_DATA=str(nltk), PYTHONUNBUFFERED="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    env.pop("RF_EVAL_NO_LM_EVAL_HOOK", None)
    return Runs(Workspace(root, env, {"llama": str(llama), "source": str(source), "target": str(target)}))


@pytest.mark.slow
@pytest.mark.parametrize("step", RUN_STEPS, ids=lambda s: s.section)
def test_readme_block(runs, step):
    ran = runs.through(step.section)
    assert ran.returncode == 0, ran.tail()
    globals()[step.check](runs.workspace.root, ran, ran.values)


def results(run_dir: Path) -> tuple[dict, list[dict]]:
    """(results JSON, samples of the one task) of an lm_eval --output_path folder."""
    files = sorted(run_dir.rglob("results_*.json"))
    assert files, f"no results under {run_dir}"
    samples = sorted(run_dir.rglob("samples_*.jsonl"))
    assert len(samples) == 1, samples
    return json.loads(files[-1].read_text()), [json.loads(x) for x in samples[0].read_text().splitlines() if x]


def check_fitting(root: Path, ran: Ran, values: dict) -> None:
    from rf_eval.ridgefill.maps import load_maps

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
    from rf_eval.ridgefill.maps import load_maps

    line = next(x for x in reversed(ran.output.splitlines()) if x.startswith("{'method': 'ridgefill'"))
    provenance = ast.literal_eval(line)
    assert (provenance["fill"], provenance["split"], provenance["tail"]) == ("ridge", 3, 256)
    assert provenance["maps_sha256"] == load_maps(root / "maps", 3).sha256()
    assert provenance["maps_metadata"]["split"] == "3"


def check_gpu_runs(root: Path, ran: Ran, values: dict) -> None:
    from datetime import datetime

    from rf_eval.stats.ledger import verify_ledger

    assert "FAIL" not in ran.output and len(re.findall(r"^OK +N=(256|1024) ", ran.output, re.M)) == 10
    out = root / "runs"
    state = json.loads((out / "study.json").read_text())
    assert list(state["arms"]) == ["exact", "identity", "ridge"] and (out / "report.html").is_file()
    (entry,) = verify_ledger(root / "ledger.jsonl")  # the study's claim, registered before any arm ran
    assert list(entry.arms) == ["exact", "identity", "ridge"]
    for fill in ("exact", "identity", "ridge"):
        done = json.loads((out / "arms" / fill / "done.json").read_text())
        assert entry.time < datetime.fromisoformat(done["started"])
        res, samples = results(out / "arms" / fill)
        info = res["config"]["rf_eval"]
        assert info["fill"] == fill and len(samples) == 2 and all(s["filled"] == 1 for s in samples)
        if fill != "exact":
            assert (info["split"], info["tail"]) == (3, 256)
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
    assert "1 entries, chain intact" in ran.output
