"""The InferenceService reference page is the one generated from the spec models."""

from __future__ import annotations

from pathlib import Path

from fleetserve_operator.docgen import main, render_reference

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "inferenceservice.md"


def test_reference_page_is_current() -> None:
    """`docgen --check` on the reference page passes: run `make docs` after changing the spec."""
    assert main(["--check", str(REFERENCE)]) == 0


def test_reference_covers_nested_and_list_fields() -> None:
    """Nested objects and list items get their own rows, with defaults and limits."""
    table = render_reference()
    assert "| `spec.batching.maxBatchSize` |" in table
    assert "| `spec.runtime.tolerations[].key` |" in table
    assert "| `spec.rollout.steps` |" in table


def test_write_then_check(tmp_path: Path) -> None:
    """`--write` fills the markers, after which `--check` passes."""
    page = tmp_path / "inferenceservice.md"
    page.write_text(
        f"intro\n{render_reference().splitlines()[0]}\nold\n<!-- crd-reference:end -->\n"
    )
    assert main(["--check", str(page)]) == 1
    assert main(["--write", str(page)]) == 0
    assert main(["--check", str(page)]) == 0
    assert page.read_text().startswith("intro\n")
