"""The README's families table is `rf-eval families` over the registry, and what it claims is tested."""

from pathlib import Path

from rf_eval.cli import main
from rf_eval.cli.families import BEGIN, END, rows, table, with_table
from rf_eval.families import supported_model_types

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_current():
    readme = (ROOT / "README.md").read_text()
    assert with_table(readme) == readme, "run `rf-eval families --readme README.md`"
    assert readme.count(BEGIN) == readme.count(END) == 1
    assert len(rows()) == len(supported_model_types()) >= 12


def test_every_test_the_table_names_exists():
    """Each test module a row names is in tests/ (that the sliding-window test runs every family whose row names
    it is tests/families/test_families.py's own check)."""
    assert all(Path(ROOT, "tests", f"{name.split(' ')[0]}.py").exists()
               for row in rows() for name in row[-1].split(", "))


def test_the_command_prints_and_rewrites(tmp_path, capsys):
    assert main(["families"]) == 0
    assert capsys.readouterr().out == table()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nstale\n{END}\n\nafter\n")
    assert main(["families", "--readme", str(readme)]) == 0
    assert readme.read_text() == f"# x\n\n{BEGIN}\n{table()}{END}\n\nafter\n"


def test_the_command_prints_no_third_party_warning():
    """gpt_oss's default config makes transformers warn about its YaRN factor; the table's reader runs no
    model, so `rf-eval families` writes the table and nothing on stderr."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONWARNINGS="default")
    done = subprocess.run([sys.executable, "-m", "rf_eval", "families"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout == table()
    assert done.stderr == "", done.stderr
