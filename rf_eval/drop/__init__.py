"""Token-dropping prefill methods (RidgeFill paper Table 1, section 7: a skipped token leaves no cache entry).

Each method is one file here, one `rf_eval.methods.base.Method` subclass found
by its entry point (`rf_eval.methods`): GemFilter and Speculative Prefill
subclass `rf_eval.drop.base.Dropper` (their arms extend its `DropperArm`: how
many rows a prompt keeps); FastKV's token-selective propagation keeps every
row below its layer and runs in RidgeFill's engine (`rf_eval.drop.fastkv`,
`preset=fastkv`). What a dropper's prefill leaves and how decoding reads it is
`rf_eval.methods.dropped`. `--model drop` runs GemFilter unless `method=` names
another.
"""
