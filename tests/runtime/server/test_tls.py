"""TLS on every listener, from `tls_cert_file` and `tls_key_file`, over real loopback sockets.

A CA and a server certificate for 127.0.0.1 are made in the test. HTTPS (httpx trusting the
CA) and gRPC with TLS credentials (NVIDIA's tritonclient) are served; plain HTTP and plain
gRPC to the same ports fail; a key that does not match stops start-up with a message.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

from bench.server_proc import runtime_serve_argv
from fleetserve_runtime.testing.process import CLI, free_ports

TOKEN = "tls-admin-token-0123456789"


@dataclass(frozen=True)
class Pki:
    """Files of the test's CA, server certificate and key, and a key of no certificate."""

    ca: Path
    cert: Path
    key: Path
    other_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def make_pki(tmp: Path) -> Pki:
    """A CA, and a certificate it signed for 127.0.0.1 and localhost, valid for a day."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fleetserve test CA"))
        .issuer_name(_name("fleetserve test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(tmp / "ca.pem", tmp / "tls.crt", tmp / "tls.key", tmp / "other.key")
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pki.key)
    _write_key(ec.generate_private_key(ec.SECP256R1()), pki.other_key)
    return pki


@dataclass(frozen=True)
class Server:
    """The running server's certificate files and its listeners' addresses."""

    pki: Pki
    https: str
    admin: str
    grpc: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tls")
    pki = make_pki(tmp)
    (tmp / "admin-token").write_text(TOKEN)
    port, admin_port, grpc_port = free_ports(3)
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=4"
    argv = runtime_serve_argv([str(CLI)], model=model, name="test", port=port)
    flags = [
        "--no-warmup",
        f"--tls-cert-file={pki.cert}",
        f"--tls-key-file={pki.key}",
        f"--grpc-port={grpc_port}",
        "--model-control=explicit",
        f"--admin-port={admin_port}",
        f"--admin-token-file={tmp / 'admin-token'}",
        f"--allowed-model-uris={model}",
    ]
    log = (tmp / "log").open("wb")
    process = subprocess.Popen(
        [*argv, *flags], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        ready = f"https://127.0.0.1:{port}/v2/health/ready"
        deadline = time.monotonic() + 120
        while not _ready(ready, pki.ca):
            assert process.poll() is None, (tmp / "log").read_text()
            assert time.monotonic() < deadline, (tmp / "log").read_text()
            time.sleep(0.25)
        yield Server(pki, f"127.0.0.1:{port}", f"127.0.0.1:{admin_port}", f"127.0.0.1:{grpc_port}")
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _ready(url: str, ca: Path) -> bool:
    try:
        return httpx.get(url, verify=ssl.create_default_context(cafile=ca)).status_code == 200
    except httpx.TransportError:
        return False


def test_https_is_served_with_the_certificate(server: Server) -> None:
    """Inference over HTTPS, the certificate checked against the CA."""
    trust = ssl.create_default_context(cafile=server.pki.ca)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}
    response = httpx.post(f"https://{server.https}/v2/models/test/infer", json=body, verify=trust)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [2, 4]


def test_the_admin_listener_serves_tls_too(server: Server) -> None:
    trust = ssl.create_default_context(cafile=server.pki.ca)
    response = httpx.post(
        f"https://{server.admin}/v2/repository/models/test/unload",
        headers={"authorization": f"Bearer {TOKEN}"},
        verify=trust,
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("listener", ["https", "admin"])
def test_plain_http_to_a_tls_port_fails(server: Server, listener: str) -> None:
    """No answer in clear text: the server expects a TLS handshake."""
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{getattr(server, listener)}/v2/health/ready", timeout=10)


def test_an_untrusted_client_refuses_the_certificate(server: Server) -> None:
    """The client's default trust store does not hold the test CA: the handshake fails."""
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://{server.https}/v2/health/ready")


def test_grpc_is_served_over_tls(server: Server) -> None:
    """tritonclient.grpc with `ssl=True` and the CA: inference works."""
    client = triton.InferenceServerClient(
        server.grpc, ssl=True, root_certificates=str(server.pki.ca)
    )
    tensor = triton.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"a", b"b"], dtype=np.object_))
    assert client.infer("test", [tensor]).as_numpy("embedding").shape == (2, 4)


def test_plain_grpc_to_the_tls_port_fails(server: Server) -> None:
    client = triton.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as caught:
        client.is_server_live(client_timeout=10)
    assert caught.value.status() == "StatusCode.UNAVAILABLE"


def test_a_key_that_does_not_match_stops_start_up(tmp_path: Path) -> None:
    """Checked before anything listens: exit status 2, a message naming both files."""
    pki = make_pki(tmp_path)
    done = subprocess.run(
        [
            CLI,
            "serve",
            "--model=builtin://synthetic",
            "--port=0",
            f"--tls-cert-file={pki.cert}",
            f"--tls-key-file={pki.other_key}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot load tls_cert_file" in done.stderr
    assert str(pki.other_key) in done.stderr
