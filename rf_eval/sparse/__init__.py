"""Sparse-attention prefill, the third family (DESIGN section 3): every row keeps its cache entry and every
layer runs, but in the prompt's prefill each query block attends to a chosen set of key blocks.

`blocks` (patterns, their density and FlexAttention masks), `attention` (the block-sparse attention hooked
in through `transformers`' attention interface), `method` (the prefill protocol every sparse method shares)
and one file per method: `flexprefill`, `xattention`, and `sinkwindow` (the fixed-pattern control).
"""
