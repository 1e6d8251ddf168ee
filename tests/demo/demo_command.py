"""The README's first command's demo part, defined once: tests/demo/test_demo.py runs it end to end (as
`python -m rf_eval demo --quick`, the same entry point) and tests/test_readme.py checks that the README's
"Two commands" block ends in it."""

#: `rf-eval demo --quick`, as argv
QUICK_DEMO = ["rf-eval", "demo", "--quick"]
