"""The fetch benchmark's pure parts: the payload it serves, the digest it pins, its report.

The run itself needs the storage servers (`make bench-fetch`); `e2e/storage_e2e` proves the
fetch against them.
"""

from __future__ import annotations

import io
import re

from rich.console import Console

from bench.fetch_bench import Timing, listing_digest, model_dir, payload, report


def test_the_payload_is_the_shipped_sentence_transformers_directory() -> None:
    """MiniLM's real files, nested folder included: what a user's S3 prefix would hold."""
    files = payload(model_dir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json"} <= set(files)
    assert "1_Pooling/config.json" in files
    assert sum(len(data) for data in files.values()) > 80 * 10**6


def test_the_pinned_digest_depends_on_every_path_and_byte() -> None:
    """Renaming a file or changing a byte changes the digest the fetch is asked to match."""
    base = listing_digest({"a": b"x", "d/b": b"y"})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", base)
    assert listing_digest({"d/b": b"y", "a": b"x"}) == base
    assert listing_digest({"a": b"x", "d/c": b"y"}) != base
    assert listing_digest({"a": b"x", "d/b": b"z"}) != base


def test_the_headline_names_each_scheme_with_speed_and_ratio() -> None:
    """Last line: fetch MB/s, fetch-vs-raw and node-cache-vs-store per scheme, from the medians."""
    timings = [
        Timing("s3", 100_000_000, raw_s=1.0, fetch_s=4.0, again_s=1.5, cache_s=0.5),
        Timing("oci", 50_000_000, raw_s=0.5, fetch_s=1.0, again_s=0.4, cache_s=0.4),
    ]
    line = report(timings, Console(file=io.StringIO()))
    assert line == (
        "fetch_mb_s_s3=25 fetch_mb_s_oci=50 fetch_vs_raw_s3=0.25 fetch_vs_raw_oci=0.50 "
        "node_cache_vs_store_s3=8.00 node_cache_vs_store_oci=2.50"
    )
