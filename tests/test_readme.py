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
| load --lengths 4096 --rates 2 4 8 --requests 500 --discard 50 | 256, rates 20 40, 12 requests, 2 discarded | time |

The "Two commands" block is not run (it installs packages): its parts are
checked against .ci/run and tests/demo/demo_command.py (the command
tests/demo/test_demo.py runs). The "Adding a model family"
block is the shipped rf_eval/families/mistral.py, word for word, which the
registry finds by itself and which is checked on a tiny Mistral model. The
"Adding a fill" module is saved as written and run through `lm_eval` by
tests/model_adapters/test_adapter_fill_plugin.py on a tiny model. The "Adding a prefill method" module is
tests/methods/plugins/every_kth.py, word for word, which tests/methods/test_throwaway_methods.py runs through
`lm_eval`, `rf-eval serve`, a study with budgets and `rf-eval report`. The command line beside each of these
two modules is checked here as far as it runs before loading a model: with its variable set as it sets it,
lm-eval knows its `--model` and the adapter accepts its `--model_args`, which name that module's class.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import readme_checks
from readme_blocks import ROOT, Ran, Sub, Workspace, load_helper, readme_blocks, substitute
from warm_start import run_argv

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
    kind: str  # "run": run by test_readme_block; "ci", "family", "fill": checked by their own tests
    subs: tuple[Sub, ...] = ()
    timeout: float = 300.0
    check: str = ""  # name of its check function in tests/readme_checks.py


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
        Sub("--limit 300", "--limit 2", "time: 2 samples"),
        Sub("dtype: bfloat16", "dtype: float32", "CPU"),
        Sub("tasks: [ruler_filled]", "tasks: [niah_single_1_filled]", "time: one RULER task"),
        Sub("[8192, 16384, 32768]", "[1024]", "short prompts"), Sub("tail: 4096", "tail: 256", "short prompts"),
        Sub("split: 16", "split: 3", "the tiny model has 6 layers"), Sub("limit: 300", "limit: 2", "time: 2 samples"),
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
        Sub("--lengths 4096 --rates 2 4 8 --requests 500 --discard 50",
            "--lengths 256 --rates 20 40 --requests 12 --discard 2", "time"),
    ), 400, "check_serving"),
    Step("Reports and the run ledger", "bash", "run", (), 180, "check_reports"),
    Step("Adding a model family", "python", "family"),
    Step("Adding a fill", "python", "fill"),
    Step("Adding a fill", "bash", "fill"),
    Step("Adding a prefill method", "python", "method"),
    Step("Adding a prefill method", "bash", "method"),
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
    """Command 1 installs and runs the quick demo, command 2 the tests: CI runs the same. The quick demo is
    the command tests/demo/test_demo.py runs end to end (tests/demo/demo_command.py, which both read)."""
    first, second = blocks_by_section()["Two commands"].text.strip().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ").splitlines()
    assert second in ci
    *installs, demo = first.split(" && ")
    assert demo == "rf-eval demo --quick"
    assert installs and all(part in ci for part in installs), installs
    assert 'rf-eval = "rf_eval.cli:main"' in (ROOT / "pyproject.toml").read_text()  # `python -m rf_eval` is the same
    assert " ".join(load_helper("demo/demo_command.py").QUICK_DEMO) == demo


def test_adding_a_model_family(one_torch_thread):
    """The README's family module is the shipped rf_eval/families/mistral.py, found with no list to edit,
    and runs a tiny Mistral."""
    readme_checks.check_family_block(blocks_by_section()["Adding a model family"])


#: what a README `lm_eval --model M --model_args A` command's process would check before loading a model, run
#: in a fresh Python (the plug-in path variables are read at first import): lm-eval knows M (rf-eval's adapters
#: are registered through its startup hook), and the adapter's preflight accepts A; prints the method and
#: fill classes A resolves to, and the files they come from
ADAPTER_CHECK = """
import inspect, json, sys

import lm_eval.models  # noqa: F401
from lm_eval.api.registry import get_model
from lm_eval.utils import simple_parse_args_string

from rf_eval.fills import FILLS
from rf_eval.methods import chosen_method
from rf_eval.model_adapters.config import preflight

model, args = sys.argv[1], simple_parse_args_string(sys.argv[2])
get_model(model)  # a ValueError naming the valid models for any other name
arm = preflight(args, model)
method = chosen_method(args, model)[0]
fill = FILLS[arm.fill] if getattr(arm, "fill", None) else None
print(json.dumps({"method": method.name, "method file": inspect.getfile(method), "arm": repr(arm),
                  "fill": fill and fill.name, "fill file": fill and inspect.getfile(fill)}))
"""


def lm_eval_command(command: str) -> tuple[dict[str, str], str, str]:
    """A README lm_eval command line's variable assignments, its --model and its --model_args."""
    words = shlex.split(command.replace("\\\n", " "))
    env = {}
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[0] == "lm_eval", command
    return env, words[words.index("--model") + 1], words[words.index("--model_args") + 1]


def adapter_check(command: str, folder: Path, cwd: Path) -> dict:
    """`ADAPTER_CHECK` of a README command, run in `cwd` with the command's variables set as it sets them."""
    variables, model, model_args = lm_eval_command(command)
    script = folder / "adapter_check.py"
    script.write_text(ADAPTER_CHECK)
    done = run_argv([sys.executable, str(script), model, model_args], cwd=cwd, env={**os.environ, **variables},
                    timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_adding_a_fill_method_runs_what_the_plugin_test_runs(tmp_path):
    """The command line beside the fill module, run where the module is saved (as `<the folder its variable
    names>/<its name>.py`): lm-eval knows its model and the adapter accepts its model_args, whose fill is the
    module's. The module itself runs through lm_eval in tests/model_adapters/test_adapter_fill_plugin.py,
    which reads it from this README section."""
    sections = [b for b in readme_blocks() if b.section == "Adding a fill"]
    code, command = (b.text for b in sections)
    name = re.search(r'^    name = "(\w+)"', code, re.M).group(1)
    ((variable, folder),) = lm_eval_command(command)[0].items()
    saved = tmp_path / folder / f"{name}.py"
    saved.parent.mkdir(parents=True)
    saved.write_text(code)
    found = adapter_check(command, tmp_path, tmp_path)
    assert (found["fill"], found["fill file"]) == (name, str(saved)), (variable, found)


def test_adding_a_prefill_method_shows_the_method_the_throwaway_tests_run(tmp_path):
    """The module is tests/methods/plugins/every_kth.py as it stands (tests/methods/test_throwaway_methods.py
    runs it through lm_eval, the server, a study with budgets and the report), and the command line beside it,
    run from the checkout with its variable as it sets it: lm-eval knows its model and the adapter accepts its
    model_args, whose method is that module's."""
    sections = [b for b in readme_blocks() if b.section == "Adding a prefill method"]
    code, command = (b.text for b in sections)
    shipped = ROOT / "tests" / "methods" / "plugins" / "every_kth.py"
    assert code == shipped.read_text()
    name = re.search(r'^    name = "(\w+)"', code, re.M).group(1)
    found = adapter_check(command, tmp_path, ROOT)
    assert (found["method"], found["method file"]) == (name, str(shipped)), found


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
    env["RF_EVAL_RULER_CACHE"] = str(root / "ruler-samples")  # not the user's own cache folder
    return Runs(Workspace(root, env, {"llama": str(llama), "source": str(source), "target": str(target)}))


@pytest.mark.slow
@pytest.mark.parametrize("step", RUN_STEPS, ids=lambda s: s.section)
def test_readme_block(runs, step):
    ran = runs.through(step.section)
    assert ran.returncode == 0, ran.tail()
    getattr(readme_checks, step.check)(runs.workspace.root, ran, ran.values)
