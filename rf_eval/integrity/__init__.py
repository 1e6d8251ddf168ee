"""What makes results trustworthy: the weights' fingerprints, the seals on per-item results, the
loading report (no tensor silently missing), the overlap check of calibration against evaluation text,
and the hashes they share."""
