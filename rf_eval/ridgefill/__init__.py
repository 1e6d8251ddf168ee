"""RidgeFill (the method): `api` (RidgeFill), `arm_spec` (RidgeFillArm), `arm` (its parts wired into the
engine), `arm_cost` and `presets`, `corrections` (late-layer corrections), `fitting` / `fit_run` (fitting the
maps a fill serves), `release_maps` (the paper's released projectors as map files). The ridge algebra it
shares with the fills and RaReCache (sums, solves, lambda choice, map files) is `rf_eval.ridge`; the MAC
model of paper section 2.5 is `rf_eval.cost.mac_model`."""
