"""Pure: the runtime pod template of one track (container, probes, security, volumes).

`tracks` plans every track as a `TrackPlan` (defined here, where it is read, so this module
needs nothing of `tracks`) and `children` calls `pod_template` for the track's Deployment. The
container runs `fleetserve-runtime serve` with flags from `contract`; the pod is hardened as
the restricted Pod Security Standard asks (non-root, read-only root filesystem, no privilege
escalation, all capabilities dropped, RuntimeDefault seccomp), so the chart can label
namespaces `restricted`. The track's pods spread over nodes and zones
(`scaling.topology_spread`) and may carry a PriorityClass. The container's port `http` is
always there; `grpc` only when `spec.runtime.grpc` is enabled on the track's pods.

A generative model's pods also get the engine's `--generation-*` flags, and a terminating
pod keeps serving for `generation.drainSeconds`: Gateway API and Services move only new
requests off a pod, so the streams it has started finish on it, and the runtime ends
whatever still streams only when the kubelet sends SIGTERM after that drain.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from fleetserve_operator import contract
from fleetserve_operator.records import Manifest
from fleetserve_operator.render.scaling import topology_spread
from fleetserve_operator.spec import (
    Backend,
    GenerationSpec,
    GpuTrackSpec,
    Precision,
    Resources,
    Toleration,
    TopologySpread,
)
from fleetserve_operator.spec.model_source import ModelCache, ModelStorage

__all__ = [
    "DRAIN_SECONDS",
    "RUNTIME_UID",
    "SHUTDOWN_SECONDS",
    "TrackPlan",
    "container_security_context",
    "pod_template",
    "runtime_args",
]

DRAIN_SECONDS = 5
"""How long a terminating runtime pod keeps serving before it is sent SIGTERM."""
SHUTDOWN_SECONDS = 25
"""What the grace period leaves after the drain for the runtime to stop once SIGTERMed (its
HTTP server waits up to 10 s for open requests, then the engines stop)."""
# The runtime image's non-root user (distroless convention); Dockerfile.runtime creates it.
RUNTIME_UID = 65532
MODEL_VOLUME = "model"
TMP_VOLUME = "tmp"
AUTH_VOLUME = "auth"
PRIORITY_VOLUME = "priority"
TENANTS_VOLUME = "tenants"
TLS_VOLUME = "tls"
STORAGE_CREDENTIALS_VOLUME = "storage-credentials"
STORAGE_CA_VOLUME = "storage-ca"
SHADOW_VOLUME = "shadow-target"
NODE_CACHE_VOLUME = "model-cache"
# The fetch downloads beside the finished model and unpacks archives there before it renames,
# so the volume holds up to twice the model for a moment.
FETCH_VOLUME_FACTOR = 2
# What the fetch itself needs: it streams to disk and hashes as it goes.
FETCH_RESOURCES: Manifest = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
# Owner and group may read the tokens and the TLS key (the pod's fsGroup is the runtime's
# group); nobody writes.
AUTH_FILE_MODE = 0o440
# Loading and warming a model can take minutes; the startup probe waits up to 10 minutes for
# readiness before the liveness probe takes over. It asks readiness, not liveness: a replica is
# live while it loads, so a load that hangs would otherwise never be restarted. (A load that
# fails ends the process, which the kubelet reports at once.)
STARTUP_PROBE_FAILURES = 120


@dataclass(frozen=True, slots=True)
class TrackPlan:
    """What one track's Deployment runs; `replicas` None leaves the count to an autoscaler."""

    config: contract.TrackConfig
    image: str
    """The image of the runtime container and of the model fetch's init container."""
    replicas: int | None
    resources: Resources
    node_selector: dict[str, str]
    tolerations: list[Toleration]
    pods: GpuTrackSpec
    """The model, runtime and memory sections the pods are rendered from."""
    spec_hash: str | None = None
    """`pods.digest` on the GPU tracks (their spec-hash label); None on the fallback."""
    generation: GenerationSpec | None = None
    """The engine's knobs of a generative model on this track; None for an encoder."""
    precision: Precision = "fp32"
    """The model's numeric precision on this track (`--precision`)."""
    backend: Backend = "auto"
    """What runs the model on this track (`--backend`)."""
    spread: TopologySpread = TopologySpread.SCHEDULE_ANYWAY
    """How the track's pods spread across nodes and zones."""
    priority_class_name: str | None = None
    """The pods' PriorityClass; None: the cluster's default."""
    follows_shadow: bool = False
    """The stable track with `rollout.shadow`: its pods mount the shadow stage's ConfigMap
    and copy to the target it holds (`--shadow-file`), always, so that the stage's start
    and end restart none of them."""

    @property
    def drain_seconds(self) -> int:
        """How long a terminating pod keeps serving before SIGTERM (its preStop sleep)."""
        if self.generation is None:
            return DRAIN_SECONDS
        return max(DRAIN_SECONDS, self.generation.drain_seconds)


def runtime_args(plan: TrackPlan) -> list[str]:
    """The runtime's flags: `contract.render_args`, and a generative model's engine knobs."""
    args = contract.render_args(pods=plan.pods, config=plan.config)
    if plan.follows_shadow:
        args += contract.as_args(contract.shadow_flags(tls=_serves_tls(plan.pods)))
    # fp32 is the runtime's default: leaving it out keeps a runtime image older than the
    # flag starting.
    if plan.precision != "fp32":
        args.append(f"--precision={plan.precision}")
    # Likewise `auto`; it also leaves the pods of services that never set a backend as they
    # were, so an operator upgrade starts no rollout.
    if plan.backend != "auto":
        args.append(f"--backend={plan.backend}")
    knobs = plan.generation
    if knobs is None:
        return args
    values = {
        "kv-cache-fraction": knobs.kv_cache_fraction,
        "block-size": knobs.block_size,
        "max-running-sequences": knobs.max_running_sequences,
        "max-step-tokens": knobs.max_step_tokens,
        "max-context": knobs.max_context,
        "default-timeout-ms": knobs.default_timeout_ms,
        "max-timeout-ms": knobs.max_timeout_ms,
    }
    for flag, value in values.items():
        args += [f"--generation-{flag}", str(value)]
    caching = "" if knobs.prefix_caching else "no-"
    args.append(f"--{caching}generation-prefix-caching")
    # Only when set away from the runtime's defaults (equal to the spec's): the pods of
    # services that never set them keep their args, so an operator upgrade restarts none.
    defaults = GenerationSpec()
    for flag, value, default in (
        ("default-max-tokens", knobs.default_max_tokens, defaults.default_max_tokens),
        ("max-output-tokens", knobs.max_output_tokens, defaults.max_output_tokens),
    ):
        if value != default:
            args += [f"--generation-{flag}", str(value)]
    if knobs.allow_ignore_eos:
        args.append("--generation-allow-ignore-eos")
    return args


def _serves_tls(spec: GpuTrackSpec) -> bool:
    """Whether the pods serve TLS (`spec.runtime.tls`): probes and scrapes then use HTTPS."""
    return spec.runtime.tls is not None


def _probe(path: str, tls: bool, *, period_s: int, failures: int) -> Manifest:
    get: Manifest = {"path": path, "port": "http"}
    # Plain HTTP is the API server's default scheme: left out, the pods of services without
    # TLS keep their template across an operator upgrade. The kubelet does not verify the
    # certificate of an HTTPS probe.
    if tls:
        get["scheme"] = "HTTPS"
    return {
        "httpGet": get,
        "periodSeconds": period_s,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def container_security_context() -> Manifest:
    """Every container of a runtime pod: restricted Pod Security, read-only root, no capability."""
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _resources(plan: TrackPlan) -> Manifest:
    resources: Manifest = {}
    if plan.resources.requests:
        resources["requests"] = {k: str(v) for k, v in plan.resources.requests.items()}
    if plan.resources.limits:
        resources["limits"] = {k: str(v) for k, v in plan.resources.limits.items()}
    return resources


def _volumes(spec: GpuTrackSpec) -> tuple[list[Manifest], list[Manifest]]:
    """(volumes, mounts): a writable /tmp, and read-only the model's PVC and the auth Secret."""
    # The root filesystem is read-only; torch and tokenizers still want a scratch directory.
    volumes: list[Manifest] = [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}]
    mounts: list[Manifest] = [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    source = contract.pvc_source(spec.model)
    if source is not None:
        volumes.append(
            {
                "name": MODEL_VOLUME,
                "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True},
            }
        )
    if spec.model.fetched:
        size = FETCH_VOLUME_FACTOR * contract.fetch_budget_bytes(spec.model)
        volumes.append({"name": MODEL_VOLUME, "emptyDir": {"sizeLimit": str(size)}})
        volumes += _storage_volumes(spec.model.storage)
    if spec.model.cache is ModelCache.NODE:
        cache = {"path": contract.NODE_CACHE_PATH, "type": "DirectoryOrCreate"}
        volumes.append({"name": NODE_CACHE_VOLUME, "hostPath": cache})
    if source is not None or spec.model.fetched:
        mounts.append({"name": MODEL_VOLUME, "mountPath": contract.MODEL_MOUNT, "readOnly": True})
    runtime = spec.runtime
    token = contract.AUTH_TOKEN_KEY
    tenants = None if runtime.tenants is None else runtime.tenants.secret_ref
    secrets = [
        (AUTH_VOLUME, contract.AUTH_MOUNT, runtime.auth_secret_ref, token),
        (PRIORITY_VOLUME, contract.PRIORITY_MOUNT, runtime.priority_token_secret_ref, token),
        (TENANTS_VOLUME, contract.TENANTS_MOUNT, tenants, contract.TENANTS_KEY),
    ]
    for name, mount, ref, path in secrets:
        if ref is not None:
            items = [{"key": ref.key, "path": path}]
            volumes.append(_secret_volume(name, ref.name, items))
            mounts.append({"name": name, "mountPath": mount, "readOnly": True})
    if runtime.tls is not None:
        keys = [{"key": key, "path": key} for key in ("tls.crt", "tls.key")]
        volumes.append(_secret_volume(TLS_VOLUME, runtime.tls.secret_name, keys))
        mounts.append({"name": TLS_VOLUME, "mountPath": contract.TLS_MOUNT, "readOnly": True})
    return volumes, mounts


def _storage_volumes(storage: ModelStorage | None) -> list[Manifest]:
    """The Secret and ConfigMap the fetch container reads (never the runtime container)."""
    volumes: list[Manifest] = []
    if storage is not None and storage.secret_name is not None:
        volumes.append(
            {
                "name": STORAGE_CREDENTIALS_VOLUME,
                "secret": {"secretName": storage.secret_name, "defaultMode": AUTH_FILE_MODE},
            }
        )
    if storage is not None and storage.ca_config_map is not None:
        items = [{"key": contract.STORAGE_CA_KEY, "path": contract.STORAGE_CA_KEY}]
        volumes.append(
            {
                "name": STORAGE_CA_VOLUME,
                "configMap": {"name": storage.ca_config_map, "items": items},
            }
        )
    return volumes


def _fetch_container(plan: TrackPlan) -> Manifest:
    """The init container that fetches the model into the `model` volume, and nothing else.

    It runs the track's runtime image as the same non-root user with the same read-only root; the
    model volume is the only place it writes, and only it sees the store's credentials. It
    reports a failure as JSON (`reason`, `message`) in its termination message, which
    `observe.facts` turns into the service's `Degraded` reason.
    """
    spec = plan.pods
    storage = spec.model.storage
    mounts: list[Manifest] = [{"name": MODEL_VOLUME, "mountPath": contract.MODEL_MOUNT}]
    if storage is not None and storage.secret_name is not None:
        mounts.append(
            {
                "name": STORAGE_CREDENTIALS_VOLUME,
                "mountPath": contract.STORAGE_CREDENTIALS_MOUNT,
                "readOnly": True,
            }
        )
    if storage is not None and storage.ca_config_map is not None:
        mounts.append(
            {"name": STORAGE_CA_VOLUME, "mountPath": contract.STORAGE_CA_MOUNT, "readOnly": True}
        )
    if spec.model.cache is ModelCache.NODE:
        mounts.append({"name": NODE_CACHE_VOLUME, "mountPath": contract.NODE_CACHE_PATH})
    return {
        "name": contract.FETCH_CONTAINER_NAME,
        "image": plan.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": list(contract.FETCH_COMMAND),
        "args": contract.fetch_args(spec.model),
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "File",
        "resources": copy.deepcopy(FETCH_RESOURCES),
        "volumeMounts": mounts,
    }


def _secret_volume(name: str, secret: str, items: list[Manifest]) -> Manifest:
    return {
        "name": name,
        "secret": {"secretName": secret, "items": items, "defaultMode": AUTH_FILE_MODE},
    }


def _ports(spec: GpuTrackSpec) -> list[Manifest]:
    """The container's ports: `http`, and `grpc` when the pods serve gRPC."""
    ports: list[Manifest] = [
        {"name": "http", "containerPort": contract.HTTP_PORT, "protocol": "TCP"}
    ]
    grpc = spec.runtime.grpc
    if grpc.enabled:
        ports.append({"name": "grpc", "containerPort": grpc.port, "protocol": "TCP"})
    return ports


def _container(plan: TrackPlan, mounts: list[Manifest]) -> Manifest:
    spec = plan.pods
    tls = _serves_tls(spec)
    container: Manifest = {
        "name": contract.CONTAINER_NAME,
        "image": plan.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": list(contract.COMMAND),
        "args": runtime_args(plan),
        "ports": _ports(spec),
        "startupProbe": _probe(
            contract.READY_PATH, tls, period_s=5, failures=STARTUP_PROBE_FAILURES
        ),
        "readinessProbe": _probe(contract.READY_PATH, tls, period_s=5, failures=2),
        "livenessProbe": _probe(contract.LIVE_PATH, tls, period_s=10, failures=3),
        "securityContext": container_security_context(),
        # The runtime writes why it stopped (a model that cannot load) to stderr; the kubelet
        # puts the log's tail into the container's termination message, which the operator
        # reports in status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        # Keep serving for a moment after deletion starts: endpoints and gateways stop routing
        # to a terminating pod only after a propagation delay, and without this the requests
        # sent in that window (promotion, rollback, scale-down) are refused; a generative
        # pod's streams finish in it. Native sleep action: the runtime image needs no shell.
        "lifecycle": {"preStop": {"sleep": {"seconds": plan.drain_seconds}}},
    }
    env = [var.model_dump(by_alias=True, exclude_none=True) for var in spec.runtime.env]
    if env:
        container["env"] = env
    resources = _resources(plan)
    if resources:
        container["resources"] = resources
    return container


def pod_template(
    plan: TrackPlan,
    labels: dict[str, str],
    selector: dict[str, str],
    *,
    shadow_target: str | None = None,
) -> Manifest:
    """The pod template of `plan`'s track, labelled `labels` (those of its Deployment).

    `selector` picks the track's own pods, which its topology spread balances;
    `shadow_target` names the ConfigMap a track that `follows_shadow` mounts.
    """
    spec = plan.pods
    volumes, mounts = _volumes(spec)
    if plan.follows_shadow and shadow_target is not None:
        # Optional: the pods start before the operator writes the ConfigMap, and then see it
        # appear in the directory, as they see its later changes.
        config_map = {"name": shadow_target, "optional": True}
        volumes.append({"name": SHADOW_VOLUME, "configMap": config_map})
        mounts.append({"name": SHADOW_VOLUME, "mountPath": contract.SHADOW_MOUNT, "readOnly": True})
    pod: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "fsGroup": RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": plan.drain_seconds + SHUTDOWN_SECONDS,
        "containers": [_container(plan, mounts)],
        "volumes": volumes,
    }
    if spec.model.fetched:
        pod["initContainers"] = [_fetch_container(plan)]
    if spec.runtime.service_account_name:
        pod["serviceAccountName"] = spec.runtime.service_account_name
    if plan.node_selector:
        pod["nodeSelector"] = dict(plan.node_selector)
    if plan.tolerations:
        pod["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in plan.tolerations
        ]
    spread = topology_spread(selector, plan.spread)
    if spread:
        pod["topologySpreadConstraints"] = spread
    if plan.priority_class_name:
        pod["priorityClassName"] = plan.priority_class_name
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(contract.HTTP_PORT),
        "prometheus.io/path": contract.METRICS_PATH,
    }
    if _serves_tls(spec):
        annotations["prometheus.io/scheme"] = "https"
    return {"metadata": {"labels": dict(labels), "annotations": annotations}, "spec": pod}
