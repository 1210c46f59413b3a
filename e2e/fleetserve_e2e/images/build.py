"""Build the images of the catalog with podman and report each one's size and build time.

``build_images`` is what ``make images`` runs: it makes sure of the base image, builds each
asked-for image on it (podman keeps each step's layer, so an unchanged lock reuses the
dependency layers and a source change rebuilds only the package's), and prints one row per image.
The host's CA bundle reaches pip inside the build as a build secret, never as a layer.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.images.base import ensure_base
from fleetserve_e2e.images.catalog import MB, ImageSpec, plan, within_bound
from fleetserve_e2e.images.podman import container_options, image_size, podman
from fleetserve_e2e.paths import REPO_DIR

REVISION_LABEL = "org.opencontainers.image.revision"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class Built:
    """An image that was built: its spec, size and how long the build took."""

    spec: ImageSpec
    size_bytes: int
    seconds: float

    @property
    def within_bound(self) -> bool:
        """Whether the size meets the spec's bound."""
        return within_bound(self.spec, self.size_bytes)


def default_base(dockerfile: Path = REPO_DIR / "Dockerfile.operator") -> str:
    """The Dockerfiles' ``PYTHON_IMAGE`` default, fully qualified as podman wants it.

    Both Dockerfiles name the same base (a unit test holds them to it).
    """
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        if line.startswith("ARG PYTHON_IMAGE="):
            image = line.split("=", 1)[1]
            return image if "/" in image.split(":", 1)[0] else f"docker.io/library/{image}"
    raise LookupError(f"{dockerfile} has no ARG PYTHON_IMAGE default")


def build_args(spec: ImageSpec, ca_bundle: Path | None) -> list[str]:
    """The ``podman build`` arguments for ``spec`` (run from the repository root)."""
    # Docker format: OCI image configs have no HEALTHCHECK, and podman would drop the runtime's.
    args = [
        "build",
        *container_options(),
        "--format",
        "docker",
        "--layers",
        "-f",
        str(spec.dockerfile),
        "-t",
        spec.tag,
    ]
    for name, value in sorted(spec.build_args.items()):
        args += ["--build-arg", f"{name}={value}"]
    # The Dockerfiles set this label from the REVISION build arg, but podman's layer cache
    # keys a LABEL step by its text, not the argument's value: a build whose every step is
    # cached would keep the last commit's revision. A --label is applied to every build.
    if "REVISION" in spec.build_args:
        args += ["--label", f"{REVISION_LABEL}={spec.build_args['REVISION']}"]
    if ca_bundle is not None:
        args += ["--secret", f"id=ca-bundle,src={ca_bundle}"]
    return [*args, str(REPO_DIR)]


def _revision() -> str:
    done = subprocess.run(  # git, to label the image with the commit it is built from
        ["git", "-C", str(REPO_DIR), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def build_images(names: tuple[str, ...], *, torch_cpu_sha256: str = "") -> list[Built]:
    """Build ``names`` (catalog names) and return what was built, in order.

    Raises:
        ImagePlanError: An image cannot be built as asked (before anything is built).
        PodmanError: A build failed.
    """
    revision = _revision()
    # Plan once before the base exists, so a refused plan costs nothing.
    plan(names, base="", revision=revision, torch_cpu_sha256=torch_cpu_sha256)
    base = ensure_base(default_base())
    specs = plan(names, base=base, revision=revision, torch_cpu_sha256=torch_cpu_sha256)
    ca_bundle = HOST_CA_BUNDLE if HOST_CA_BUNDLE.is_file() else None
    built = []
    for spec in specs:
        print(f"images: building {spec.name} as {spec.tag}", flush=True)
        started = time.monotonic()
        podman(build_args(spec, ca_bundle), timeout_s=3600)
        built.append(Built(spec, image_size(spec.tag), time.monotonic() - started))
    return built


def report(built: list[Built]) -> str:
    """One row per image: name, tag, size, bound, build seconds and whether it is within bound."""
    rows = [f"{'image':<12} {'size MB':>8} {'bound MB':>9} {'build s':>8}  verdict  tag"]
    for item in built:
        bound = "-" if item.spec.max_bytes is None else f"{item.spec.max_bytes / MB:.0f}"
        verdict = "ok" if item.within_bound else "TOO BIG"
        rows.append(
            f"{item.spec.name:<12} {item.size_bytes / MB:>8.0f} {bound:>9} {item.seconds:>8.0f}"
            f"  {verdict:<7}  {item.spec.tag}"
        )
    return "\n".join(rows)
