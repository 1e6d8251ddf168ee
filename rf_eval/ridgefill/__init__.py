"""RidgeFill (the method): `api` (RidgeFill), `arm_spec` (RidgeFillArm), `arm` (its parts wired into the
engine), `fitting` / `capture` / `ridge` (the maps' fit), `maps`, `corrections`, `state_correction`,
`unigram`, `calibration`, `cost` (the MAC model of paper section 2.5)."""
