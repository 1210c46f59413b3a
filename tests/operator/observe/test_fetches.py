"""`ModelFetched` and the digest each track serves, from the pods' fetch init containers."""

from __future__ import annotations

import json

import pytest

from fleetserve_operator import naming
from fleetserve_operator.naming import Track
from fleetserve_operator.observe import Observation, compute_status, track_fetches
from fleetserve_operator.records import Manifest, Problem, TrackFetch
from fleetserve_operator.spec import ConditionType, InferenceServiceStatus

OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
NOW = "2026-12-02T10:00:00Z"
LATER = "2026-12-02T10:05:00Z"


def _deployment(track: Track, *, fetches: bool = True) -> Manifest:
    init = [{"name": "fetch", "image": "runtime:1"}] if fetches else []
    labels = {naming.TRACK_LABEL: track.value, naming.SPEC_HASH_LABEL: f"{track.value}-h"}
    return {
        "metadata": {"name": f"demo-{track.value}", "labels": labels, "generation": 1},
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {"initContainers": init, "containers": [{"name": "runtime", "image": "r"}]}
            },
        },
        "status": {"observedGeneration": 1, "replicas": 1, "availableReplicas": 1},
    }


def _pod(track: Track, fetch: Manifest, name: str = "a") -> Manifest:
    labels = {naming.TRACK_LABEL: track.value, naming.SPEC_HASH_LABEL: f"{track.value}-h"}
    return {
        "metadata": {"name": f"demo-{track.value}-{name}", "labels": labels},
        "status": {"initContainerStatuses": [{"name": "fetch", "restartCount": 0, **fetch}]},
    }


def _done(digest: str) -> Manifest:
    record = {"digest": digest, "bytes": 90_000_000, "files": 7}
    return {"state": {"terminated": {"exitCode": 0, "message": json.dumps(record)}}}


RUNNING: Manifest = {"state": {"running": {}}}
DENIED: Manifest = {
    "state": {
        "terminated": {
            "exitCode": 1,
            "message": '{"reason": "AccessDenied", "message": "s3://models/enc: 403"}',
        }
    }
}


def test_a_track_without_a_fetch_container_is_left_out() -> None:
    """A builtin or PVC model fetches nothing: no entry, whatever its pods say."""
    deployments = {Track.STABLE: _deployment(Track.STABLE, fetches=False)}
    assert track_fetches(deployments, [_pod(Track.STABLE, _done(OLD))]) == {}


def test_counts_and_digests_per_track() -> None:
    """Only current pods count; a running fetch is not fetched; digests are deduplicated."""
    deployments = {t: _deployment(t) for t in (Track.STABLE, Track.CANARY)}
    stale = _pod(Track.STABLE, _done(NEW), name="old")
    stale["metadata"]["labels"][naming.SPEC_HASH_LABEL] = "older-template"
    pods = [
        _pod(Track.STABLE, _done(OLD), name="a"),
        _pod(Track.STABLE, _done(OLD), name="b"),
        stale,
        _pod(Track.CANARY, RUNNING),
    ]
    assert track_fetches(deployments, pods) == {
        Track.STABLE: TrackFetch(pods=2, fetched=2, digests=(OLD,)),
        Track.CANARY: TrackFetch(pods=1, fetched=0),
    }


def test_the_node_caches_outcomes_are_carried_and_shown() -> None:
    """Each completed fetch's cache outcome, sorted, and in ModelFetched's message."""
    hit, stored = _done(OLD), _done(OLD)
    for done, outcome in ((hit, "hit"), (stored, "stored")):
        ended = done["state"]["terminated"]
        ended["message"] = json.dumps({**json.loads(ended["message"]), "cache": outcome})
    pods = [_pod(Track.STABLE, stored, "a"), _pod(Track.STABLE, hit, "b")]
    fetches = track_fetches({Track.STABLE: _deployment(Track.STABLE)}, pods)
    assert fetches[Track.STABLE].cache == ("hit", "stored")
    assert _fetched(_status(fetches))[2] == (
        f"stable: 2/2 pods fetched {OLD} (node cache: hit, stored)"
    )


def test_a_record_that_is_not_json_counts_as_fetched_without_a_digest() -> None:
    """An older image wrote no record: the fetch completed, its digest is unknown."""
    ended = {"state": {"terminated": {"exitCode": 0, "message": ""}}}
    deployments = {Track.STABLE: _deployment(Track.STABLE)}
    assert track_fetches(deployments, [_pod(Track.STABLE, ended)]) == {
        Track.STABLE: TrackFetch(pods=1, fetched=1)
    }


def test_a_failure_is_carried_in_the_fetchs_words() -> None:
    """The failed pod's reason, as `workload_problem` reports it."""
    (fetch,) = track_fetches(
        {Track.CANARY: _deployment(Track.CANARY)}, [_pod(Track.CANARY, DENIED)]
    ).values()
    assert fetch.failure == Problem(
        "AccessDenied", "pod demo-canary-a: model fetch failed: s3://models/enc: 403"
    )
    assert fetch.fetched == 0


def _status(
    fetches: dict[Track, TrackFetch],
    previous: InferenceServiceStatus | None = None,
    now: str = NOW,
) -> InferenceServiceStatus:
    deployments = {track: _deployment(track) for track in (Track.STABLE, Track.CANARY)}
    seen = Observation(
        generation=3, deployments=deployments, problem=None, now=now, fetches=fetches
    )
    return compute_status(previous or InferenceServiceStatus(), seen)


def _fetched(status: InferenceServiceStatus) -> tuple[str, str, str]:
    condition = status.condition(ConditionType.MODEL_FETCHED)
    assert condition is not None
    return condition.status, condition.reason, condition.message


@pytest.mark.parametrize(
    ("fetches", "expected"),
    [
        pytest.param(
            {Track.STABLE: TrackFetch(2, 2, (OLD,)), Track.CANARY: TrackFetch(1, 0)},
            ("False", "Fetching", f"stable: 2/2 pods fetched {OLD}; canary: 0/1 pods fetched"),
            id="canary-fetching",
        ),
        pytest.param(
            {Track.STABLE: TrackFetch(2, 2, (OLD,)), Track.CANARY: TrackFetch(1, 1, (NEW,))},
            ("True", "Fetched", f"stable: 2/2 pods fetched {OLD}; canary: 1/1 pods fetched {NEW}"),
            id="all-fetched",
        ),
        pytest.param(
            {Track.STABLE: TrackFetch(0, 0)},
            ("Unknown", "NoPods", "stable: 0/0 pods fetched"),
            id="no-pods",
        ),
        pytest.param(
            {Track.STABLE: TrackFetch(2, 2, (OLD, NEW))},
            (
                "False",
                "DigestsDiffer",
                "pods of the stable track fetched different bytes; pin model.digest: "
                f"stable: 2/2 pods fetched {OLD}, {NEW}",
            ),
            id="digests-differ",
        ),
        pytest.param(
            {
                Track.STABLE: TrackFetch(1, 1, (OLD,)),
                Track.CANARY: TrackFetch(1, 0, failure=Problem("DigestMismatch", "pod c: no")),
            },
            ("False", "DigestMismatch", "pod c: no"),
            id="failed",
        ),
    ],
)
def test_model_fetched_condition(
    fetches: dict[Track, TrackFetch], expected: tuple[str, str, str]
) -> None:
    """Fetching until every current pod fetched; a failure's own reason; mixed bytes named."""
    assert _fetched(_status(fetches)) == expected


def test_each_track_reports_the_digest_its_pods_agree_on() -> None:
    """status.tracks.<track>.modelDigest: set for one digest, unset for none or several."""
    status = _status(
        {Track.STABLE: TrackFetch(2, 2, (OLD,)), Track.CANARY: TrackFetch(2, 2, (OLD, NEW))}
    )
    assert status.tracks.stable is not None
    assert status.tracks.canary is not None
    assert status.tracks.stable.model_digest == OLD
    assert status.tracks.canary.model_digest is None
    assert status.model_dump(by_alias=True)["tracks"]["stable"]["modelDigest"] == OLD


def test_the_transition_time_moves_only_with_the_status() -> None:
    """Fetching → Fetched moves lastTransitionTime; a second Fetched pass keeps it."""
    fetching = _status({Track.STABLE: TrackFetch(1, 0)})
    done = _status({Track.STABLE: TrackFetch(1, 1, (OLD,))}, previous=fetching, now=LATER)
    again = _status({Track.STABLE: TrackFetch(1, 1, (OLD,))}, previous=done, now="later-still")
    stamps = [
        s.condition(ConditionType.MODEL_FETCHED).last_transition_time  # type: ignore[union-attr]
        for s in (fetching, done, again)
    ]
    assert stamps == [NOW, LATER, LATER]


def test_the_condition_goes_when_the_model_is_no_longer_fetched() -> None:
    """A spec moved to a builtin model drops ModelFetched instead of keeping a stale one."""
    fetched = _status({Track.STABLE: TrackFetch(1, 1, (OLD,))})
    assert fetched.condition(ConditionType.MODEL_FETCHED) is not None
    builtin = _status({}, previous=fetched, now=LATER)
    assert builtin.condition(ConditionType.MODEL_FETCHED) is None
    assert builtin.condition(ConditionType.READY) is not None
