"""A registered study in one command: the study file (`spec`), its run and resume (`runner`), and where
arms run (`launch`: local, accelerate, Slurm through submitit). Shell: `rf-eval study` (rf_eval/cli/study.py)."""
