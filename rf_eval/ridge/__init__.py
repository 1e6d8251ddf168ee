"""The ridge algebra every method that predicts rows shares (RidgeFill paper section 2.2).

RidgeFill's fills (`rf_eval.fills`: ridge, kv_ridge, identity), RaReCache's
transfer maps (`rf_eval.rarecache`) and the map fit (`rf_eval.ridgefill.fitting`)
import it; it imports none of them:

- `sums`: streaming centred sums, their solves for a lambda, the paper's lambda grid;
- `lambdas`: the lambda chosen on held-out documents;
- `capture`: one pass over calibration documents into the sums, held-out cosines;
- `targets`: what a late layer's rows are regressed on (its input, or its keys and values);
- `maps`: map files (save, load, checks, int8 storage);
- `calibration`: calibration documents (read, check, tokenize this rank's share);
- `fit_memory`: where the sums live and how many lambdas a held-out pass scores at once;
- `unigram`: the calibration text's token counts, saved beside the maps;
- `state_correction`: the terminal-state correction's fitted table (paper appendix H).
"""
