"""`rf-eval study run | plan | status`: a registered study, one lm-eval evaluation per arm, resumable.

Run (paper section 9's order): the claims are registered in the ledger before
any arm runs (refused once results exist, unless `--follow-up`), with the
study file's sha256; then each arm is one `lm_eval` process (one model load,
`--log_samples`, its own `--use_cache` database) through a launcher; then the
report (`--launcher slurm` submits the same steps as dependent jobs:
`rf_eval.study.slurm`). A killed study re-run skips every arm whose `done.json` fingerprint
(model, maps sha256, arm, tasks, lengths, lm-eval version) matches, resumes a
half-finished arm from its request cache, and refuses a folder written by
another version of the study file. `study.json` records every arm's command,
timings and fingerprint (`rf_eval.study.state`).

Key tokens (RidgeFill section 3.2, RaReCache section 4.7) are decided once,
from the reference arm, and shared by every arm: when the study's tasks
include `keytoken_nll` (and its metadata names no `key_reference` of its
own), the reference arm runs first, on every launcher, and every other arm
gets `key_reference` = the reference arm's keytoken_nll samples file. That
file's sha256 is part of the other arms' fingerprints, so a changed
reference result re-runs its dependants.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.integrity.hashing import file_sha256, named_files_sha256
from rf_eval.methods import METHODS, method_for_arm
from rf_eval.reports.build import ReportOptions, build_report
from rf_eval.reports.build import report_argv as build_report_argv
from rf_eval.ridgefill.fit_run import fit_map_files, fit_summary
from rf_eval.stats.ledger import append_entry, verify_ledger
from rf_eval.study.jobs import ArmJob, Progress
from rf_eval.study.overlap import WARN, check_before_fit, load_tokenizer
from rf_eval.study.spec import ADAPTERS, Study, StudyArm, StudyError
from rf_eval.study.state import check_folder, done_marker, is_done, save_state

KEY_TASK = "keytoken_nll"  # the task whose key tokens come from the reference arm
KEY_REFERENCE_PLACEHOLDER = "<the reference arm's keytoken_nll samples file>"


def maps_sha256(folder: str | None) -> str:
    """sha256 over the map files of a maps folder (or one file), for fingerprints."""
    if folder is None:
        return ""
    path = Path(folder)
    return named_files_sha256(sorted(path.glob("*.safetensors")) if path.is_dir() else [path])


def model_args(study: Study, arm: StudyArm, maps: str | None) -> dict[str, Any]:
    """The arm's model_args: the study's model, then the arm's own (the study's maps for an arm whose method
    reads them: `Method.reads_study_maps`), and the arm's name in the study (`name`, which the report names
    it by: `rf_eval.stats.arms`)."""
    if arm.model in ADAPTERS:
        args = _inherited({"pretrained": study.pretrained, **study.model_args, **arm.args}, arm)
        chosen = method_for_arm(arm.model, args)
        if chosen is not None and chosen[0].reads_study_maps(chosen[1]) and "maps" not in args and maps:
            args["maps"] = maps
        return {**args, "name": args.get("name", arm.name)}
    return dict(arm.args)  # an API model: its own arguments only


def _inherited(args: dict[str, Any], arm: StudyArm) -> dict[str, Any]:
    """`args` without the study-wide `model.args` that are another method's arm fields and not this arm's
    method's: a default for the fills' tail does not reach a `preset=fastkv` arm (its preset sets the tail) nor
    a dropper. The arm's own keys are kept as given, and checked as given."""
    fields = {k for method in METHODS.values() for k in method.arm_fields()}
    chosen = method_for_arm(arm.model, {k: v for k, v in args.items() if k in arm.args or k not in fields})
    mine = set(chosen[0].arm_fields()) if chosen is not None else fields
    return {k: v for k, v in args.items() if k in arm.args or k not in fields or k in mine}


def shares_key_tokens(study: Study) -> bool:
    """Whether the study's arms take their key tokens from the reference arm (see the module docstring)."""
    return KEY_TASK in study.tasks and "key_reference" not in study.metadata


def dependants(study: Study) -> list[str]:
    """The arms that wait for the reference arm (all others when key tokens are shared; else none)."""
    return [a for a in study.arms if a != study.reference] if shares_key_tokens(study) else []


def reference_samples(study: Study, out: Path) -> Path:
    """The finished reference arm's keytoken_nll samples file (its latest run)."""
    folder = arm_folder(study, out, study.reference)
    found = sorted(folder.rglob(f"samples_{KEY_TASK}_*.jsonl"))
    if not found:
        raise StudyError(f"the reference arm {study.reference!r} wrote no {KEY_TASK} samples under {folder}; "
                         "the other arms take their key tokens from it")
    return found[-1]


def arm_folder(study: Study, out: Path, arm: str) -> Path:
    return out / study.arms_folder / arm


def task_metadata(study: Study) -> dict[str, Any]:
    """The `--metadata` every arm's tasks get: the study's, with its `lengths` as `max_seq_lengths`."""
    metadata = dict(study.metadata)
    if study.lengths:
        metadata["max_seq_lengths"] = list(study.lengths)
    return metadata


def lm_eval_command(study: Study, arm: StudyArm, out: Path, maps: str | None, key_reference: str | None = None
                    ) -> list[str]:
    """The arm's `lm_eval` argv (without a launcher prefix); `key_reference` for an arm that shares the
    reference arm's key tokens."""
    metadata = task_metadata(study)
    if key_reference is not None:
        metadata["key_reference"] = key_reference
    cmd = ["-m", "lm_eval", "--model", arm.model, "--model_args", json.dumps(model_args(study, arm, maps)),
           "--tasks", ",".join(study.tasks), "--output_path", str(arm_folder(study, out, arm.name)), "--log_samples",
           "--use_cache", str(out / "cache" / arm.name), "--seed", str(study.seed)]
    if metadata:
        cmd += ["--metadata", json.dumps(metadata)]
    if study.include_path:
        cmd += ["--include_path", study.include_path]
    if study.limit is not None:
        cmd += ["--limit", str(study.limit)]
    if study.samples is not None:
        cmd += ["--samples", json.dumps(study.samples)]
    if study.apply_chat_template:
        cmd.append("--apply_chat_template")
    return cmd


def fingerprint(study: Study, arm: StudyArm, maps: str | None, key_reference: str | None = None) -> str:
    """What makes an arm's results what they are; a finished arm is skipped only when it matches. An arm
    that reads the reference's key tokens includes that samples file's sha256."""
    import lm_eval

    shared = file_sha256(key_reference) if key_reference else ""
    record = {"key_reference_sha256": shared, "model": study.pretrained, "model_args": study.model_args, "maps_sha256": maps_sha256(maps),
              "arm": {"model": arm.model, "args": arm.args}, "tasks": list(study.tasks), "lengths": list(study.lengths),
              "metadata": study.metadata, "limit": study.limit, "samples": study.samples,
              "chat": study.apply_chat_template, "seed": study.seed, "lm_eval": lm_eval.__version__}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def register(study: Study, out: Path, state: dict[str, Any], ledger: Path, follow_up: bool) -> None:
    """Register the study's claims before any arm runs (once; a resumed run finds them registered)."""
    if state.get("registered"):
        return
    results = [a for a in study.arms if done_marker(out, a, study.arms_folder).is_file()]
    if results and not follow_up:
        raise StudyError(f"arms {', '.join(results)} already have results in {out}: claims registered now "
                         "would not be pre-registered. Pass --follow-up to register them as follow-up claims")
    entries = []
    for claim in study.claims:
        entry = append_entry(ledger, claim=claim["claim"], prediction=claim["prediction"], configs=[study.path],
                             arms=list(study.arms))
        entries.append({"index": entry.index, "hash": entry.hash, "time": entry.time.isoformat()})
    head = verify_ledger(ledger)[-1] if ledger.is_file() else None
    state.update(registered=True, follow_up=bool(results), ledger=str(ledger), claims=entries,
                 ledger_head={"hash": head.hash, "count": head.index + 1} if head else None)
    save_state(out, state)


def maps_location(study: Study, out: Path) -> str | None:
    """Where the study's maps are (or will be, once its `fit:` block has run): its `maps`, or OUT/maps."""
    return study.maps if study.fit is None else str(out / "maps")


def _fit_fingerprint(study: Study) -> str:
    """What the `fit:` block's maps are made of: the model, the block, and the sha256 of every file it reads,
    so an edited calibration or held-out file refits (and, through `maps_sha256`, reruns the arms that read
    the maps) instead of reusing maps fitted on the old text."""
    options = study.fit_options()
    inputs = {path: file_sha256(path) if Path(path).is_file() else "missing"
              for path in [*options.get("calibration", []), *options.get("heldout", [])]}
    return hashlib.sha256(json.dumps([study.pretrained, study.model_args, study.fit, inputs], sort_keys=True,
                                     default=str).encode()).hexdigest()


def maps_ready(study: Study, out: Path) -> bool:
    """Whether the maps exist: given by the study, or fitted into OUT/maps by this `fit:` block."""
    if study.fit is None:
        return True
    marker = out / "maps" / "fit.json"
    return marker.is_file() and json.loads(marker.read_text()).get("fit") == _fit_fingerprint(study)


def fit_maps_once(study: Study, out: Path) -> str | None:
    """The study's maps: its `maps`, or those its `fit:` block fits into OUT/maps (once: a re-run reuses them).
    Before a fit, when the study names `docs`, the calibration and held-out files are checked against them
    (`rf_eval.study.overlap.check_before_fit`: OUT/overlap.json, summarised in OUT/maps/fit.json); overlap warns,
    or stops the study with `fit: {overlap: refuse}`."""
    if maps_ready(study, out):
        return maps_location(study, out)
    folder = out / "maps"
    marker = folder / "fit.json"
    want = _fit_fingerprint(study)
    # a refit (its inputs changed since the maps there were fitted) replaces them: same file names
    given: dict[str, Any] = dict(study.fit_options(), overwrite=folder.is_dir() and any(folder.iterdir()))
    overlap = None
    if study.metadata.get("docs"):  # calibration vs the evaluated documents first (RidgeFill Appendix G)
        try:  # by words, and by the study model's tokens (Appendix G's first check)
            overlap = check_before_fit([*given["calibration"], *given["heldout"]], study.metadata["docs"],
                                       out / "overlap.json", study.fit.get("overlap", WARN),
                                       tokenizer=load_tokenizer(str(given["model"])))
        except UserError as err:
            raise StudyError(f"the study's overlap check, before its fit: {err}") from None
    print(f"[fit] maps for split {study.fit['split']} into {folder}", flush=True)
    try:
        result = fit_map_files(folder, **given)
    except UserError as err:
        raise StudyError(f"the study's fit: block failed: {err}") from None
    for line in fit_summary(result):
        print(line)
    marker.write_text(json.dumps({"fit": want, "overlap": overlap}))
    return str(folder)


def report_options(study: Study, out: Path, ledger: Path) -> ReportOptions:
    """The report's options over every arm's folder. No `metrics`: the report reads each task by its default
    measures (`rf_eval.stats.measures`: keytoken_nll's key- and novel-token ΔNLL, gap and KL; acc_filled)."""
    return ReportOptions(
        runs=[str(arm_folder(study, out, a)) for a in study.arms], reference=study.reference,
        margin=float(study.margin), html=str(out / "report.html"), latex=str(out / "report.tex"),
        markdown=str(out / "report.md"), json_path=str(out / "report.json"),
        ledger=str(ledger) if ledger.is_file() else None,
        controls={selected: list(controls) for selected, controls in study.controls.items()})


def report_argv(study: Study, out: Path, ledger: Path) -> list[str]:
    """The `rf-eval report` command line of `report_options` (what the study prints as the command it ran)."""
    return build_report_argv(report_options(study, out, ledger))


def write_report(study: Study, out: Path, ledger: Path) -> int:
    """The report over the study's arms (`build_report` with `report_options`); 2 with the error printed
    when the runs cannot be reported, as `rf-eval report` does."""
    print("[report] " + shlex.join(["rf-eval", *report_argv(study, out, ledger)]), flush=True)
    try:
        report = build_report(report_options(study, out, ledger))
    except UserError as err:
        print(f"rf-eval report: error: {err}", file=sys.stderr, flush=True)
        return 2
    for line in report.lines:
        print(line)
    return 0


def arm_job(study: Study, out: Path, launcher: Any, maps: str | None, name: str) -> Any:
    """The arm's job: its command (launcher prefix included) and fingerprint, with `key_reference` = the
    reference's samples file for an arm that reads its key tokens (a StudyError while it has none)."""

    arm = study.arms[name]
    key_reference = str(reference_samples(study, out)) if name in dependants(study) else None
    want = fingerprint(study, arm, maps, key_reference)
    argv = launcher.argv(lm_eval_command(study, arm, out, maps, key_reference))
    return ArmJob(name, tuple(argv), str(out), want, str(done_marker(out, name, study.arms_folder)))


def arm_finished(study: Study, out: Path, launcher: Any, name: str) -> bool:
    """Whether the arm is done with the fingerprint it would have now (False while its inputs are missing)."""
    if not maps_ready(study, out):
        return False
    try:
        job = arm_job(study, out, launcher, maps_location(study, out), name)
    except StudyError:
        return False  # the reference has no samples yet
    return is_done(out, name, job.fingerprint, study.arms_folder)


def _jobs(study: Study, out: Path, launcher: Any, maps: str | None, names: list[str], state: dict[str, Any],
          progress: Any) -> list[Any]:
    """The jobs of the arms `names` not yet done (their command and fingerprint recorded in `state`)."""
    jobs = []
    for name in names:
        job = arm_job(study, out, launcher, maps, name)
        state["arms"][name] = {**state["arms"].get(name, {}), "command": list(job.argv), "fingerprint": job.fingerprint}
        if is_done(out, name, job.fingerprint, study.arms_folder):
            progress.done += 1
            print(f"      {name}: done before (fingerprint matches), skipped", flush=True)
            continue
        state["arms"][name]["status"] = "pending"
        jobs.append(job)
    save_state(out, state)
    return jobs


def arm_stages(study: Study) -> list[list[str]]:
    """The arms in the order they may run: the reference alone first when the others read its key tokens."""
    waiting = dependants(study)
    return [[study.reference], waiting] if waiting else [list(study.arms)]


def finish_study(study: Study, out: Path, ledger: Path, report: bool = True) -> int:
    """Every arm done: fold their `done.json` records into study.json, then write the report."""
    state = check_folder(study, out)
    for arm in study.arms:
        record = json.loads(done_marker(out, arm, study.arms_folder).read_text())
        state["arms"].setdefault(arm, {}).update(
            status="done", seconds=record["seconds"], finished=record["finished"],
            **{k: record[k] for k in ("command", "fingerprint") if k in record})
    save_state(out, state)
    if not report:
        return 0
    return write_report(study, out, ledger)


def run_study(study: Study, out: Path, launcher: Any, *, ledger: Path | None = None, follow_up: bool = False,
              report: bool = True) -> int:
    """Register, run every arm not yet done (resuming a half-finished one), report; see the module docstring.
    A launcher that `submits_study` (Slurm) gets the registered study and runs it as dependent jobs."""

    out.mkdir(parents=True, exist_ok=True)
    state = check_folder(study, out)
    for name in study.arms:  # study.json lists the arms in the study file's order
        state["arms"].setdefault(name, {})
    save_state(out, state)
    ledger = ledger or out / "ledger.jsonl"
    register(study, out, state, ledger, follow_up)
    if getattr(launcher, "submits_study", False):
        return launcher.submit_study(study, out, ledger=ledger, report=report)
    maps = fit_maps_once(study, out)
    progress = Progress(out, len(study.arms), 0)
    t0 = time.time()
    stages = arm_stages(study)
    for i, names in enumerate(stages):
        jobs = _jobs(study, out, launcher, maps, names, state, progress)
        note = f"; {study.reference} first (the others read its {KEY_TASK} key tokens)" if len(stages) > 1 and i == 0 else ""
        print(f"[arms] {len(jobs)} to run, {progress.done} done; launcher {type(launcher).__name__}{note}", flush=True)
        launcher.run(jobs, progress)
    state["seconds"] = time.time() - t0
    save_state(out, state)
    return finish_study(study, out, ledger, report)
