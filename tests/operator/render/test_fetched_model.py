"""A fetched model (s3, oci, https, hf) renders an init container that fetches it into a volume.

The runtime container mounts that volume read-only and serves the installed copy; only the
fetch container sees the store's credentials and CA; no other model gets any of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator import contract
from fleetserve_operator.testing import make_spec
from tests.operator.render.rendered import children_by_key, flag_value

DIGEST = "sha256:" + "a" * 64
S3 = {
    "name": "enc",
    "version": "2",
    "uri": "s3://models/enc/2",
    "digest": DIGEST,
    "maxBytes": "1Gi",
    "storage": {
        "secretName": "store-keys",
        "caConfigMap": "store-ca",
        "endpoint": "https://objects.local:8333",
        "region": "us-east-1",
        "addressing": "path",
    },
}
TRACKS = ("demo-stable", "demo-fallback")


def _pods(model: dict[str, Any]) -> list[Any]:
    spec = make_spec(model=model, fallback={"enabled": True})
    children = children_by_key(spec)
    return [children[("Deployment", name)]["spec"]["template"]["spec"] for name in TRACKS]


def test_an_s3_model_is_fetched_by_an_init_container_on_every_track() -> None:
    """Fetch flags from the spec, credentials and CA mounted into the fetch container only."""
    for pod in _pods(S3):
        (fetch,) = pod["initContainers"]
        (runtime,) = pod["containers"]
        assert fetch["command"] == list(contract.FETCH_COMMAND)
        assert fetch["image"] == runtime["image"]
        args = fetch["args"]
        assert flag_value(args, "--uri") == "s3://models/enc/2"
        assert flag_value(args, "--dest") == contract.MODEL_MOUNT
        assert flag_value(args, "--digest") == DIGEST
        assert flag_value(args, "--max-bytes") == str(2**30)
        assert flag_value(args, "--s3-endpoint") == "https://objects.local:8333"
        assert flag_value(args, "--s3-region") == "us-east-1"
        assert flag_value(args, "--s3-addressing") == "path"
        assert flag_value(args, "--credentials-dir") == contract.STORAGE_CREDENTIALS_MOUNT
        assert flag_value(args, "--ca-file") == contract.STORAGE_CA_FILE
        assert "--allow-http" not in args
        fetch_mounts = {m["name"]: m for m in fetch["volumeMounts"]}
        assert fetch_mounts["model"] == {"name": "model", "mountPath": contract.MODEL_MOUNT}
        assert fetch_mounts["storage-credentials"]["readOnly"] is True
        assert fetch_mounts["storage-ca"]["mountPath"] == contract.STORAGE_CA_MOUNT
        runtime_mounts = {m["name"]: m for m in runtime["volumeMounts"]}
        assert runtime_mounts["model"]["readOnly"] is True
        assert "storage-credentials" not in runtime_mounts
        assert "storage-ca" not in runtime_mounts
        served = f"file://{contract.MODEL_MOUNT}/{contract.FETCHED_MODEL_DIR}"
        assert flag_value(runtime["args"], "--model") == served
        volumes = {v["name"]: v for v in pod["volumes"]}
        # Room for the download beside the installed copy.
        assert volumes["model"] == {"name": "model", "emptyDir": {"sizeLimit": str(2 * 2**30)}}
        assert volumes["storage-credentials"]["secret"]["secretName"] == "store-keys"
        assert volumes["storage-ca"]["configMap"]["name"] == "store-ca"


def test_the_fetch_container_is_as_locked_down_as_the_runtime() -> None:
    """Non-root, read-only root, no privilege, bounded memory, JSON termination message."""
    for pod in _pods(S3):
        (fetch,) = pod["initContainers"]
        (runtime,) = pod["containers"]
        assert fetch["securityContext"] == runtime["securityContext"]
        assert fetch["securityContext"]["readOnlyRootFilesystem"] is True
        assert fetch["terminationMessagePolicy"] == "File"
        assert fetch["resources"]["limits"]["memory"]
        assert pod["automountServiceAccountToken"] is False


def test_an_hf_endpoint_is_the_hub_mirror() -> None:
    """`storage.endpoint` of an hf:// model goes to `--hf-endpoint`, never to the S3 flag."""
    model = {"name": "m", "version": "1", "uri": "hf://org/m@" + "c" * 40,
             "storage": {"endpoint": "https://hub-mirror.local"}}  # fmt: skip
    for pod in _pods(model):
        args = pod["initContainers"][0]["args"]
        assert flag_value(args, "--hf-endpoint") == "https://hub-mirror.local"
        assert "--s3-endpoint" not in args


@pytest.mark.parametrize(
    ("model", "absent"),
    [
        ({"name": "m", "version": "1", "uri": "https://files.local/m.tar.gz", "digest": DIGEST},
         ("--credentials-dir", "--ca-file", "--s3-endpoint", "--s3-region", "--s3-addressing")),
        ({"name": "m", "version": "1", "uri": "hf://org/m@" + "c" * 40},
         ("--digest", "--credentials-dir", "--s3-endpoint")),
    ],
    ids=["https", "hf"],
)  # fmt: skip
def test_only_the_flags_the_spec_sets_are_rendered(
    model: dict[str, Any], absent: tuple[str, ...]
) -> None:
    """Unset storage options leave the fetch's own defaults; maxBytes unset is 64 GiB."""
    for pod in _pods(model):
        args = pod["initContainers"][0]["args"]
        assert not set(absent) & set(args)
        assert flag_value(args, "--max-bytes") == str(64 * 2**30)
        assert {v["name"] for v in pod["volumes"]} & {"storage-credentials", "storage-ca"} == set()


def test_plain_http_is_fetched_only_when_allowed() -> None:
    """`storage.allowHttp` is the one way to an `--allow-http` fetch."""
    model = {"name": "m", "version": "1", "uri": "http://files.local/m.onnx", "digest": DIGEST,
             "storage": {"allowHttp": True}}  # fmt: skip
    for pod in _pods(model):
        assert "--allow-http" in pod["initContainers"][0]["args"]


@pytest.mark.parametrize(
    "uri", ["builtin://minilm-l6", "file:///models/enc.onnx", "pvc://claim/enc.onnx"]
)
def test_models_in_the_image_or_a_claim_get_no_fetch(uri: str) -> None:
    """No init container and no emptyDir model volume unless the model is fetched."""
    for pod in _pods({"name": "m", "version": "1", "uri": uri}):
        assert "initContainers" not in pod
        assert all("emptyDir" not in v for v in pod["volumes"] if v["name"] == "model")


def test_fetch_args_refuse_a_model_that_is_not_fetched() -> None:
    """A caller cannot render a fetch for a builtin by mistake."""
    spec = make_spec(model={"name": "m", "version": "1", "uri": "builtin://minilm-l6"})
    with pytest.raises(ValueError, match="is not fetched"):
        contract.fetch_args(spec.model)


def test_a_node_cache_is_a_host_path_only_the_fetch_mounts() -> None:
    """`cache: node`: the hostPath volume, mounted read-write by the fetch, never the runtime."""
    for pod in _pods({**S3, "cache": "node"}):
        (volume,) = [v for v in pod["volumes"] if "hostPath" in v]
        assert volume["hostPath"] == {"path": contract.NODE_CACHE_PATH, "type": "DirectoryOrCreate"}
        (fetch,) = pod["initContainers"]
        (runtime,) = pod["containers"]
        assert flag_value(fetch["args"], "--cache-dir") == contract.NODE_CACHE_PATH
        assert {"name": volume["name"], "mountPath": contract.NODE_CACHE_PATH} in fetch[
            "volumeMounts"
        ]
        assert volume["name"] not in {m["name"] for m in runtime["volumeMounts"]}
    for pod in _pods(S3):
        assert not [v for v in pod["volumes"] if "hostPath" in v]
        assert "--cache-dir" not in pod["initContainers"][0]["args"]
