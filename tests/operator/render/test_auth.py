"""`spec.runtime.authSecretRef`: the token's Secret mounted read-only, its file passed on."""

from __future__ import annotations

from typing import Any

from fleetserve_operator import contract
from fleetserve_operator.render import child_key, desired_children
from fleetserve_operator.spec import InferenceServiceStatus, RolloutPhase, RolloutStatus
from fleetserve_operator.testing import make_spec
from tests.operator.render.rendered import OWNER

AUTH = {"authSecretRef": {"name": "demo-tokens", "key": "current"}}
FALLBACK = {"enabled": True}


def _pods(spec: Any, status: InferenceServiceStatus) -> dict[str, dict[str, Any]]:
    """Pod spec of each track's Deployment, by Deployment name."""
    children = desired_children(OWNER, spec, status)
    return {
        child_key(c)[1]: c["spec"]["template"]["spec"]
        for c in children
        if c["kind"] == "Deployment"
    }


def _token_file(pod: dict[str, Any]) -> str | None:
    args: list[str] = pod["containers"][0]["args"]
    return args[args.index("--auth-token-file") + 1] if "--auth-token-file" in args else None


def test_secret_is_mounted_read_only_as_a_directory_and_its_file_passed() -> None:
    """A Secret volume projecting the key as `token`, mounted read-only without subPath."""
    pods = _pods(make_spec(runtime=AUTH, fallback=FALLBACK), InferenceServiceStatus())
    for name in ("demo-stable", "demo-fallback"):
        pod = pods[name]
        volume = next(v for v in pod["volumes"] if "secret" in v)
        assert volume["secret"] == {
            "secretName": "demo-tokens",
            "items": [{"key": "current", "path": "token"}],
            "defaultMode": 0o440,
        }
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
        # A subPath mount would pin the file: the kubelet only updates whole Secret volumes.
        assert mount == {"name": volume["name"], "mountPath": contract.AUTH_MOUNT, "readOnly": True}
        assert _token_file(pod) == f"{contract.AUTH_MOUNT}/token" == contract.AUTH_TOKEN_FILE


def test_without_a_secret_there_is_no_token_file() -> None:
    """No authSecretRef: no Secret volume and no `--auth-token-file`."""
    pods = _pods(make_spec(fallback=FALLBACK), InferenceServiceStatus())
    for pod in pods.values():
        assert not [v for v in pod["volumes"] if "secret" in v]
        assert _token_file(pod) is None


def test_enabling_auth_is_rolled_out_through_the_canary() -> None:
    """The canary runs the new spec's auth; stable and fallback keep stable's until promoted."""
    before = make_spec(fallback=FALLBACK)
    after = make_spec(runtime=AUTH, fallback=FALLBACK)
    assert after.gpu_track.digest != before.gpu_track.digest
    rolling = InferenceServiceStatus(
        phase=RolloutPhase.PROGRESSING,
        canary_weight=5,
        rollout=RolloutStatus(stable_spec=before.gpu_track, stable_hash=before.gpu_track.digest),
    )
    pods = _pods(after, rolling)
    tokens = {name: _token_file(pod) for name, pod in pods.items()}
    assert tokens == {
        "demo-stable": None,
        "demo-canary": contract.AUTH_TOKEN_FILE,
        "demo-fallback": None,
    }
