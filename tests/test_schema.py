"""The result schema documented in one place: every column of ``results.COLUMNS`` described (unit and meaning), and
docs/schema.md equal to what ``splitlab schema --markdown`` prints (so the page cannot drift from the code)."""

import json
from pathlib import Path

from splitlab import results
from splitlab.cli import main

SCHEMA_MD = Path(__file__).resolve().parents[1] / "docs" / "schema.md"


def test_every_column_has_a_description_and_nothing_else_does():
    assert list(results.DESCRIPTIONS) == list(results.COLUMNS)  # the same columns, in the same order
    for column, (unit, meaning) in results.DESCRIPTIONS.items():
        assert isinstance(unit, str) and len(meaning.strip()) >= 10, column
        assert "\n" not in meaning and "<NA>" not in meaning.replace("`<NA>`", ""), column  # one Markdown cell


def test_docs_schema_md_is_what_splitlab_schema_markdown_prints(capsys):
    assert main(["schema", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert SCHEMA_MD.read_text(encoding="utf-8") == printed, "regenerate: splitlab schema --markdown > docs/schema.md"
    rows = [line for line in printed.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(results.COLUMNS)


def test_schema_table_and_json_name_every_column(capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{c} " in out for c in results.COLUMNS)
    assert main(["schema", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["column"] for r in rows] == list(results.COLUMNS)
    assert {r["column"] for r in rows if r["required"]} == set(results.REQUIRED)
    assert next(r for r in rows if r["column"] == "p50_us")["unit"] == "us"


def test_the_readme_points_at_the_schema():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "(docs/schema.md)" in readme and "splitlab schema" in readme
