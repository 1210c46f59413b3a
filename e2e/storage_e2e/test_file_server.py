"""The HTTPS file server: whole files, Range requests, and the faults fetch tests inject."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx
import pytest

from fleetserve_e2e.file_server import Fault, HttpsFileServer, ServedRequest

CONTENT = bytes(range(256)) * 512  # 128 KiB, every byte value
NAME = "weights/model.bin"
PATH = f"/{NAME}"


@pytest.fixture
def files(https_files: HttpsFileServer) -> HttpsFileServer:
    """The server with ``weights/model.bin`` in place."""
    target = https_files.root / NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(CONTENT)
    return https_files


@pytest.fixture
def client(files: HttpsFileServer) -> Iterator[httpx.Client]:
    """An HTTP client that trusts the storage CA only."""
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    with httpx.Client(verify=context, timeout=10.0) as http:
        yield http


def _download(client: httpx.Client, url: str, into: bytearray) -> None:
    """Stream ``url`` into ``into``, so a test sees what arrived before an error."""
    with client.stream("GET", url) as response:
        for chunk in response.iter_bytes():
            into += chunk


def test_whole_file(files: HttpsFileServer, client: httpx.Client) -> None:
    """A plain GET returns the file, announcing range support and an ETag."""
    response = client.get(files.url_for(NAME))

    assert response.status_code == httpx.codes.OK
    assert response.content == CONTENT
    assert response.headers["Accept-Ranges"] == "bytes"
    assert response.headers["ETag"].startswith('"')
    assert files.requests() == [ServedRequest("GET", PATH, None, httpx.codes.OK)]


def test_a_files_own_headers_add_to_and_override_the_defaults(
    files: HttpsFileServer, client: httpx.Client
) -> None:
    """What a Hub mirror sends with a file: its commit, its own ETag; on GET and HEAD alike."""
    files.set_headers(NAME, {"X-Repo-Commit": "c" * 40, "ETag": '"sha1-of-it"'})
    for method in ("GET", "HEAD"):
        response = client.request(method, files.url_for(NAME))
        assert response.headers["X-Repo-Commit"] == "c" * 40
        assert response.headers.get_list("ETag") == ['"sha1-of-it"']
    other = files.root / "other.bin"
    other.write_bytes(b"x")
    assert "X-Repo-Commit" not in client.get(files.url_for("other.bin")).headers


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        pytest.param("bytes=100-199", 100, 199, id="closed"),
        pytest.param("bytes=130000-", 130000, len(CONTENT) - 1, id="open-ended"),
        pytest.param("bytes=-10", len(CONTENT) - 10, len(CONTENT) - 1, id="suffix"),
        pytest.param("bytes=131000-999999", 131000, len(CONTENT) - 1, id="past-the-end"),
    ],
)
def test_range(
    files: HttpsFileServer, client: httpx.Client, header: str, first: int, last: int
) -> None:
    """A single range is answered 206 with its bytes and a Content-Range."""
    response = client.get(files.url_for(NAME), headers={"Range": header})

    assert response.status_code == httpx.codes.PARTIAL_CONTENT
    assert response.content == CONTENT[first : last + 1]
    assert response.headers["Content-Range"] == f"bytes {first}-{last}/{len(CONTENT)}"


def test_range_past_the_end_is_unsatisfiable(files: HttpsFileServer, client: httpx.Client) -> None:
    """A range that starts past the end is 416, with the size."""
    response = client.get(files.url_for(NAME), headers={"Range": f"bytes={len(CONTENT)}-"})

    assert response.status_code == httpx.codes.REQUESTED_RANGE_NOT_SATISFIABLE
    assert response.headers["Content-Range"] == f"*/{len(CONTENT)}"


def test_if_range_with_a_stale_etag_sends_the_whole_file(
    files: HttpsFileServer, client: httpx.Client
) -> None:
    """A resume whose ETag no longer matches gets the new file whole, not a spliced range."""
    etag = client.head(files.url_for(NAME)).headers["ETag"]
    fresh = client.get(files.url_for(NAME), headers={"Range": "bytes=5-", "If-Range": etag})
    stale = client.get(files.url_for(NAME), headers={"Range": "bytes=5-", "If-Range": '"old"'})

    assert fresh.status_code == httpx.codes.PARTIAL_CONTENT
    assert stale.status_code == httpx.codes.OK
    assert stale.content == CONTENT


def test_error_fault_hits_one_request(files: HttpsFileServer, client: httpx.Client) -> None:
    """An injected 500 answers the next request for its path only; the retry succeeds."""
    files.inject(Fault("error", path=PATH))

    failed = client.get(files.url_for(NAME))
    retried = client.get(files.url_for(NAME))

    assert failed.status_code == httpx.codes.INTERNAL_SERVER_ERROR
    assert retried.content == CONTENT
    assert [r.fault for r in files.requests()] == ["error", None]


def test_cut_then_resume_with_range(files: HttpsFileServer, client: httpx.Client) -> None:
    """A body cut short raises in the client; a Range request for the rest completes it."""
    files.inject(Fault("cut", path=PATH, after_bytes=50_000))
    received = bytearray()

    with pytest.raises(httpx.RemoteProtocolError):
        _download(client, files.url_for(NAME), received)
    rest = client.get(files.url_for(NAME), headers={"Range": f"bytes={len(received)}-"})

    assert len(received) == 50_000
    assert bytes(received) + rest.content == CONTENT
    assert [(r.range, r.status, r.fault) for r in files.requests()] == [
        (None, httpx.codes.OK, "cut"),
        ("bytes=50000-", httpx.codes.PARTIAL_CONTENT, None),
    ]


def test_stall_trips_the_read_timeout(files: HttpsFileServer) -> None:
    """A body that stops flowing mid-way leaves the client to its read timeout."""
    files.inject(Fault("stall", path=PATH, after_bytes=10_000))
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    received = bytearray()

    with (
        httpx.Client(verify=context, timeout=httpx.Timeout(10.0, read=1.0)) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        _download(impatient, files.url_for(NAME), received)

    assert len(received) == 10_000


def test_missing_file_and_escape_are_not_found(
    files: HttpsFileServer, client: httpx.Client
) -> None:
    """Nothing outside the root is served, nor a directory."""
    assert client.get(files.url_for("absent.bin")).status_code == httpx.codes.NOT_FOUND
    assert client.get(files.url_for("weights")).status_code == httpx.codes.NOT_FOUND
    assert client.get(f"{files.url}/../tls/tls.key").status_code == httpx.codes.NOT_FOUND
    escaped = client.get(f"{files.url}/%2e%2e/tls/tls.key")
    assert escaped.status_code == httpx.codes.NOT_FOUND


def test_server_certificate_is_verified(files: HttpsFileServer) -> None:
    """A client that trusts only the system CAs refuses the server."""
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(files.url_for(NAME), timeout=10.0)
