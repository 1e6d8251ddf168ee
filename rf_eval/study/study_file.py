"""The study file: a whole registered study (RidgeFill paper section 3.4 and the recipe of section 9) as YAML.

    model:                       # the model every arm runs on
      pretrained: /models/llama  # folder or hub id
      args: {dtype: bfloat16}    # any other `hf` model_args (device, parallelize, revision, ...)
    maps: /maps/llama            # RidgeFill maps, or `fit:` below to fit them first
    fit: {calibration: [cal.jsonl], heldout: [held.jsonl], split: 16, lambdas: [0.01, 0.03]}
                                 # (+ overlap: refuse: stop, not warn, when the calibration text overlaps
                                 # the metadata's docs; `rf_eval.study.overlap`)
    tasks: [niah_single_1_filled, keytoken_nll]
    include_path: ./my_tasks     # optional: a folder of task YAMLs (lm_eval --include_path)
    lengths: [4096, 8192]        # --metadata max_seq_lengths
    metadata: {tail: 4096}       # any other --metadata
    limit: 50                    # per task (lm-eval --limit): 25 per task and length here, RULER tasks
                                 # taking one of each length in turn; or `samples: {task: [doc ids]}`
    apply_chat_template: true
    seed: 0
    arms:                        # name -> lm-eval model and its model_args
      exact: {args: {fill: exact}}
      ridge: {args: {fill: ridge, tail: 4096}}       # model defaults to ridgefill; maps: the study's
      rows:  {args: {fill: ridge, tail: 4096, selector: attention}}
      random_rows: {args: {fill: ridge, tail: 4096, selector: "random(of=attention)"}}
      served: {model: local-completions, args: {base_url: "http://127.0.0.1:8000/v1/completions"}}
    reference: exact
    margin: 2.0                  # non-inferiority margin, points
    controls: {rows: [random_rows]}   # count-matched controls of a selection
    budgets: [0.5, 0.7]          # optional: every arm a budget can set runs once per budget instead
                                 # (ridge@0.5, ridge@0.7, ...; exact and API arms as they are)
    claims:
      - {claim: "ridge is non-inferior to exact", prediction: "lower bound above -2 points"}

`load_study(path)` validates it before anything runs, into a `Study`
(`rf_eval.study.spec`): an unknown key, a missing one, a value of the wrong
type, an arm without a fill, a reference or control that names no declared arm
are a `StudyError` naming the key and the file's line.

`budgets` (`rf_eval.cost.budget`): each arm whose settings take a budget (an rf-eval
arm of a fill or of RaReCache, without a budget of its own) is replaced by one
arm per budget, named `<arm>@<budget>` with `budget` in its args (RaReCache's
`rho` and a dropper's `keep` or `keep_share` dropped: the budget sets them), so every method runs at the same costs;
the report then compares the arms of each budget with each other. The
reference and the controls must name arms the budgets leave as they are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from rf_eval.cost.budget import budget_name, check_budget
from rf_eval.errors import UserError
from rf_eval.fields import ArmError
from rf_eval.methods import METHODS, MODELS, method_for_arm
from rf_eval.study.spec import Study, StudyArm, StudyError

#: an arm's model when it names none
DEFAULT_MODEL = "ridgefill"

# key -> (type(s), required); nested schemas for the mappings below
_TOP = {
    "name": (str, False), "model": (dict, True), "maps": (str, False), "fit": (dict, False), "tasks": (list, True),
    "include_path": (str, False), "lengths": (list, False), "metadata": (dict, False), "limit": (int, False),
    "samples": (dict, False), "apply_chat_template": (bool, False), "seed": (int, False), "arms": (dict, True),
    "reference": (str, True), "margin": ((int, float), False), "controls": (dict, False), "claims": (list, False),
    "budgets": (list, False),
}
_MODEL = {"pretrained": (str, True), "args": (dict, False)}
_FIT = {"calibration": (list, True), "heldout": (list, False), "split": (int, True), "lambdas": (list, False),
        "overlap": (str, False)}
OVERLAP_ACTIONS = ("warn", "refuse")  # fit.overlap: what calibration text that overlaps `docs` does (`rf_eval.study.overlap`)
_ARM = {"model": (str, False), "args": (dict, False)}
_CLAIM = {"claim": (str, True), "prediction": (str, True)}


def _line(node: yaml.Node | None) -> str:
    return f"line {node.start_mark.line + 1}" if node is not None else "top level"


def _check(where: str, values: dict, nodes: dict, schema: dict, parent: yaml.Node | None) -> None:
    for key, value in values.items():
        if key not in schema:
            raise StudyError(f"{where}: unknown key {key!r} ({_line(nodes.get(key))}); valid keys: "
                             f"{', '.join(schema)}")
        kinds, _ = schema[key]
        if not isinstance(value, kinds) or (kinds is int and isinstance(value, bool)):
            names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            raise StudyError(f"{where}: {key} must be {names}, got {value!r} ({_line(nodes.get(key))})")
    missing = [k for k, (_, needed) in schema.items() if needed and k not in values]
    if missing:
        raise StudyError(f"{where}: missing key(s) {', '.join(missing)} ({_line(parent)})")


def _key_nodes(node: yaml.Node) -> dict[str, yaml.Node]:
    """Each mapping key's node (for line numbers)."""
    return {k.value: k for k, _ in node.value} if isinstance(node, yaml.MappingNode) else {}


def _value_nodes(node: yaml.Node) -> dict[str, yaml.Node]:
    return {k.value: v for k, v in node.value} if isinstance(node, yaml.MappingNode) else {}


def _check_duplicates(name: str, node: yaml.Node | None, where: str = "") -> None:
    """A key given twice in any mapping of the file (YAML keeps the last one silently: an arm would vanish)."""
    if isinstance(node, yaml.MappingNode):
        first: dict[str, yaml.Node] = {}
        for key, value in node.value:
            label = f"{where}.{key.value}" if where else str(key.value)
            if key.value in first:
                raise StudyError(f"{name}: {label} is given twice ({_line(first[key.value])} and {_line(key)}); "
                                 "a YAML mapping keeps only the last one")
            first[key.value] = key
            _check_duplicates(name, value, label)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(name, item, f"{where}[{i}]")


def load_study(path: str | Path) -> Study:
    """Parse and validate a study file (nothing runs)."""
    path = Path(path).resolve()
    text, root, data = _parse(path)
    name = path.name
    _check_duplicates(name, root)
    _check(name, data, _key_nodes(root), _TOP, root)
    values = _value_nodes(root)
    _check(f"{name}: model", data["model"], _key_nodes(values["model"]), _MODEL, values["model"])
    if "fit" in data:
        _check_fit(name, data, root, values["fit"])
    arms = _read_arms(name, data["arms"], _value_nodes(values["arms"]))
    budgets = _budgets(name, data.get("budgets"), values.get("budgets"))
    arms, expanded = expand_budgets(arms, budgets)
    reference = data["reference"]
    _check_reference(name, reference, arms, expanded, values["reference"])
    controls = data.get("controls") or {}
    _check_controls(name, controls, arms, expanded, values.get("controls"))
    _check_claims(name, data.get("claims") or [], values["claims"].value if "claims" in data else [])
    lengths = _check_sizes(name, data, values)
    return Study(
        path=path, sha256=hashlib.sha256(text.encode()).hexdigest(),
        pretrained=_resolve(path, data["model"]["pretrained"]), model_args=dict(data["model"].get("args") or {}),
        tasks=tuple(str(t) for t in data["tasks"]), arms=arms, reference=reference,
        maps=_resolve(path, data["maps"]) if "maps" in data else None, fit=data.get("fit"),
        include_path=_resolve(path, data["include_path"]) if "include_path" in data else None,
        lengths=lengths, metadata=dict(data.get("metadata") or {}), limit=data.get("limit"),
        samples=data.get("samples"), apply_chat_template=bool(data.get("apply_chat_template", False)),
        seed=int(data.get("seed", 0)), margin=float(data.get("margin", 2.0)),
        controls={k: (v if isinstance(v, list) else [v]) for k, v in controls.items()},
        claims=tuple(data.get("claims") or ()), budgets=budgets,
    )


def _parse(path: Path) -> tuple[str, yaml.Node, dict[str, Any]]:
    """The file's text, its YAML node tree (for line numbers) and its data, which must be a mapping."""
    if not path.is_file():
        raise StudyError(f"no study file at {path}")
    text = path.read_text()
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise StudyError(f"{path.name}: not valid YAML ({err})") from None
    if not isinstance(data, dict) or root is None:
        raise StudyError(f"{path.name}: a study file is a mapping of keys (model, tasks, arms, reference, ...)")
    return text, root, data


def _check_fit(name: str, data: dict[str, Any], root: yaml.Node, node: yaml.Node) -> None:
    """The `fit:` block: its keys, its `overlap` action, and no `maps` beside it."""
    _check(f"{name}: fit", data["fit"], _key_nodes(node), _FIT, node)
    if data["fit"].get("overlap", OVERLAP_ACTIONS[0]) not in OVERLAP_ACTIONS:
        raise StudyError(f"{name}: fit.overlap must be {' or '.join(OVERLAP_ACTIONS)}, not "
                         f"{data['fit']['overlap']!r} ({_line(_key_nodes(node)['overlap'])})")
    if "maps" in data:
        raise StudyError(f"{name}: give maps or fit, not both ({_line(_key_nodes(root)['fit'])})")


def _read_arms(name: str, given: dict[str, Any], nodes: dict[str, yaml.Node]) -> dict[str, StudyArm]:
    """The declared arms (before budgets): each a mapping of model and args, with every field its method needs."""
    arms: dict[str, StudyArm] = {}
    folders: dict[str, str] = {}
    for arm_name, entry in given.items():
        where = f"{name}: arms.{arm_name}"
        _check_folder_name(where, str(arm_name), folders, nodes.get(arm_name))
        if not isinstance(entry, dict):
            raise StudyError(f"{where} must be a mapping (model, args) ({_line(nodes.get(arm_name))})")
        _check(where, entry, _key_nodes(nodes[arm_name]), _ARM, nodes[arm_name])
        model = entry.get("model", DEFAULT_MODEL)
        args = dict(entry.get("args") or {})
        if model not in MODELS and model in METHODS:  # else taken for another lm-eval model, run without the study's
            raise StudyError(f"{where}: model: {model} names an rf-eval method, not an lm-eval model; give "
                             f"model: prefill and args.method: {model} ({_line(nodes[arm_name])})")
        try:
            chosen = method_for_arm(model, args)
        except UserError as err:  # e.g. a preset beside a field it sets: named with the arm and its line
            raise StudyError(f"{where}: {err} ({_line(nodes[arm_name])})") from None
        missing = chosen[0].missing_fields(chosen[1]) if chosen else {}
        if missing:
            needs = " and ".join(f"args.{key} ({values})" for key, values in missing.items())
            raise StudyError(f"{where}: a {model} arm needs {needs} ({_line(nodes[arm_name])})")
        arms[str(arm_name)] = StudyArm(str(arm_name), model, args)
    if not arms:
        raise StudyError(f"{name}: arms is empty")
    return arms


def _check_folder_name(where: str, arm: str, folders: dict[str, str], node: yaml.Node | None) -> None:
    """An arm's name is its folder under the study's output (`rf_eval.study.runner.arm_folder`): one path
    component, and no two arms' names the same folder on a case-insensitive file system (macOS, Windows),
    so that no arm writes into another's results."""
    if not arm.strip() or arm.startswith(".") or any(c in arm for c in '/\\:*?"<>|') or not arm.isprintable():
        raise StudyError(f"{where}: the arm's name is its output folder, so it must be one folder name: no "
                         f"/ \\ : * ? \" < > |, no leading dot ({_line(node)}); rename it")
    other = folders.setdefault(arm.casefold(), arm)
    if other != arm:
        raise StudyError(f"{where}: arms {other!r} and {arm!r} would write one folder on a case-insensitive "
                         f"file system ({_line(node)}); rename one")


def _check_reference(name: str, reference: str, arms: dict[str, StudyArm], expanded: dict[str, list[str]],
                     node: yaml.Node) -> None:
    """The reference: a declared arm that the budgets leave as it is."""
    if reference in expanded:
        raise StudyError(f"{name}: reference {reference!r} is an arm the budgets expand ({', '.join(expanded[reference])}); "
                         "the reference is the arm every budget is a share of: give one a budget leaves as it is "
                         "(fill: exact)")
    if reference not in arms:
        raise StudyError(f"{name}: reference {reference!r} is not a declared arm ({_line(node)}); "
                         f"arms: {', '.join(arms)}")


def _check_controls(name: str, controls: dict[str, Any], arms: dict[str, StudyArm], expanded: dict[str, list[str]],
                    node: yaml.Node | None) -> None:
    """Each control names declared arms that the budgets leave as they are."""
    for selected, pair in controls.items():
        named = [selected, *(pair if isinstance(pair, list) else [pair])]
        split = [a for a in named if a in expanded]
        if split:
            raise StudyError(f"{name}: controls.{selected} names {split[0]!r}, which the budgets expand into "
                             f"{', '.join(expanded[split[0]])}; name arms a budget leaves as they are")
        missing = [a for a in named if a not in arms]
        if missing:
            raise StudyError(f"{name}: controls.{selected} names no declared arm {missing[0]!r} "
                             f"({_line(_value_nodes(node).get(selected))}); arms: {', '.join(arms)}")


def _check_claims(name: str, claims: list[Any], nodes: list[yaml.Node]) -> None:
    """Each claim: a mapping of claim and prediction."""
    for i, claim in enumerate(claims):
        if not isinstance(claim, dict):
            raise StudyError(f"{name}: claims[{i}] must be a mapping (claim, prediction) ({_line(nodes[i])})")
        _check(f"{name}: claims[{i}]", claim, _key_nodes(nodes[i]), _CLAIM, nodes[i])


def _check_sizes(name: str, data: dict[str, Any], values: dict[str, yaml.Node]) -> tuple[int, ...]:
    """The study's lengths (positive token counts), and a positive limit or samples, not both."""
    if data.get("limit") is not None and data.get("samples") is not None:
        raise StudyError(f"{name}: give limit or samples, not both (lm-eval cannot combine them)")
    lengths = tuple(data.get("lengths") or ())
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or n <= 0]
    if bad:
        raise StudyError(f"{name}: lengths holds {bad[0]!r}, not a positive number of tokens "
                         f"({_line(values['lengths'])}); e.g. lengths: [4096, 8192]")
    if data.get("limit") is not None and (isinstance(data["limit"], bool) or data["limit"] <= 0):
        raise StudyError(f"{name}: limit must be a positive number of samples per task, not {data['limit']!r} "
                         f"({_line(values['limit'])}); leave it out to run every sample")
    return lengths


def _budgets(name: str, values: list | None, node: yaml.Node | None) -> tuple[float, ...]:
    """The study's budgets: numbers in (0, 1], each once."""
    if values is None:
        return ()
    if not values:
        raise StudyError(f"{name}: budgets is empty ({_line(node)}); give shares of exact's MACs, e.g. [0.5, 0.7]")
    out = []
    for value in values:
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArmError(f"budget={value!r} is not a share of exact prefill's MACs; give 0 < budget <= 1")
            check_budget(value)
        except ArmError as err:
            raise StudyError(f"{name}: budgets: {err} ({_line(node)})") from None
        if float(value) in out:
            raise StudyError(f"{name}: budgets: {value!r} is given twice ({_line(node)})")
        out.append(float(value))
    return tuple(out)


def takes_budget(arm: StudyArm) -> bool:
    """Whether an arm's settings take a budget: an rf-eval arm without one of its own whose method's arm,
    the fields the budget sets instead left out (`Method.budget_sets`), has no reason to refuse one
    (`Method.budget_refusal`: a fill that turns its tail, a selector that counts rows, RaReCache's recomputed
    rows, a dropper's kept rows, ...)."""
    chosen = method_for_arm(arm.model, arm.args) if "budget" not in arm.args else None
    if chosen is None:
        return False
    method, args = chosen
    fields = {k: v for k, v in args.items() if k in method.arm_fields() and k not in method.budget_sets}
    try:
        parsed = method.parse_arm(fields, what="args")
    except UserError as err:
        raise StudyError(f"arms.{arm.name}: {err}") from None
    return method.budget_refusal(parsed) is None


def expand_budgets(arms: dict[str, StudyArm], budgets: tuple[float, ...]) -> tuple[dict[str, StudyArm], dict[str, list[str]]]:
    """(the arms with each one that takes a budget replaced by one arm per budget, `<arm>@<budget>`, in the
    file's order; which arms were replaced by which)."""
    if not budgets:
        return arms, {}
    out: dict[str, StudyArm] = {}
    expanded: dict[str, list[str]] = {}
    for arm in arms.values():
        if not takes_budget(arm):
            out[arm.name] = arm
            continue
        replaced = method_for_arm(arm.model, arm.args)[0].budget_sets  # takes_budget found the method
        args = {k: v for k, v in arm.args.items() if k not in replaced}
        for budget in budgets:
            name = budget_name(arm.name, budget)
            if name in arms or name in out:
                raise StudyError(f"the budgets name an arm {name!r} (arm {arm.name!r} at budget {budget:g}), and an "
                                 "arm of that name is declared already; rename it")
            out[name] = StudyArm(name, arm.model, {**args, "budget": budget})
            expanded.setdefault(arm.name, []).append(name)
    return out, expanded


def _resolve(study_file: Path, value: str) -> str:
    """A path relative to the study file's folder, when it names something there; else as given (hub ids)."""
    candidate = (study_file.parent / value)
    return str(candidate.resolve()) if candidate.exists() else value
