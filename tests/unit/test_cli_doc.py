"""docs/cli.md is generated from the CLI's own parser: it lists exactly the flags there are."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_cli_doc.py"


def test_the_cli_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_cli_doc", SCRIPT)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.OUT.read_text() == gen.render(), "docs/cli.md is out of date: run python scripts/gen_cli_doc.py"
