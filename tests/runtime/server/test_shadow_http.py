"""Shadow mirroring between real runtime servers on loopback.

Each primary serves with `shadow.url` naming another server (or a closed port) and copies
every request (`fraction: 1`); the tests read the primary's `/metrics` for what the
copies did. Servers run under uvicorn in threads of the test process (`uvicorn_thread`).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.testing import make_config
from fleetserve_runtime.testing.process import free_port
from tests.runtime.uvicorn_thread import uvicorn_thread

MINILM = "builtin://minilm-l6"
SYNTH_384 = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=384"
"""A different encoder of MiniLM's width: same shape of answer, other vectors."""
SLOW_384 = "builtin://synthetic?latency_ms=1500&per_item_ms=0&dim=384"
GENERATE = "builtin://synthetic-generate?per_token_ms=0&output_tokens=12&seed={seed}"
TEXTS = ["the cat sat on the mat", "a shadow follows the primary", "fleetserve"]
CHAT = {"model": "test", "messages": [{"role": "user", "content": "say something"}]}
WAIT_S = 20.0


def _shadow(url: str, **more: Any) -> dict[str, Any]:
    return {"url": url, "fraction": 1.0, "version_label": "next", **more}


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (its own CA), and the key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "tls.crt", tmp / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Base URLs by role: shadows first, then the primaries that copy to them."""
    urls: dict[str, str] = {}
    cert, key = self_signed(tmp_path_factory.mktemp("shadow-tls"))
    with ExitStack() as stack:

        def serve(
            role: str, model: str, shadow: dict[str, Any] | None = None, **server: Any
        ) -> None:
            config = make_config(model=model, **({"shadow": shadow} if shadow else {}))
            port = stack.enter_context(uvicorn_thread(create_app(config), **server))
            scheme = "https" if server else "http"
            urls[role] = f"{scheme}://127.0.0.1:{port}"

        serve("minilm", MINILM)
        serve("slow", SLOW_384)
        serve("gen0", GENERATE.format(seed=0))
        serve("gen1", GENERATE.format(seed=1))
        serve("tls", SYNTH_384, ssl_certfile=str(cert), ssl_keyfile=str(key))
        serve("same", MINILM, _shadow(urls["minilm"]))
        serve("other", SYNTH_384, _shadow(urls["minilm"]))
        serve("to_slow", SYNTH_384, _shadow(urls["slow"], timeout_s=0.5, max_concurrency=1))
        serve("to_down", SYNTH_384, _shadow(f"http://127.0.0.1:{free_port()}"))
        serve("gen_same", GENERATE.format(seed=0), _shadow(urls["gen0"]))
        serve("gen_other", GENERATE.format(seed=0), _shadow(urls["gen1"]))
        serve("to_tls", SYNTH_384, _shadow(urls["tls"], ca_file=cert))
        serve("to_untrusted", SYNTH_384, _shadow(urls["tls"]))
        deadline = time.monotonic() + 120
        trust = ssl.create_default_context(cafile=cert)
        for role, url in urls.items():
            ready = f"{url}/v2/health/ready"
            while httpx.get(ready, timeout=10, verify=trust).status_code != 200:
                assert time.monotonic() < deadline, f"{role} did not get ready"
                time.sleep(0.1)
        yield urls


def shadow_counts(url: str) -> dict[str, float]:
    """The primary's shadow counters and histogram sums, by name (summed over labels)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("fleetserve_shadow_"):
                assert sample.labels.get("shadow_version") == "next"
                counts[sample.name] = counts.get(sample.name, 0.0) + sample.value
    return counts


def settled(url: str, done: str, at_least: float) -> dict[str, float]:
    """The counts once `done` reached `at_least` (the copies run after the answers)."""
    deadline = time.monotonic() + WAIT_S
    counts = shadow_counts(url)
    while counts.get(done, 0.0) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = shadow_counts(url)
    return counts


def embed(url: str, texts: list[str] = TEXTS) -> list[list[float]]:
    response = httpx.post(
        f"{url}/v1/embeddings", json={"model": "test", "input": texts}, timeout=30
    )
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def test_the_same_model_agrees_everywhere(servers: dict[str, str]) -> None:
    """Vectors of one model agree: every copy compared, every vector agreed, ratio 1."""
    for _ in range(2):
        embed(servers["same"])
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    infer = httpx.post(f"{servers['same']}/v2/models/test/infer", json=body, timeout=30)
    assert infer.status_code == 200, infer.text
    counts = settled(servers["same"], "fleetserve_shadow_compared_total", 7)
    assert counts["fleetserve_shadow_mirrored_total"] == 3
    assert counts["fleetserve_shadow_compared_total"] == 7
    assert counts["fleetserve_shadow_agreed_total"] == 7
    assert counts["fleetserve_shadow_agreement_ratio_sum"] == pytest.approx(7.0)
    assert counts["fleetserve_shadow_duration_seconds_count"] == 3
    assert counts["fleetserve_shadow_dropped_total"] == 0
    assert counts["fleetserve_shadow_errors_total"] == 0


def test_a_different_model_disagrees_and_the_answer_is_the_primarys(
    servers: dict[str, str],
) -> None:
    """Another encoder's vectors are compared and disagree; the client gets the primary's."""
    vectors = embed(servers["other"])
    counts = settled(servers["other"], "fleetserve_shadow_compared_total", 3)
    assert counts["fleetserve_shadow_compared_total"] == 3
    assert counts["fleetserve_shadow_agreed_total"] == 0
    assert counts["fleetserve_shadow_agreement_ratio_sum"] < 3 * 0.5
    assert vectors != embed(servers["minilm"])
    assert vectors == embed(servers["to_down"])  # the same synthetic encoder, unmirrored answer


def test_a_slow_shadow_neither_delays_nor_fails_the_primary(servers: dict[str, str]) -> None:
    """Copies past `max_concurrency` are dropped, the one in flight times out; answers are fast."""
    for _ in range(4):
        started = time.monotonic()
        embed(servers["to_slow"])
        assert time.monotonic() - started < 0.4
    counts = settled(servers["to_slow"], "fleetserve_shadow_errors_total", 1)
    assert counts["fleetserve_shadow_mirrored_total"] == 1
    assert counts["fleetserve_shadow_dropped_total"] == 3
    assert counts["fleetserve_shadow_errors_total"] == 1  # the timeout
    assert counts["fleetserve_shadow_compared_total"] == 0


def test_a_shadow_that_is_down_costs_the_primary_nothing(servers: dict[str, str]) -> None:
    """Every copy fails to connect and is counted; every primary answer is a 200."""
    errors = "fleetserve_shadow_errors_total"
    before = shadow_counts(servers["to_down"]).get(errors, 0.0)
    for _ in range(3):
        embed(servers["to_down"])
    counts = settled(servers["to_down"], errors, before + 3)
    assert counts[errors] - before == 3
    assert counts["fleetserve_shadow_mirrored_total"] == counts[errors]
    assert counts["fleetserve_shadow_compared_total"] == 0


def chat(url: str, **fields: Any) -> httpx.Response:
    response = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, **fields}, timeout=30)
    assert response.status_code == 200, response.text
    return response


def test_greedy_generations_agree_with_the_same_model(servers: dict[str, str]) -> None:
    """Greedy answers (plain and streamed) match exactly; a sampled one is only mirrored."""
    url = servers["gen_same"]
    chat(url, temperature=0)
    chat(url, temperature=0, stream=True, stream_options={"include_usage": True})
    chat(url, temperature=1.0)
    counts = settled(url, "fleetserve_shadow_duration_seconds_count", 3)
    assert counts["fleetserve_shadow_mirrored_total"] == 3
    assert counts["fleetserve_shadow_compared_total"] == 2
    assert counts["fleetserve_shadow_agreed_total"] == 2
    assert counts["fleetserve_shadow_agreement_ratio_sum"] == pytest.approx(2.0)


def test_greedy_generations_of_another_model_disagree(servers: dict[str, str]) -> None:
    """Another seed answers other words: compared, not agreed, overlap below 1."""
    url = servers["gen_other"]
    chat(url, temperature=0)
    completion = httpx.post(
        f"{url}/v1/completions",
        json={"model": "test", "prompt": "once upon", "temperature": 0},
        timeout=30,
    )
    assert completion.status_code == 200, completion.text
    counts = settled(url, "fleetserve_shadow_compared_total", 2)
    assert counts["fleetserve_shadow_compared_total"] == 2
    assert counts["fleetserve_shadow_agreed_total"] == 0
    assert counts["fleetserve_shadow_agreement_ratio_sum"] < 2.0


def test_an_https_shadow_is_trusted_through_ca_file_only(servers: dict[str, str]) -> None:
    """With `ca_file` the copies are compared; without it the TLS handshake fails them."""
    embed(servers["to_tls"])
    embed(servers["to_untrusted"])
    trusted = settled(servers["to_tls"], "fleetserve_shadow_compared_total", 3)
    assert trusted["fleetserve_shadow_agreed_total"] == 3
    untrusted = settled(servers["to_untrusted"], "fleetserve_shadow_errors_total", 1)
    assert untrusted["fleetserve_shadow_errors_total"] == 1
    assert untrusted["fleetserve_shadow_compared_total"] == 0
