"""One module per `rf-eval` subcommand (see rf_eval.cli.COMMANDS)."""
