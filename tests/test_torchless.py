"""The torchless plugin, under which `make unit` runs the operator tier, refuses torch.

Test files run under the plugin: one imports torch at its top (a collection error), one
catches the refusal inside a test (the test still fails, naming where), one never asks
(passes); and a conftest that catches the refusal stops the run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "test_imports_torch.py": "import torch\n\n\ndef test_never_runs():\n    pass\n",
    "test_catches.py": (
        "def test_catches_the_refusal():\n"
        "    try:\n"
        "        import torch.nn\n"
        "    except ImportError:\n"
        "        pass\n"
    ),
    "test_clean.py": "def test_clean():\n    assert True\n",
}


def run_under_plugin(folder: Path, files: dict[str, str]) -> tuple[int, str]:
    """Run pytest under the plugin on `files` written to `folder`: exit code and output."""
    for name, text in {**files, "pytest.ini": "[pytest]\n"}.items():
        (folder / name).write_text(text)
    result = subprocess.run(  # this interpreter, fixed arguments
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.torchless",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "-rA",
            "-c",
            str(folder / "pytest.ini"),
            str(folder),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def test_torch_is_refused_at_collection_and_in_a_test_that_catches_it(tmp_path: Path) -> None:
    code, output = run_under_plugin(tmp_path, FILES)
    outcomes = {
        # A summary line may end with " - <message>", depending on the terminal's width.
        (line.split()[0], line.split(" - ")[0].rsplit("/", 1)[-1])
        for line in output.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        ("ERROR", "test_imports_torch.py"),
        ("FAILED", "test_catches.py::test_catches_the_refusal"),
        ("PASSED", "test_clean.py::test_clean"),
    }, output
    assert "the operator tier must not import torch" in output, output
    assert "torch was imported from" in output, output
    assert "import torch.nn" in output, output
    assert code == 1, output


def test_a_conftest_that_catches_the_refusal_stops_the_run(tmp_path: Path) -> None:
    conftest = "try:\n    import torch\nexcept ImportError:\n    torch = None\n"
    code, output = run_under_plugin(
        tmp_path, {"conftest.py": conftest, "test_clean.py": FILES["test_clean.py"]}
    )
    assert "torch was imported from" in output, output
    assert "conftest.py" in output, output
    assert "no tests ran" in output, output
    assert code == 4, output
