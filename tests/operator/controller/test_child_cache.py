"""The child cache: what the watches saw, by owner, never moved back by a late event."""

from __future__ import annotations

from fleetserve_operator import naming
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.observe import deployment_reading
from fleetserve_operator.records import Manifest


def _obj(name: str, owner: str, *, rv: str, uid: str = "u1", ns: str = "ns") -> Manifest:
    labels = {naming.MANAGED_BY_LABEL: naming.MANAGER, naming.INSTANCE_LABEL: owner}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name, "namespace": ns, "uid": uid, "resourceVersion": rv, "labels": labels,
            "managedFields": [
                {"manager": naming.MANAGER, "operation": "Apply"},
                {"manager": "kube-controller-manager", "operation": "Update"},
            ],
        },
    }  # fmt: skip


def _names(cache: ChildCache, owner: str, ns: str = "ns") -> list[str]:
    return sorted(o["metadata"]["name"] for o in cache.owned(ns, owner, ("Deployment",)))


def test_a_kind_is_read_only_once_listed_and_lists_add_the_kind() -> None:
    cache = ChildCache()
    assert not cache.synced("ns", ("Deployment",))
    item = _obj("a-stable", "a", rv="5")
    del item["kind"], item["apiVersion"]
    cache.replace("Deployment", "apps/v1", "ns", [item])
    assert cache.synced("ns", ("Deployment",))
    assert not cache.synced("ns", ("Deployment", "Service"))
    (found,) = cache.owned("ns", "a", ("Deployment",))
    assert (found["kind"], found["apiVersion"]) == ("Deployment", "apps/v1")


def test_objects_are_found_by_owner_and_a_relist_drops_what_is_gone() -> None:
    cache = ChildCache()
    cache.replace("Deployment", "apps/v1", "ns", [_obj("a-stable", "a", rv="1")])
    assert cache.store("Deployment", _obj("a-canary", "a", rv="2", uid="u2"))
    assert cache.store("Deployment", _obj("b-stable", "b", rv="3", uid="u3"))
    assert _names(cache, "a") == ["a-canary", "a-stable"]
    cache.replace("Deployment", "apps/v1", "ns", [_obj("b-stable", "b", rv="4", uid="u3")])
    assert _names(cache, "a") == []
    assert _names(cache, "b") == ["b-stable"]


def test_an_event_at_or_before_the_stored_version_is_no_news_and_changes_nothing() -> None:
    cache = ChildCache()
    cache.replace("Deployment", "apps/v1", "ns", [])
    assert cache.store("Deployment", _obj("a-stable", "a", rv="7"))  # the operator's write
    assert not cache.store("Deployment", _obj("a-stable", "a", rv="7"))  # its echo
    assert not cache.store("Deployment", _obj("a-stable", "a", rv="6"))  # a late event
    (found,) = cache.owned("ns", "a", ("Deployment",))
    assert found["metadata"]["resourceVersion"] == "7"
    later = _obj("a-stable", "a", rv="8")
    later["spec"] = {"replicas": 3}
    assert cache.store("Deployment", later)


def test_a_delete_removes_only_the_object_it_names() -> None:
    cache = ChildCache()
    cache.replace("Deployment", "apps/v1", "ns", [_obj("a-stable", "a", rv="1", uid="old")])
    cache.store("Deployment", _obj("a-stable", "a", rv="9", uid="new"))  # replaced since
    cache.discard("Deployment", _obj("a-stable", "a", rv="2", uid="old"))
    assert _names(cache, "a") == ["a-stable"]
    cache.discard("Deployment", _obj("a-stable", "a", rv="10", uid="new"))
    assert _names(cache, "a") == []


def test_namespaces_are_listed_apart_and_an_absent_kind_is_synced_and_empty() -> None:
    cache = ChildCache()
    cache.replace("Deployment", "apps/v1", "ns", [_obj("a-stable", "a", rv="1")])
    cache.replace("Deployment", "apps/v1", "other", [_obj("a-stable", "a", rv="2", ns="other")])
    cache.replace("Deployment", "apps/v1", "ns", [])
    assert _names(cache, "a", "other") == ["a-stable"]
    assert not cache.synced("third", ("Deployment",))
    cache.mark_absent("HTTPRoute", None)
    assert cache.synced("third", ("HTTPRoute",))
    cache.unsync("Deployment", "ns")
    assert not cache.synced("ns", ("Deployment",))


def test_other_managers_entries_are_dropped() -> None:
    """Also where the operator owns fields as the child's creator: its entry is what is read."""
    cache = ChildCache()
    cache.replace("Deployment", "apps/v1", "ns", [_obj("a-stable", "a", rv="1")])
    (found,) = cache.owned("ns", "a", ("Deployment",))
    assert [e["manager"] for e in found["metadata"]["managedFields"]] == [naming.MANAGER]
    created = _obj("b-stable", "b", rv="2", uid="u2")
    created["metadata"]["managedFields"][0]["operation"] = "Update"  # created, not applied yet
    cache.store("Deployment", created)
    (kept,) = cache.owned("ns", "b", ("Deployment",))
    assert kept["metadata"]["managedFields"] == [created["metadata"]["managedFields"][0]]


def test_a_change_of_a_status_no_reconcile_reads_is_stored_but_is_no_news() -> None:
    """A PodDisruptionBudget's status, say: nothing of it is read (no `reading`)."""
    cache = ChildCache()
    cache.replace("PodDisruptionBudget", "policy/v1", "ns", [])
    budget = _obj("a-stable", "a", rv="1")
    assert cache.store("PodDisruptionBudget", budget)  # a new object
    their_update = [
        *budget["metadata"]["managedFields"][:1],
        {"manager": "kube-controller-manager", "operation": "Update", "time": "t2"},
    ]
    counted = {**budget, "metadata": {**budget["metadata"], "resourceVersion": "2",
               "managedFields": their_update}, "status": {"currentHealthy": 2}}  # fmt: skip
    assert not cache.store("PodDisruptionBudget", counted)
    (found,) = cache.owned("ns", "a", ("PodDisruptionBudget",))
    assert found["status"] == {"currentHealthy": 2}, "stored all the same"
    relabelled = {**counted, "metadata": {**counted["metadata"], "resourceVersion": "3",
                  "labels": {**counted["metadata"]["labels"], "x": "y"}}}  # fmt: skip
    assert cache.store("PodDisruptionBudget", relabelled)
    respecced = {**relabelled, "metadata": {**relabelled["metadata"], "resourceVersion": "4"},
                 "spec": {"minAvailable": 1}}  # fmt: skip
    assert cache.store("PodDisruptionBudget", respecced)


def test_a_change_of_a_read_status_is_news_only_when_it_changes_the_reading() -> None:
    """A Deployment's: its ready count is read, a condition's timestamp is not."""
    cache = ChildCache()
    cache.replace("Deployment", "apps/v1", "ns", [])
    created = {**_obj("a-stable", "a", rv="1"), "spec": {"replicas": 1}}
    assert cache.store("Deployment", created, reading=deployment_reading)

    def later(rv: str, status: Manifest) -> Manifest:
        return {**created, "metadata": {**created["metadata"], "resourceVersion": rv},
                "status": status}  # fmt: skip

    updated = {"type": "Available", "status": "False", "lastUpdateTime": "2026-12-06T08:00:00Z"}
    rolling = {"replicas": 1, "updatedReplicas": 1, "conditions": [updated]}
    assert cache.store("Deployment", later("2", rolling), reading=deployment_reading)
    again = {**rolling, "conditions": [{**updated, "lastUpdateTime": "2026-12-06T08:00:09Z"}]}
    assert not cache.store("Deployment", later("3", again), reading=deployment_reading)
    (found,) = cache.owned("ns", "a", ("Deployment",))
    assert found["status"] == again, "stored all the same"
    ready = {**again, "readyReplicas": 1, "availableReplicas": 1}
    assert cache.store("Deployment", later("4", ready), reading=deployment_reading)
    assert cache.store("Deployment", later("5", {}), reading=lambda obj: obj.get("status"))


def test_a_state_whose_status_cannot_be_read_is_news_and_the_operators_fields_count() -> None:
    """The reconcile says what it makes of an unreadable status; the watch goes on.

    And another manager taking the operator's fields changes no content, yet decides
    whether the operator writes the child again.
    """
    cache = ChildCache()
    cache.replace("PodDisruptionBudget", "policy/v1", "ns", [])
    budget = _obj("a-stable", "a", rv="1")
    assert cache.store("PodDisruptionBudget", budget)

    def unreadable(obj: Manifest) -> object:
        raise ValueError("an image name longer than the status allows")

    odd = {**budget, "metadata": {**budget["metadata"], "resourceVersion": "2"}, "status": {}}
    assert cache.store("PodDisruptionBudget", odd, reading=unreadable)
    taken = {**odd, "metadata": {**odd["metadata"], "resourceVersion": "3",
             "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}}  # fmt: skip
    assert cache.store("PodDisruptionBudget", taken)
    theirs_again = {**taken, "metadata": {**taken["metadata"], "resourceVersion": "4",
                    "managedFields": [{"manager": "kubectl", "operation": "Update"}]}}  # fmt: skip
    assert not cache.store("PodDisruptionBudget", theirs_again), "another's entry alone"
