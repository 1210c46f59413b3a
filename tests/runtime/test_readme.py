"""The runtime reference pages (configuration, metrics) stay true to the code."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_runtime.cli import config_flags
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import make_config

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
CONFIGURATION = (REFERENCE / "runtime-configuration.md").read_text()
METRICS = (REFERENCE / "metrics.md").read_text()


def test_config_table_lists_every_option_with_flag_and_env() -> None:
    """Each config field appears with its flag, env variable and default."""
    for flag in config_flags():
        where = f"{flag.section}.{flag.field}" if flag.section else flag.field
        env = "_".join(p.upper() for p in ("FLEETSERVE", flag.section, flag.field) if p)
        default = repr(flag.info.default).replace("'", '"')
        row = f"| `{where}` | `{flag.flag}` | `{env}` | `{default}` |"
        assert row in CONFIGURATION, row


def test_metrics_table_names_every_metric() -> None:
    """Every metric family the runtime exports is documented."""

    async def exported() -> set[str]:
        runtime = Runtime(make_config())
        try:
            text = generate_latest(runtime.metrics.registry).decode()
        finally:
            await runtime.stop()
        return {family.name for family in text_string_to_metric_families(text)}

    for name in asyncio.run(exported()):
        assert f"`{name}" in METRICS, name
