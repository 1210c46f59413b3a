"""The types of the chart tests' fixtures (conftest.py), for the test modules' annotations.

Under `--import-mode=importlib` a test module imports neither conftest.py nor another test
module; it imports these from here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from fleetserve_operator.controller.settings import OperatorConfig

Manifest = dict[str, Any]
Helm = Callable[..., subprocess.CompletedProcess[str]]
"""`helm(command, *args, check=True)`."""
Render = Callable[..., list[Manifest]]
"""`render(*values, namespace=...)`."""
Only = Callable[..., Manifest]
"""`only(manifests, kind, name=None)`."""
ReadConfig = Callable[..., OperatorConfig]
"""`operator_config(container, downward=None)`."""
