"""One reconcile: parse, observe, step the rollout, render, check, record, apply, report.

`handlers` calls `Sync.run` for every trigger. The decisions are the pure modules'
(`rollout`, `render`, `observe`); this module only sequences them with the I/O
of `kube` and `analysis`, so that the same steps run whatever the trigger. The spec is parsed
first, the runtime images it leaves unset set to the operator's defaults, with what the
schema cannot check (`render.check_semantics`, the Prometheus URL against the operator's
allowlist, the model's PVC); a spec that fails is reported in status and nothing else is
done, but for an invalid one the rollout's table decides the phase (`Failed`, from
`rollout.next_step` without a spec). Then:

1. gather the rollout's `Facts`: the GPU tracks' Deployments and pods, the command
   annotations, the stable track's error ratio, and the analysis when one is due (in
   sequential mode, the tests' evidence at every look, and a result on a rejection);
2. `rollout.next_step` decides the new status; when that advances a step by itself and
   the spec has `confirm` webhooks, they are asked (`webhooks`) and the rollout steps
   again with their answer as a fact;
3. the children are rendered from that status, and every one that must be written is
   checked before any is: a name taken by an object this InferenceService does not control
   stops the reconcile (`ChildConflict`, the object is left alone), and every write is
   dry-run on the API server, so a refused child (`ChildRefused`) leaves nothing half built;
   but in a service's first reconcile (no status, nothing of it found) its children are
   created without dry-runs, Deployments last, and deleted again when a create fails,
   which also leaves nothing built (and, on a refusal, the rollout where it was), for one
   request per child less
   (`ChildWriter.create_first`);
4. write-ahead: when children are to be written or deleted, the new status is written
   first, so a restarted operator renders them from the step they were written for and
   traffic never runs ahead of status (weights only move forward, or to 0 on a rollback);
   the children to be created count as created in it, so that it tells the track they
   start rolling out, and the report of step 6 has nothing to add when they are;
5. the children are created or applied where they drifted, stale ones deleted, in
   `render.converge_phase` order: what a route is to name before the routes, what it
   stops naming after them, so that whichever write the operator dies after, no route
   names a missing backend (a promotion moves the routes to stable before the canary goes);
6. the status is written (with what failed after the children were applied: crashing
   pods, unpullable images, a ReplicaSet that may not create pods) and exported as gauges;
   what the reconcile changed (status transitions, children written) is posted as one
   Event, each Warning as its own (`observe.reconcile_events`), also when it failed part
   way; then the transition's side effects (the rollout's Events, counters, clearing a
   command annotation, queueing `notify` webhooks) are applied. Weights, replica counts,
   the canary and the stable track's spec are not actions at all: they follow from the
   status in step 5.

Steps 3 and 5, the children's checks and writes, are `child_writes.ChildWriter`'s.
When the children cannot be written (step 3), the rollout does not move: status keeps the
previous step, with the reason in `Degraded`.

It writes nothing when nothing changed: a child is applied only when it drifted from the
desired object, and status only when it differs from the current one (an operator restart
therefore writes nothing). Reconciles of one InferenceService are serialised; different
ones run in parallel.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from fleetserve_operator import analysis, contract, naming, observe, render, rollout
from fleetserve_operator.analysis import (
    MetricSource,
    PrometheusSource,
    read_memory_figures,
)
from fleetserve_operator.analysis.allowlist import PrometheusAllowlist, UrlAllowlist
from fleetserve_operator.controller.child_writes import ChildWriter
from fleetserve_operator.controller.kube import Cluster, ObjectRef
from fleetserve_operator.controller.looks import MetricLooks
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.webhooks import Webhooks
from fleetserve_operator.errors import (
    DependencyMissing,
    InvalidSpec,
    MetricsUnavailable,
    SpecError,
    bounded,
)
from fleetserve_operator.naming import TRACK_LABEL, Track
from fleetserve_operator.observe import Observation
from fleetserve_operator.records import (
    EventNote,
    Manifest,
    Problem,
    TrackFetch,
    json_copy,
    rfc3339,
)
from fleetserve_operator.render import Owner
from fleetserve_operator.spec import (
    GpuTrackSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RuntimeImages,
    TrafficProvider,
)

__all__ = ["Sync", "utc_now"]

logger = logging.getLogger(__name__)
_MAX_FIELD_PART = 64
"""Longest part of a field path in an error: far longer than any field's name, so only a
map key (a label key, a resource name) is ever cut."""
_BUILT_IN_IMAGES = RuntimeImages()


def utc_now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return datetime.now(UTC)


@dataclass(slots=True)
class _Pass:
    """One reconcile as it goes: what is reported at its end, wherever it stopped."""

    ref: ObjectRef
    owner: Owner
    now: datetime
    previous: InferenceServiceStatus
    """The status last written (the one read, or the one written ahead of the children)."""
    status: InferenceServiceStatus
    """The status the rollout decided; reported at the end."""
    observed: list[Manifest]
    """The children this service controls, as last read or written."""
    taken: set[tuple[str, str]]
    """(kind, name) of objects labelled as this service's children that it does not control."""
    actions: tuple[rollout.Action, ...] = ()
    problem: Problem | None = None
    fetches: Mapping[Track, TrackFetch] = field(default_factory=dict)
    canary_only: bool = False
    """The umbrella Service selects the canary's pods alone (`rollout.canary_only`)."""
    stable_only: bool = False
    """The umbrella Service selects the stable pods alone (`rollout.stable_only`)."""
    first: bool = False
    """The service's first reconcile: no status written and nothing of it found, so its
    children are created unchecked and undone when one fails (`ChildWriter.create_first`)."""
    notes: list[EventNote] = field(default_factory=list)
    """What changed (status transitions, children written), posted as the reconcile's Events."""


@dataclass(frozen=True, slots=True)
class _ParsedSpec:
    """A spec as parsed and checked, for the object and generation it was read from."""

    uid: str
    generation: int
    raw: Mapping[str, Any]
    spec: InferenceServiceSpec


@dataclass(frozen=True, slots=True)
class _Rendered:
    """The children rendered from one set of inputs, for a reconcile that has the same ones.

    `spec` is compared by identity: `Sync._checked_spec` hands out the same object for as
    long as the raw spec is unchanged. `status` is the part rendering reads
    (`render.rendered_status`).
    """

    owner: Owner
    spec: InferenceServiceSpec
    status: InferenceServiceStatus
    observed_stable_replicas: int
    prometheus_url: str | None
    children: list[Manifest]

    def serves(
        self,
        owner: Owner,
        spec: InferenceServiceSpec,
        status: InferenceServiceStatus,
        observed_stable_replicas: int,
        prometheus_url: str | None,
    ) -> bool:
        """Whether these children are what `render.desired_children` would return for these."""
        return self.spec is spec and (
            self.owner,
            self.observed_stable_replicas,
            self.prometheus_url,
            self.status,
        ) == (owner, observed_stable_replicas, prometheus_url, status)


def _spec_error(exc: ValidationError) -> InvalidSpec:
    """The first schema error, naming its field; the whole text is bounded by `InvalidSpec`.

    A map key the schema refuses is part of the error's location, and an object stored
    under an older CRD may carry one of any length: every part is cut at `_MAX_FIELD_PART`.
    """
    first = exc.errors()[0]
    parts = (bounded(str(part), _MAX_FIELD_PART) for part in first["loc"])
    return InvalidSpec(".".join(["spec", *parts]), first["msg"])


class Sync:
    """Reconciles InferenceServices through `kube`; shared by every handler.

    `prometheus_allowlist` judges a spec's `rollout.analysis.prometheusUrl` when the spec is
    parsed, so a URL outside it is an invalid spec at once, not when an analysis first falls
    due; None accepts every URL there (tests). `metric_source` makes the source a URL is
    queried through (the operator's refuses a URL outside the allowlist again).
    `webhook_allowlist` judges each `rollout.webhooks[].url` in the same way, and the
    webhooks refuse to call a URL outside it again; None accepts every URL (tests). `images`
    fill in the runtime images a spec leaves unset, as it is parsed. `write_threads`: threads
    that make a reconcile's independent requests beside it (`ChildWriter`).
    """

    def __init__(
        self,
        kube: Cluster,
        *,
        metrics: OperatorMetrics,
        default_prometheus_url: str | None = None,
        prometheus_allowlist: PrometheusAllowlist | None = None,
        webhook_allowlist: UrlAllowlist | None = None,
        metric_source: Callable[[str], MetricSource] = PrometheusSource,
        images: RuntimeImages = _BUILT_IN_IMAGES,
        clock: Callable[[], datetime] = utc_now,
        write_threads: int = 0,
    ) -> None:
        self._kube = kube
        self._children = ChildWriter(kube, metrics, write_threads=write_threads)
        self._metrics = metrics
        self._prometheus_allowlist = prometheus_allowlist
        self._webhook_allowlist = webhook_allowlist
        self._looks = MetricLooks(metric_source, default_prometheus_url)
        self._images = images
        self._clock = clock
        self.webhooks = Webhooks(
            kube, metrics.webhook_failures, clock=clock, allowlist=webhook_allowlist
        )
        # Weak values: a service's lock lives only while a reconcile holds or awaits it, so
        # the operator keeps nothing for the services deleted over its lifetime.
        self._locks: weakref.WeakValueDictionary[tuple[str, str], threading.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._locks_guard = threading.Lock()
        self._specs: dict[tuple[str, str], _ParsedSpec] = {}
        """The last spec each service parsed: a resync or a child event finds it unchanged."""
        self._rendered: dict[tuple[str, str], _Rendered] = {}
        """The children each service rendered last: most reconciles render the same again."""
        self.reconcile_count = 0

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def run(self, body: Mapping[str, Any], *, trigger: str) -> SpecError | None:
        """`run_by_name` for the InferenceService `body` (only its name is used)."""
        meta = body["metadata"]
        return self.run_by_name(meta["namespace"], meta["name"], trigger=trigger)

    def run_by_name(self, namespace: str, name: str, *, trigger: str) -> SpecError | None:
        """Reconcile one InferenceService, if it exists and is not going; returns its spec error.

        The object is read inside the lock: a body read before it (kopf's, or one read while
        another reconcile ran) may predate the status that reconcile wrote, and reporting
        from it would write that status and post its Events a second time.

        Raises:
            ClusterUnavailable: the API server failed; retry later.
        """
        lock = self._lock(namespace, name)
        started = time.monotonic()
        result = "error"
        try:
            with lock:
                body = self._kube.get_inference_service(namespace, name)
                if body is not None and naming.LEGACY_FINALIZER in (
                    body["metadata"].get("finalizers") or ()
                ):
                    body = self._kube.remove_finalizer(body, naming.LEGACY_FINALIZER)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    # A service on its way out exports nothing, before its DELETED event.
                    self._drop(namespace, name)
                    result = "gone"
                    return None
                error = self._converge_and_report(body)
            result = "ok" if error is None else error.reason
            return error
        finally:
            self.reconcile_count += 1
            self._metrics.reconciles.labels(trigger, result).inc()
            self._metrics.duration_seconds.labels(trigger).observe(time.monotonic() - started)
            if result not in ("ok", "gone"):
                self._metrics.errors.labels(result).inc()

    def _drop(self, namespace: str, name: str) -> None:
        """Forget what is kept of a service gone (its gauges, spec and children rendered)."""
        self._metrics.forget_service(namespace, name)
        self._specs.pop((namespace, name), None)
        self._rendered.pop((namespace, name), None)

    def _converge_and_report(self, body: Mapping[str, Any]) -> SpecError | None:
        meta = body["metadata"]
        ref = ObjectRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        previous = InferenceServiceStatus.model_validate(body.get("status") or {})
        owner = Owner(name=ref.name, namespace=ref.namespace, uid=ref.uid)
        now = self._clock()
        error: SpecError | None = None
        # From the raw spec: a spec error (a PVC gone mid-rollout) must not change it.
        provider = body["spec"].get("traffic", {}).get("provider")
        routes_by_weight = provider == TrafficProvider.GATEWAY_API
        # Labels prove nothing: only children with this service's controller reference count.
        listed = self._kube.list_children(ref.namespace, ref.name)
        observed = [child for child in listed if render.is_controlled_by(owner, child)]
        taken = {render.child_key(child) for child in listed} - {
            render.child_key(child) for child in observed
        }

        def observation(children: list[Manifest], found: Problem | None) -> Observation:
            return Observation(
                generation=meta.get("generation", 0),
                deployments=_deployments_by_track(children),
                problem=found,
                now=rfc3339(now),
                routes_by_weight=routes_by_weight,
                fetches=run.fetches,
                canary_only=run.canary_only,
                stable_only=run.stable_only,
            )

        run = _Pass(
            ref, owner, now, previous=previous, status=previous, observed=observed, taken=taken,
            first=not body.get("status") and not listed,
        )  # fmt: skip
        try:
            try:
                self._step(run, body["spec"], meta, observation)
            except SpecError as exc:
                error = exc
                run.problem = Problem(exc.reason, str(exc))
                if isinstance(exc, InvalidSpec):
                    annotations = dict(meta.get("annotations") or {})
                    refused = rollout.next_step(
                        None, run.status, rollout.Facts(annotations=annotations), now
                    )
                    run.status, run.actions = refused.status, refused.actions
            reported = observe.compute_status(run.status, observation(run.observed, run.problem))
            self._report(run, reported)
        finally:
            # Also when the reconcile failed: what it changed before that happened.
            for event in observe.reconcile_events(run.notes):
                self._kube.post_event(ref, event)
        self._apply_effects(ref, run.actions)
        return error

    def _step(
        self,
        run: _Pass,
        raw_spec: Mapping[str, Any],
        meta: Mapping[str, Any],
        observation: Callable[[list[Manifest], Problem | None], Observation],
    ) -> None:
        """Steps 1 to 5 of a reconcile, recording in `run` what is to be reported.

        Raises:
            SpecError: the spec is invalid, or the children cannot be written; `run` holds
                what was decided and written before.
        """
        spec = self._checked_spec(run.owner, raw_spec, meta.get("generation", 0))
        deployments = _deployments_by_track(run.observed)
        pods = self._kube.list_pods(run.ref.namespace, run.ref.name) if deployments else []
        seen_facts = self._looks.facts(
            run.ref, spec, run.previous, deployments, pods, meta, run.now
        )
        step = rollout.next_step(spec, run.previous, seen_facts, run.now)
        if rollout.asks_confirmation(spec, run.previous, step):
            answer = self.webhooks.confirm(run.ref, spec, run.previous, step.status)
            seen_facts = replace(seen_facts, confirmation=answer)
            step = rollout.next_step(spec, run.previous, seen_facts, run.now)
        stable = seen_facts.stable
        desired = self._desired(run.owner, spec, step.status, stable.replicas if stable else 0)
        if run.first:
            writes = self._children.first_writes(run.owner, desired)
        else:
            writes = self._children.checked_writes(run.owner, desired, run.observed, run.taken)
        before = run.status
        run.status, run.actions = step.status, step.actions
        run.canary_only = rollout.canary_only(spec, step.status)
        run.stable_only = rollout.stable_only(spec, step.status)
        run.fetches = observe.track_fetches(deployments, pods)
        run.problem = observe.workload_problem(deployments, pods) or self._memory_problem(
            run.ref.namespace, spec, render.stable_pods(spec, run.previous)
        )
        stale = render.stale_children(run.owner, desired, run.observed)
        if writes or stale:
            # The children to create count as created: the status ahead then says what the
            # writes start (a track rolling out), not "every track is rolled out" as the
            # children before them did, and the report after them has nothing to add.
            created = [write.manifest for write in writes if write.current is None]
            ahead = observe.compute_status(
                run.status, observation([*run.observed, *created], run.problem)
            )
            self._report(run, ahead)
            run.previous = ahead
        if not run.first:
            run.observed = self._children.converge(
                run.owner, writes, stale, run.observed, run.notes
            )
            return
        try:
            run.observed = self._children.create_first(run.owner, writes, run.notes)
        except SpecError:
            # Undone: as after a refused dry-run, the rollout has not moved.
            run.status, run.actions = before, ()
            raise

    def _desired(
        self,
        owner: Owner,
        spec: InferenceServiceSpec,
        status: InferenceServiceStatus,
        observed_stable_replicas: int,
    ) -> list[Manifest]:
        """`render.desired_children`, rendered again only when one of its inputs changed.

        A child event or a resync of a settled service renders exactly what the last
        reconcile did, and rendering (with each child's applied-hash: its JSON and a
        SHA-256) was the largest share of such a reconcile's CPU. Only the part of the
        status rendering reads is compared: the ready counts and conditions that change
        while a service comes up render the same children. The caller gets its own copy.
        """
        key = (owner.namespace, owner.name)
        status = render.rendered_status(status)
        url = self._looks.prometheus_url(spec)
        last = self._rendered.get(key)
        if last is None or not last.serves(owner, spec, status, observed_stable_replicas, url):
            children = render.desired_children(
                owner,
                spec,
                status,
                observed_stable_replicas=observed_stable_replicas,
                prometheus_url=url,
            )
            last = _Rendered(owner, spec, status, observed_stable_replicas, url, children)
            self._rendered[key] = last
        return json_copy(last.children)

    def _apply_effects(self, ref: ObjectRef, actions: tuple[rollout.Action, ...]) -> None:
        """Events, counters and command annotations; the rest was rendered from status."""
        for action in actions:
            match action:
                case EventNote():
                    self._kube.post_event(ref, action)
                case rollout.IncrementCounter(counter=counter, reason=reason):
                    self._metrics.rollout_counter(counter).labels(reason).inc()
                case rollout.ClearAnnotation(annotation=annotation):
                    self._kube.remove_annotation(ref, annotation)
                    self._metrics.writes.labels(naming.KIND, "annotation").inc()
                case rollout.Notify():
                    self.webhooks.notify(ref, action)

    def _checked_spec(
        self, owner: Owner, raw: Mapping[str, Any], generation: int
    ) -> InferenceServiceSpec:
        """The spec, parsed and checked; its PVC is looked up on every reconcile.

        Parsing and the checks that read nothing but the spec run once per generation of
        the object: every other reconcile (a resync, a child event) reuses their result
        when the raw spec is still the same (compared, not trusted to the generation).
        """
        key = (owner.namespace, owner.name)
        parsed = self._specs.get(key)
        if parsed is None or (parsed.uid, parsed.generation, parsed.raw) != (
            owner.uid,
            generation,
            raw,
        ):
            parsed = _ParsedSpec(
                owner.uid, generation, copy.deepcopy(raw), self._parsed(owner, raw)
            )
            self._specs[key] = parsed
        spec = parsed.spec
        source = contract.pvc_source(spec.model)
        if source is not None and not self._kube.pvc_exists(owner.namespace, source.claim):
            msg = f"PersistentVolumeClaim {source.claim!r} does not exist in {owner.namespace}"
            raise DependencyMissing("spec.model.uri", msg)
        return spec

    def _parsed(self, owner: Owner, raw: Mapping[str, Any]) -> InferenceServiceSpec:
        """The spec with the operator's images, and every check that needs only the spec."""
        try:
            spec = InferenceServiceSpec.model_validate(raw).with_images(self._images)
        except ValidationError as exc:
            raise _spec_error(exc) from None
        render.check_semantics(owner, spec)
        checks = spec.rollout.analysis
        if checks is not None and self._prometheus_allowlist is not None:
            self._prometheus_allowlist.check(checks.prometheus_url)
        if self._webhook_allowlist is not None:
            for index, hook in enumerate(spec.rollout.webhooks):
                self._webhook_allowlist.check(hook.url, f"spec.rollout.webhooks[{index}].url")
        return spec

    def _memory_problem(
        self, namespace: str, spec: InferenceServiceSpec, stable: GpuTrackSpec
    ) -> Problem | None:
        """The memory check, from what the stable replicas of `spec.model.version` measured.

        `stable` is what they run: a generative model's figures depend on its engine knobs.
        """
        url = self._looks.prometheus_url(spec)
        if url is None or spec.memory.budget_bytes == 0:
            return None
        model = spec.model
        source = self._looks.metric_source(url)
        try:
            figures = read_memory_figures(
                source, namespace=namespace, model=model.name, version=model.version
            )
            if figures is not None and model.generates:
                blocks, block_bytes = [
                    source.query(
                        analysis.memory_query(
                            metric, namespace=namespace, model=model.name, version=model.version
                        )
                    )
                    for metric in (
                        contract.KV_CACHE_BLOCKS_METRIC,
                        contract.KV_CACHE_BLOCK_BYTES_METRIC,
                    )
                ]
                figures = replace(figures, kv_cache_blocks=blocks, kv_cache_block_bytes=block_bytes)
        except MetricsUnavailable as exc:
            logger.info("memory check of %s/%s skipped: %s", namespace, model.name, exc)
            return None
        if figures is None:
            return None
        return observe.memory_problem(spec, figures, stable.generation_knobs)

    def _report(self, run: _Pass, status: InferenceServiceStatus) -> None:
        """Write `status` if it differs from `run.previous`, note its transitions, export it.

        An unchanged status is exported too: a restarted operator's gauges start empty.
        """
        ref = run.ref
        if status != run.previous:
            self._kube.apply_status(
                ref, status.model_dump(by_alias=True, exclude_none=True, mode="json")
            )
            self._metrics.writes.labels("InferenceService", "status").inc()
            run.notes.extend(observe.transitions(run.previous, status))
        self._metrics.observe_status(ref.namespace, ref.name, status)


def _deployments_by_track(children: list[Manifest]) -> dict[Track, Manifest]:
    tracks = {track.value: track for track in Track}
    found: dict[Track, Manifest] = {}
    for child in children:
        label = child["metadata"].get("labels", {}).get(TRACK_LABEL)
        if child["kind"] == "Deployment" and label in tracks:
            found[tracks[label]] = child
    return found
