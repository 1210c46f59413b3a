"""The base image the Dockerfiles build on, made here when the default cannot be pulled.

The Dockerfiles name the official ``python:3.11-slim-bookworm`` image by digest (their
``PYTHON_IMAGE`` argument). Where no container registry is reachable, ``ensure_base`` makes a
stand-in with the same shape: Debian bookworm from ``debootstrap --variant=minbase`` (Debian's
packages are reachable where the registry is not), python3.11 with venv, CA certificates,
``python`` on the PATH; apt's caches, documentation and locales are left out. It is imported as
a one-layer image tagged by a digest of its recipe, so a changed recipe makes a new image and an
unchanged one is made once per machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetserve_e2e.images.podman import image_exists, import_rootfs, try_pull


@dataclass(frozen=True)
class BaseRecipe:
    """What goes into the stand-in base image."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = ("python3.11", "python3-venv", "ca-certificates")
    # Left out of the image: apt's package cache and lists (nothing installs at run time),
    # documentation, manual pages and translations. 275 MB becomes 130 MB.
    pruned: tuple[str, ...] = (
        "var/cache/apt",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
    )
    # The official image's interpreter is `python` (and `python3`) on the PATH.
    links: tuple[tuple[str, str], ...] = (
        ("usr/local/bin/python", "/usr/bin/python3.11"),
        ("usr/local/bin/python3", "/usr/bin/python3.11"),
    )

    def tag(self) -> str:
        """``localhost/fleetserve-base:<suite>-py311-<12 hex digits of the recipe>``."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"localhost/fleetserve-base:{self.suite}-py311-{digest[:12]}"


def ensure_base(default_ref: str, recipe: BaseRecipe = BaseRecipe()) -> str:
    """The base image to build on.

    ``default_ref`` if it is here or can be pulled, else the stand-in made from ``recipe``
    (made now if this machine has none yet).
    """
    if image_exists(default_ref):
        return default_ref
    why_not = try_pull(default_ref)
    if why_not is None:
        return default_ref
    tag = recipe.tag()
    if image_exists(tag):
        return tag
    print(f"base: {default_ref} cannot be pulled ({why_not}); making {tag}", flush=True)
    _make(recipe, tag)
    return tag


def _make(recipe: BaseRecipe, tag: str) -> None:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise RuntimeError("debootstrap is not installed; `make images-install` installs it")
    with tempfile.TemporaryDirectory(prefix="fleetserve-base-") as work:
        root = Path(work) / "root"
        subprocess.run(  # debootstrap into a directory we own
            [
                debootstrap,
                f"--variant={recipe.variant}",
                f"--include={','.join(recipe.packages)}",
                recipe.suite,
                str(root),
            ],
            check=True,
            timeout=1800,
        )
        for pruned in recipe.pruned:
            for entry in (root / pruned).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        for link, target in recipe.links:
            (root / link).symlink_to(target)
        import_rootfs(root, tag, cmd=["python3"])
