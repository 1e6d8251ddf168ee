"""Token-dropping prefill methods (RidgeFill paper Table 1, section 7: a skipped token leaves no cache entry).

Each method is one module here defining one `DropMethod` subclass whose
`name` is its `method=` value; the method registry (`rf_eval.methods`: its
`gemfilter` and `specprefill` declarations) finds and builds it, importing it
only when first asked for (`rf_eval.dropped_result`, which the shells read,
imports none of them). An arm is a `DropArm` (`rf_eval.drop.arm_spec`) and
the lm-eval model is `--model drop` (`rf_eval.model_adapters.drop`). What the
methods share is `rf_eval.drop.base`; what their prefill leaves and how
decoding reads it, `rf_eval.dropped_result`. FastKV's token-selective
propagation keeps every row below its layer and is an arm of RidgeFill's
engine (`preset=fastkv`, `rf_eval.selectors.tsp`).
"""
