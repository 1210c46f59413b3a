"""The Dockerfiles' layers: heavy and stable first, the package last, the CA bundle never in.

Both build the same way. `deps` copies only the locks and installs them (gigabytes for the
runtime), so it is rebuilt only when a lock changes; `app` copies the package source and
installs it alone into /opt/app, which the venv's .pth file puts on the path; the image copies
the venv, then /opt/app, and ends with the labels, so a source change or a new revision
rebuilds only the last layers. A CA bundle for a TLS-inspecting proxy comes in as a build
secret, mounted only while pip downloads, and is never copied into a layer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.images.dockerfile_stages import (
    DOCKERFILES,
    HASH_CHECKED,
    ROOT,
    Stage,
    is_copy_from_context,
    lineage,
    parse,
    run_flags,
    shell_commands,
    stages,
)
from tests.images.stage_runner import run_stages

PACKAGES = {"Dockerfile.operator": "operator/", "Dockerfile.runtime": "runtime/"}
LABEL_ARGS = ("SOURCE", "REVISION", "VERSION")
SECRET = "/run/secrets/ca-bundle"
CERTIFICATE_NAME = re.compile(r"(\.(pem|crt|cer|der|p7b|p12|pfx|key)$|ca-bundle|certificates)")
CERTIFICATE_TEXT = re.compile(rb"-----BEGIN [A-Z ]*(CERTIFICATE|PRIVATE KEY)-----")
# Variables through which pip, requests, curl or OpenSSL would trust a bundle.
TRUST_VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")
# The operator's deps stage takes kubernetes/aio out of the site-packages: it must be there.
SITE_FILES = ("kubernetes/__init__.py", "kubernetes/aio/__init__.py")


def context_sources(value: str) -> list[str]:
    """The build-context paths a COPY or ADD takes."""
    *sources, _destination = value.split()
    return sources


def is_package_source(source: str) -> bool:
    """A folder holding a package (its pyproject.toml), or a path inside one."""
    path = ROOT / source
    inside = [folder for folder in (path, *path.parents) if ROOT in folder.parents]
    return any((folder / "pyproject.toml").is_file() for folder in inside)


def lock_install_runs(path: Path) -> list[tuple[Stage, int]]:
    """Each RUN that downloads with a hash-checked `pip install`: its stage and position."""
    return [
        (built, index)
        for built in stages(path)
        for index, item in enumerate(built.instructions)
        if item.keyword == "RUN" and any(HASH_CHECKED.search(c) for c in shell_commands(item.value))
    ]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_locks_install_before_any_package_source_is_copied(path: Path) -> None:
    """Up to each lock install, in its stage and those it is built on, only locks are copied.

    A package source copied earlier would rebuild the dependency layers on every change to it.
    """
    runs = lock_install_runs(path)
    assert {built.name for built, _ in runs} == {"deps"}
    for built, index in runs:
        assert built.name is not None
        earlier = [item for s in lineage(path, built.name)[:-1] for item in s.instructions]
        copies = [
            source
            for item in [*earlier, *built.instructions[:index]]
            if item.keyword in ("COPY", "ADD")
            for source in context_sources(item.value)
        ]
        assert copies, "the locks are never copied in before they are installed"
        for source in copies:
            assert source.startswith("requirements/"), f"{source} is copied before the install"
            assert not is_package_source(source), source


@pytest.mark.parametrize("path", DOCKERFILES)
def test_only_the_app_stage_copies_the_package_source(path: Path) -> None:
    """`app` copies its own package and nothing else does; the image copies only from stages."""
    copied = {
        built.name: [
            source
            for value in built.values("COPY")
            if is_copy_from_context(value)
            for source in context_sources(value)
            if is_package_source(source)
        ]
        for built in stages(path)
    }
    assert {name: sources for name, sources in copied.items() if sources} == {
        "app": [PACKAGES[path.name]]
    }
    image = stages(path)[-1]
    assert image.values("COPY"), "the image copies nothing"
    assert not [v for v in image.values("COPY") if is_copy_from_context(v)]
    assert not image.values("ADD")


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_image_holds_the_venv_below_the_app(path: Path) -> None:
    """/opt/venv (rebuilt with the locks) is the lower layers, /opt/app (every change) above.

    The runtime's image starts FROM the `venv` stage rather than copying its gigabytes (a
    COPY --from of the venv is a new layer on every build); the operator's copies its small
    venv onto the base, which leaves the installers' layers behind.
    """
    image = stages(path)[-1]
    destinations = [value.split()[-1] for value in image.values("COPY")]
    if path.name == "Dockerfile.runtime":
        assert image.base == "venv"
        assert destinations == ["/opt/app"]
    else:
        assert image.base == stages(path)[0].base
        assert destinations == ["/opt/venv", "/opt/app"]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_labels_and_their_args_come_last(path: Path) -> None:
    """After both COPYs, and nothing after them but labels: a new revision reuses every layer.

    The ARGs are declared in the image's stage only: in `deps`, a new revision would make its
    installs run again.
    """
    image = stages(path)[-1]
    keywords = [item.keyword for item in image.instructions]
    label_args = [
        index
        for index, item in enumerate(image.instructions)
        if item.keyword == "ARG" and item.value.split("=", 1)[0] in LABEL_ARGS
    ]
    assert len(label_args) == len(LABEL_ARGS)
    last_copy = max(index for index, keyword in enumerate(keywords) if keyword == "COPY")
    assert min(label_args) > last_copy
    assert "LABEL" in keywords[min(label_args) :]
    assert set(keywords[min(label_args) :]) == {"ARG", "LABEL"}
    declared = [
        item["value"].split("=", 1)[0]
        for item in parse(path).structure
        if item["instruction"] == "ARG"
    ]
    for arg in LABEL_ARGS:
        assert declared.count(arg) == 1, f"ARG {arg} is declared outside the image's stage"


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_venv_puts_opt_app_on_the_path(path: Path, tmp_path: Path) -> None:
    """`deps` leaves a .pth file naming /opt/app in the venv; the image runs /opt/app/bin first."""
    build = run_stages(path, ("deps",), tmp_path, site_files=SITE_FILES)
    assert build.returncode == 0, build.stderr
    assert (build.site_packages / "fleetserve-app.pth").read_text() == "/opt/app\n"
    paths = [
        value
        for built in lineage(path, stages(path)[-1].name)
        for value in built.values("ENV")
        if value.startswith("PATH=")
    ]
    assert paths, "the image's PATH does not name /opt/app/bin"
    assert paths[-1].startswith("PATH=/opt/app/bin:/opt/venv/bin:")


@pytest.mark.parametrize("path", DOCKERFILES)
def test_no_certificate_is_copied_into_an_image(path: Path) -> None:
    """No COPY or ADD takes a certificate or key, by name or inside a copied folder."""
    sources = [
        source
        for built in stages(path)
        for keyword in ("COPY", "ADD")
        for value in built.values(keyword)
        if is_copy_from_context(value)
        for source in context_sources(value)
    ]
    assert sources
    for source in sources:
        root = ROOT / source
        files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else [root]
        for file in files:
            assert not CERTIFICATE_NAME.search(file.name.lower()), f"COPY {file}"
            assert not CERTIFICATE_TEXT.search(file.read_bytes()), f"COPY {file}"


def secret_mounts(flags: list[str]) -> list[dict[str, str]]:
    """The options of each `--mount=type=secret,...` of a RUN."""
    mounts = [dict(kv.split("=", 1) for kv in f.removeprefix("--mount=").split(",")) for f in flags]
    return [mount for mount in mounts if mount.get("type") == "secret"]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_every_downloading_pip_install_mounts_the_ca_bundle(path: Path) -> None:
    """The secret is mounted at its default path, optional, and pip trusts it when given."""
    runs = lock_install_runs(path)
    assert runs
    for built, index in runs:
        flags, _ = run_flags(built.instructions[index].value)
        assert secret_mounts(flags) == [{"type": "secret", "id": "ca-bundle", "required": "false"}]
        commands = shell_commands(built.instructions[index].value)
        # Set only when the secret is given: a build without a proxy needs none.
        assert commands[:2] == [f"if [ -s {SECRET} ]", f"export PIP_CERT={SECRET}"]
        first_install = min(i for i, c in enumerate(commands) if "pip install" in c)
        assert first_install > 1


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_ca_bundle_stays_a_secret(path: Path) -> None:
    """It is read where it is mounted and never copied out; no ENV or ARG names a bundle."""
    for built in stages(path):
        for value in built.values("RUN"):
            flags, script = run_flags(value)
            if "ca-bundle" not in script:
                continue
            assert secret_mounts(flags), f"RUN reads the CA bundle without mounting it: {value}"
            uses = [c for c in shell_commands(value) if "ca-bundle" in c]
            assert set(uses) <= {f"if [ -s {SECRET} ]", f"export PIP_CERT={SECRET}"}, uses
        settings = " ".join(built.values("ENV") + built.values("ARG"))
        for variable in TRUST_VARIABLES:
            assert variable not in settings, f"{variable} is set in a layer or build arg"
