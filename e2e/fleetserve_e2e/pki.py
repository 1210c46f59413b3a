"""Generate the certificates and keys a throwaway control plane needs, at every start.

One CA signs the API server's serving certificate and an admin client certificate in group
``system:masters``; a separate key pair signs service-account tokens.  A second CA, the
front-proxy CA of the aggregation layer, signs the client certificate kube-apiserver presents
when it proxies a request to an aggregated API server (KEDA's metrics API server); keeping it
apart from the cluster CA is what stops any cluster client from asserting a user by header.
Servers the tests run on loopback (the storage servers models are fetched from) get serving
certificates from a throwaway CA of their own (`write_ca`, `issue_loopback_cert`).
ECDSA P-256 keys are used because they are generated in milliseconds, which keeps cluster start
fast.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# 10.0.0.1 is the first address of the service range the API server is started with.
SERVICE_IP = "10.0.0.1"
APISERVER_NAME = "kubernetes.default.svc"
"""The API server's in-cluster name, in its serving certificate: a container of the fake
kubelet's container backend reaches the API server (on the host's loopback) by it."""
_VALIDITY = datetime.timedelta(days=7)
# The common name the aggregator's client certificate carries; aggregated API servers accept
# request headers only from a certificate with one of the names in --requestheader-allowed-names.
FRONT_PROXY_CLIENT_NAME = "front-proxy-client"


@dataclass(frozen=True)
class ClusterPki:
    """Paths of the PEM files written by :func:`write_pki`."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path

    @classmethod
    def in_directory(cls, directory: Path) -> ClusterPki:
        """Return the file layout used in ``directory`` (also to reopen a running cluster)."""
        return cls(
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            server_cert=directory / "apiserver.crt",
            server_key=directory / "apiserver.key",
            admin_cert=directory / "admin.crt",
            admin_key=directory / "admin.key",
            service_account_key=directory / "sa.key",
            service_account_pub=directory / "sa.pub",
            front_proxy_ca_cert=directory / "front-proxy-ca.crt",
            front_proxy_client_cert=directory / "front-proxy-client.crt",
            front_proxy_client_key=directory / "front-proxy-client.key",
        )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _leaf(
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    san: x509.SubjectAlternativeName | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    builder = _builder(subject, ca.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _new_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    name = _name(common_name)
    ca = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return ca, key


def write_pki(directory: Path) -> ClusterPki:
    """Write fresh CAs, serving, admin, front-proxy and service-account keys into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _new_ca("fleetserve-e2e-ca")
    san = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName(APISERVER_NAME),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address(SERVICE_IP)),
        ]
    )
    server, server_key = _leaf(
        subject=_name("kube-apiserver"),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        ca=ca,
        ca_key=ca_key,
        san=san,
    )
    admin, admin_key = _leaf(
        subject=_name("fleetserve-e2e-admin", "system:masters"),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        ca=ca,
        ca_key=ca_key,
    )
    front_proxy_ca, front_proxy_ca_key = _new_ca("fleetserve-e2e-front-proxy-ca")
    front_proxy, front_proxy_key = _leaf(
        subject=_name(FRONT_PROXY_CLIENT_NAME),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        ca=front_proxy_ca,
        ca_key=front_proxy_ca_key,
    )
    sa_key = _new_key()
    pki = ClusterPki.in_directory(directory)
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.server_cert.write_bytes(server.public_bytes(pem))
    pki.server_key.write_bytes(_key_pem(server_key))
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.front_proxy_ca_cert.write_bytes(front_proxy_ca.public_bytes(pem))
    pki.front_proxy_client_cert.write_bytes(front_proxy.public_bytes(pem))
    pki.front_proxy_client_key.write_bytes(_key_pem(front_proxy_key))
    pki.service_account_key.write_bytes(_key_pem(sa_key))
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


@dataclass(frozen=True)
class LocalCa:
    """A throwaway CA's certificate and key (PEM files), to sign loopback serving certificates."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class TlsFiles:
    """A certificate for a loopback server, its key and the CA that signed it (PEM files).

    The file names (``ca.crt``, ``tls.crt``, ``tls.key``) are those of a ``kubernetes.io/tls``
    Secret with its CA, which is how KEDA and most servers' flags expect them.
    """

    ca_cert: Path
    cert: Path
    key: Path

    @classmethod
    def in_directory(cls, directory: Path) -> TlsFiles:
        """Return the file layout used in ``directory``."""
        return cls(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")


def write_ca(directory: Path, common_name: str) -> LocalCa:
    """Write a fresh self-signed CA (``ca.crt``, ``ca.key``) into ``directory``."""
    ca, key = _new_ca(common_name)
    directory.mkdir(parents=True, exist_ok=True)
    files = LocalCa(cert=directory / "ca.crt", key=directory / "ca.key")
    files.cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(_key_pem(key))
    return files


def issue_loopback_cert(
    ca: LocalCa, directory: Path, server_name: str, *, client_auth: bool = False
) -> TlsFiles:
    """Write a certificate signed by ``ca`` for ``server_name``, ``localhost`` and 127.0.0.1.

    It serves TLS; with ``client_auth`` it may also authenticate as a client. ``directory``
    receives ``ca.crt`` (a copy of the CA's certificate), ``tls.crt`` and ``tls.key``.
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key} is not an EC private key")
    key = _new_key()
    names = x509.SubjectAlternativeName(
        [
            x509.DNSName(server_name),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
    )
    usages = [ExtendedKeyUsageOID.SERVER_AUTH]
    if client_auth:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    cert = (
        _builder(_name(server_name), ca_cert.subject, key.public_key())
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(names, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles.in_directory(directory)
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    files.cert.write_bytes(cert.public_bytes(pem))
    files.key.write_bytes(_key_pem(key))
    return files


def write_mutual_tls_dir(pki: ClusterPki, directory: Path, server_name: str) -> Path:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` for a component that serves and dials TLS.

    The certificate is signed by the cluster CA, valid for ``server_name``, ``localhost`` and
    127.0.0.1, and usable for both server and client authentication: KEDA's operator and
    metrics API server use one such directory each for their mutual-TLS gRPC link, as KEDA's
    own certificate rotation lays it out.
    """
    cluster_ca = LocalCa(cert=pki.ca_cert, key=pki.ca_key)
    issue_loopback_cert(cluster_ca, directory, server_name, client_auth=True)
    return directory
