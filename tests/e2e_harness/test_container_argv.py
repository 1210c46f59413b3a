"""``podman run`` arguments of a hardened container, and of a pod's container."""

from __future__ import annotations

from pathlib import Path

from fleetserve_e2e.images.containers import ContainerSpec, Mount, run_argv
from fleetserve_e2e.images.registry import PullOptions

IMAGE = "localhost/fleetserve/fleetserve-runtime:0.1.0"


def _after_options(argv: list[str]) -> list[str]:
    """The arguments after podman's own ``--runtime`` and ``--ulimit`` options."""
    return argv[argv.index("--name") :]


def test_a_default_spec_is_confined() -> None:
    argv = _after_options(run_argv(ContainerSpec(IMAGE, args=("serve",)), "c1", detach=True))
    assert argv == [
        "--name", "c1",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--pids-limit", "1024",
        "--read-only",
        "--detach",
        "--tmpfs", "/tmp:size=1g",
        IMAGE, "serve",
    ]  # fmt: skip


def test_a_pods_container_gets_its_mounts_labels_limits_and_command() -> None:
    spec = ContainerSpec(
        IMAGE,
        args=("--config", "/config/runtime.yaml"),
        entrypoint='["fleetserve-runtime", "serve"]',
        user="65532:65532",
        read_only=False,
        tmpfs={},
        memory="209715200",
        cpus="0.5",
        ports={8080: 40000},
        mounts=(Mount(Path("/pods/p/volume-1"), "/config", read_only=True),),
        labels={"io.fleetserve.e2e.pod-uid": "u-1"},
        drop_all_capabilities=False,
        no_new_privileges=False,
    )
    argv = _after_options(run_argv(spec, "c2", detach=True))
    assert argv == [
        "--name", "c2",
        "--pids-limit", "1024",
        "--user", "65532:65532",
        "--memory", "209715200", "--memory-swap", "209715200",
        "--cpus", "0.5",
        "--detach",
        "--mount", "type=bind,source=/pods/p/volume-1,target=/config,ro",
        "--label", "io.fleetserve.e2e.pod-uid=u-1",
        "--publish", "127.0.0.1:40000:8080",
        "--entrypoint", '["fleetserve-runtime", "serve"]',
        IMAGE, "--config", "/config/runtime.yaml",
    ]  # fmt: skip


def test_supplementary_groups_are_added() -> None:
    argv = _after_options(run_argv(ContainerSpec(IMAGE, groups=(65532,)), "c5", detach=True))
    assert argv[argv.index("--group-add") + 1] == "65532"


def test_host_names_put_the_container_on_slirp4netns_with_the_hosts_loopback() -> None:
    """Each name resolves to 10.0.2.2, which slirp4netns maps to the host's 127.0.0.1."""
    spec = ContainerSpec(IMAGE, ports={8080: 40000}, host_names=("seaweedfs-s3", "registry"))
    argv = _after_options(run_argv(spec, "c3", detach=True))
    network = argv[argv.index("--publish") :]
    assert network == [
        "--publish", "127.0.0.1:40000:8080",
        "--network", "slirp4netns:allow_host_loopback=true",
        "--add-host", "seaweedfs-s3:10.0.2.2",
        "--add-host", "registry:10.0.2.2",
        IMAGE,
    ]  # fmt: skip
    plain = _after_options(run_argv(ContainerSpec(IMAGE), "c4", detach=True))
    assert "--network" not in plain
    assert "--add-host" not in plain


def test_a_missing_image_is_pulled_with_the_registry_ca_and_credentials() -> None:
    options = PullOptions(cert_dir=Path("/certs/registry"), credentials="user:pw")
    assert options.argv("registry.test:5000/fleetserve/fleetserve-runtime:0.1.0") == [
        "pull", "--quiet",
        "--cert-dir", "/certs/registry",
        "--creds", "user:pw",
        "registry.test:5000/fleetserve/fleetserve-runtime:0.1.0",
    ]  # fmt: skip
    assert PullOptions().argv("img") == ["pull", "--quiet", "img"]
