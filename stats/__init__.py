"""rf_eval subpackage (installed from the top-level folder of the same name)."""
