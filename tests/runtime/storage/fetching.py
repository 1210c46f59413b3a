"""A fetch as the tests run it: its result, or its failure with nothing installed."""

from __future__ import annotations

import pytest

from fleetserve_runtime.storage.fetch import Fetched, fetch
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import FetchFailed


def run_fetch(
    uri: str, options: FetchOptions, events: list[dict[str, object]] | None = None
) -> Fetched:
    """Fetch `uri`; its progress events go to `events` when given."""
    return fetch(uri, options, (events if events is not None else []).append)


def failed_fetch(uri: str, options: FetchOptions) -> FetchFailed:
    """The failure fetching `uri` ends in, after checking it installed nothing."""
    with pytest.raises(FetchFailed) as failed:
        run_fetch(uri, options)
    assert not (options.dest / "model").exists()
    assert not (options.dest / "model.json").exists()
    return failed.value
