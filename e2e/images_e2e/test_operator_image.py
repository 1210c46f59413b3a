"""The operator image: small, non-root, and starts on a read-only root filesystem."""

from __future__ import annotations

import subprocess

from fleetserve_e2e.images.build import Built
from fleetserve_e2e.images.catalog import MB, OPERATOR, RUNTIME_GPU
from fleetserve_e2e.images.containers import ContainerSpec, run_once
from fleetserve_e2e.images.podman import image_labels
from fleetserve_e2e.paths import REPO_DIR

WHO_AND_WHERE = (
    "import errno, os\n"
    "print(os.getuid(), os.getgid())\n"
    "for path in ('/x', '/opt/venv/x', '/opt/app/x', '/tmp/x'):\n"
    "    try:\n"
    "        open(path, 'w').close()\n"
    "        print(path, 'written')\n"
    "    except OSError as exc:\n"
    "        print(path, errno.errorcode[exc.errno])\n"
)


def test_the_operator_image_is_within_its_bound(images: dict[str, Built]) -> None:
    """250 MB: kopf and the kubernetes client, no torch."""
    built = images[OPERATOR]
    assert built.spec.max_bytes == 250 * MB
    assert built.within_bound, f"{built.size_bytes / MB:.0f} MB"


def test_the_operator_starts_as_65532_with_a_read_only_root(images: dict[str, Built]) -> None:
    """ENTRYPOINT + CMD `run --help` exits 0 with every capability dropped and / read-only."""
    done = run_once(ContainerSpec(images[OPERATOR].spec.tag, args=("run", "--help")))
    assert done.returncode == 0, done.stderr
    assert "FLEETSERVE_" in done.stdout


def test_both_images_run_as_65532_and_write_only_to_their_mounts(
    images: dict[str, Built],
) -> None:
    """The image's own user, numeric; the root filesystem refuses writes, the tmpfs takes them."""
    for name in (OPERATOR, RUNTIME_GPU):
        spec = ContainerSpec(images[name].spec.tag, entrypoint="python", args=("-c", WHO_AND_WHERE))
        done = run_once(spec)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "65532 65532",
            "/x EROFS",
            "/opt/venv/x EROFS",
            "/opt/app/x EROFS",
            "/tmp/x written",
        ], name


def test_the_images_carry_the_commit_they_were_built_from(images: dict[str, Built]) -> None:
    """The OCI revision label is the commit `make images` built, the version the packages'."""
    head = subprocess.run(  # git, for the commit the images were just built from
        ["git", "-C", str(REPO_DIR), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    for name in (OPERATOR, RUNTIME_GPU):
        labels = image_labels(images[name].spec.tag)
        assert labels["org.opencontainers.image.revision"] == head, name
        assert labels["org.opencontainers.image.version"] == "0.1.0", name
