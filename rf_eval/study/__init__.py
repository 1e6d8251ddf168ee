"""A registered study in one command: the study file (`study_file`, read into `spec`), its run (`runner`) and
resumable state (`state`), where arms run (`launch`: local, accelerate; `slurm`: Slurm through submitit), and
the calibration-text overlap check before a fit (`overlap`, its run search `word_runs`). Shell: `rf-eval study`
(rf_eval/cli/study.py)."""
