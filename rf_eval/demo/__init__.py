"""The embedded demo: `model` (the small real model, converted once), `corpus` (calibration and held-out
text from the standard library's docstrings), `study` (the demo's arms, their run and report)."""
