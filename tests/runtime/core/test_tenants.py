"""The tenants table: validation, re-reading, who a request is for, quotas, priorities."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_runtime.core.cache import cache_key
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.errors import Forbidden, InvalidInput, TenantOverQuota
from fleetserve_runtime.core.fair_share import DEFAULT_TENANT
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.tenants import (
    MAX_TENANTS,
    TenantLoad,
    TenantsFile,
    TenantTable,
    default_tenant,
    identify,
)
from fleetserve_runtime.serving.admission import scheduling

TOKEN_A = "tenant-a-secret-0123456789"
TOKEN_B = "tenant-b-secret-0123456789"
DEFAULT = default_tenant(weight=1.0, max_requests=None)


def row(name: str, *tokens: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "tokens": list(tokens), **extra}


def table_file(tmp_path: Path, *rows: dict[str, Any]) -> Path:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": list(rows)}))
    return path


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        pytest.param([row("Bad_Name", TOKEN_A)], "name", id="name-not-a-dns-label"),
        pytest.param([row("a", "short")], "tokens", id="short-token"),
        pytest.param([row("a")], "tokens", id="no-token"),
        pytest.param([row("a", TOKEN_A, weight=0)], "weight", id="zero-weight"),
        pytest.param([row("a", TOKEN_A, max_requests=0)], "max_requests", id="zero-quota"),
        pytest.param([row("a", TOKEN_A, priorities=["urgent"])], "priorities", id="priority"),
        pytest.param([row("a", TOKEN_A, priorities=[])], "priorities", id="no-priority"),
        pytest.param([row("a", TOKEN_A), row("a", TOKEN_B)], "unique", id="same-name"),
        pytest.param([row("a", TOKEN_A), row("b", TOKEN_A)], "one tenant", id="same-token"),
        pytest.param([row("a", TOKEN_A, colour="red")], "colour", id="unknown-field"),
        pytest.param(
            [row(f"t{n}", f"{n:04d}-secret-0123456789") for n in range(MAX_TENANTS + 1)],
            "tenants",
            id="too-many",
        ),
    ],
)
def test_a_bad_table_is_refused_naming_the_field(rows: list[Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        TenantTable.model_validate({"tenants": rows})


def test_the_config_reads_the_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    good = table_file(tmp_path, row("a", TOKEN_A))
    assert RuntimeConfig(tenants={"file": good}).tenants.file == good
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [{name: a, tokens: [short]}]")
    with pytest.raises(ValidationError, match="tenants file"):
        RuntimeConfig(tenants={"file": bad})
    with pytest.raises(ValidationError, match="need tenants.file"):
        RuntimeConfig(tenants={"trust_header": True})


def test_a_token_names_its_tenant_and_anything_else_the_default(tmp_path: Path) -> None:
    table = TenantsFile(table_file(tmp_path, row("a", TOKEN_A), row("b", "x" * 20, TOKEN_B)))

    def who(token: str | None) -> str:
        presented = None if token is None else token.encode()
        return identify(
            table, presented=presented, header=None, trust_header=False, default=DEFAULT
        ).name

    assert who(TOKEN_A) == "a"
    assert who(TOKEN_B) == "b"
    assert who(TOKEN_A[:-1]) == DEFAULT_TENANT
    assert who(None) == DEFAULT_TENANT
    assert table.knows(TOKEN_B.encode())
    assert not table.knows(b"tenant-b-secret-012345678X")


def test_the_tenant_header_is_refused_unless_trusted(tmp_path: Path) -> None:
    table = TenantsFile(table_file(tmp_path, row("a", TOKEN_A)))
    with pytest.raises(InvalidInput, match="x-fleetserve-tenant") as refused:
        identify(table, presented=TOKEN_A.encode(), header="a", trust_header=False, default=DEFAULT)
    assert refused.value.param == "x-fleetserve-tenant"
    trusted = identify(table, presented=None, header="a", trust_header=True, default=DEFAULT)
    assert trusted.name == "a"
    with pytest.raises(InvalidInput, match="names no tenant"):
        identify(table, presented=None, header="zz", trust_header=True, default=DEFAULT)


def test_a_changed_file_is_read_again_and_a_broken_one_fails_closed(tmp_path: Path) -> None:
    path = table_file(tmp_path, row("a", TOKEN_A))
    table = TenantsFile(path)
    assert table.knows(TOKEN_A.encode())
    (tmp_path / "next").mkdir()
    replacement = table_file(tmp_path / "next", row("b", TOKEN_B))
    os.replace(replacement, path)
    assert not table.knows(TOKEN_A.encode())
    assert table.knows(TOKEN_B.encode())
    path.write_text("{not yaml: [")
    assert not table.knows(TOKEN_B.encode())
    path.unlink()
    assert not table.knows(TOKEN_B.encode())


def test_a_tenant_at_its_quota_is_refused_and_others_are_not(tmp_path: Path) -> None:
    table = TenantsFile(table_file(tmp_path, row("a", TOKEN_A, max_requests=2), row("b", TOKEN_B)))
    a, b = (table.current().by_name[name] for name in ("a", "b"))
    load = TenantLoad(retry_after_s=3)
    load.enter(a)
    load.enter(a)
    with pytest.raises(TenantOverQuota) as refused:
        load.enter(a)
    assert refused.value.retry_after_s == 3
    assert refused.value.tenant == "a"
    for _ in range(10):
        load.enter(b)
    load.leave(a)
    load.enter(a)
    assert load.in_flight("a") == 2


def test_a_tenant_may_ask_only_for_its_allowed_priorities(tmp_path: Path) -> None:
    table = TenantsFile(
        table_file(tmp_path, row("gold", TOKEN_A, priorities=["high"]), row("bronze", TOKEN_B))
    )
    gold, bronze = (table.current().by_name[name] for name in ("gold", "bronze"))

    def ask(priority: str | None, tenant: Any, *, privileged: bool = False) -> Priority:
        return scheduling(
            priority_header=None,
            timeout_header=None,
            priority=priority,
            timeout_ms=None,
            default_timeout_ms=1000,
            privileged=privileged,
            tenant=tenant,
        ).priority

    assert ask("high", gold) == Priority.HIGH
    assert ask(None, gold) == Priority.HIGH  # normal is not among its classes
    with pytest.raises(Forbidden, match=r"parameters.priority normal is not allowed.*gold"):
        ask("normal", gold)
    assert ask(None, bronze) == Priority.NORMAL
    with pytest.raises(Forbidden, match="parameters.priority high"):
        ask("high", bronze)
    assert ask("high", bronze, privileged=True) == Priority.HIGH


def test_the_result_cache_key_is_the_tenants_own() -> None:
    def key(tenant: str | None) -> bytes:
        return cache_key(model="m", version="1", instance="hi", params={}, tenant=tenant)

    assert key("a") != key("b")
    assert key("a") != key(None)
    assert key(None) == cache_key(model="m", version="1", instance="hi", params={})
