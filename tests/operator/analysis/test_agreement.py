"""The shadow stage's judgement: verdicts on agreement and shadow errors, look by look."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetserve_operator.analysis.agreement import (
    AGREEMENT_CHECK,
    ERRORS_CHECK,
    ShadowCounts,
    ShadowEvidence,
    ShadowPolicy,
    look,
    shadow_queries,
    watch,
)
from fleetserve_operator.analysis.queries import TrackScope
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import CheckOutcome, InconclusiveReason, Verdict

POLICY = ShadowPolicy(min_agreement=0.95, max_error_rate=0.01, alpha=0.01, power=0.9)
STABLE = TrackScope(namespace="ns", model="m", version="1", track=Track.STABLE)


def counts(mirrored: float, errors: float, compared: float, agreed: float) -> ShadowCounts:
    return ShadowCounts(mirrored=mirrored, errors=errors, compared=compared, agreed=agreed)


def clean(n: float) -> ShadowCounts:
    """`n` copies, none failed, `n` units compared, all agreed."""
    return counts(n, 0, n, n)


class Source:
    """A `MetricSource` answering from a dict of query text to value, or failing."""

    def __init__(self, values: dict[str, float] | None, *, online: bool = True) -> None:
        self.values = values
        self.online = online
        self.queries: list[str] = []

    def query(self, promql: str) -> float | None:
        """The value of `promql`, or `MetricsUnavailable` when the source fails."""
        self.queries.append(promql)
        if self.values is None:
            msg = "query failed"
            raise MetricsUnavailable(msg)
        return self.values.get(promql)

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """Unused by the shadow stage."""
        raise NotImplementedError

    def is_online(self) -> bool:
        """Whether Prometheus answers its health check."""
        return self.online


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("min_agreement", lambda: ShadowPolicy(min_agreement=1.0)),
        ("min_agreement", lambda: ShadowPolicy(min_agreement=0.0)),
        ("max_error_rate", lambda: ShadowPolicy(max_error_rate=0.0)),
        ("power", lambda: ShadowPolicy(power=1.0)),
    ],
)
def test_a_policy_that_could_never_pass_or_never_fail_is_refused(
    name: str, make: Callable[[], ShadowPolicy]
) -> None:
    with pytest.raises(ValueError, match=f"{name} must lie strictly between"):
        make()


def test_no_series_is_no_data_never_a_pass() -> None:
    evidence, verdict = look(POLICY, None, None)
    assert verdict.verdict is Verdict.INCONCLUSIVE
    assert verdict.reason is InconclusiveReason.NO_DATA
    assert evidence.last is None


def test_too_few_compared_units_are_inconclusive_however_clean() -> None:
    _, verdict = look(POLICY, None, clean(POLICY.min_compared - 1))
    assert verdict.reason is InconclusiveReason.TOO_FEW_REQUESTS


def test_enough_units_without_evidence_hold_for_evidence() -> None:
    """100 clean units: enough to count, too few to show an error rate under 1%."""
    _, verdict = look(POLICY, None, clean(100))
    assert verdict.verdict is Verdict.INCONCLUSIVE
    assert verdict.reason is InconclusiveReason.INSUFFICIENT_EVIDENCE
    assert "failed 0 of 100" in verdict.message


def test_a_clean_shadow_passes_on_evidence_gathered_over_looks() -> None:
    evidence = None
    verdicts = []
    for n in range(50, 1001, 50):
        evidence, verdict = look(POLICY, evidence, clean(n))
        verdicts.append(verdict.verdict)
    assert verdicts[-1] is Verdict.PASSED
    first = verdicts.index(Verdict.PASSED)
    assert 200 <= 50 * (first + 1) <= 600  # the error gate's ~1/0.01 x log(1/beta) copies
    assert all(v is Verdict.PASSED for v in verdicts[first:])  # cleared gates stay cleared


def test_disagreement_fails_at_once_and_stays_failed() -> None:
    evidence, verdict = look(POLICY, None, counts(100, 0, 100, 70))
    assert verdict.verdict is Verdict.FAILED
    by_name = {check.name: check for check in verdict.checks}
    assert by_name[AGREEMENT_CHECK].outcome is CheckOutcome.REJECTED
    assert by_name[ERRORS_CHECK].outcome is CheckOutcome.PASSED
    assert by_name[AGREEMENT_CHECK].value == pytest.approx(0.3)
    _, later = look(POLICY, evidence, None)
    assert later.verdict is Verdict.FAILED
    _, failed_read = watch(Source(None), POLICY, STABLE, "2", evidence)
    assert failed_read.verdict is Verdict.FAILED


def test_shadow_errors_fail_like_a_canarys_error_rate() -> None:
    _, verdict = look(POLICY, None, counts(200, 12, 200, 200))
    assert verdict.verdict is Verdict.FAILED
    assert ERRORS_CHECK in verdict.message


def test_a_counter_that_went_back_adds_nothing() -> None:
    """A stable pod restarted: the sums drop; that look adds nothing, the next counts on."""
    evidence, _ = look(POLICY, None, clean(80))
    evidence, _ = look(POLICY, evidence, clean(30))
    assert evidence.disagreement.trials == 80
    evidence, _ = look(POLICY, evidence, clean(50))
    assert evidence.disagreement.trials == 100


def test_events_beyond_trials_are_clamped() -> None:
    """Sums read a moment apart: never more agreements than units, errors than copies."""
    evidence, _ = look(POLICY, None, counts(10, 20, 10, 15))
    assert (evidence.errors.events, evidence.disagreement.events) == (10, 0)


def test_queries_select_the_stable_pods_and_the_shadow_version() -> None:
    queries = shadow_queries(STABLE, "2")
    assert list(queries) == ["errors", "mirrored", "agreed", "compared"]
    assert queries["mirrored"] == (
        'sum(fleetserve_shadow_mirrored_total{namespace="ns",model="m",version="1",'
        'track="stable",shadow_version="2"})'
    )


def test_watch_reads_and_judges() -> None:
    values = dict(zip(shadow_queries(STABLE, "2").values(), [0.0, 2e3, 2e3, 2e3], strict=True))
    evidence, verdict = watch(Source(values), POLICY, STABLE, "2", None)
    assert verdict.verdict is Verdict.PASSED
    assert evidence is not None


def test_a_failed_read_is_inconclusive_even_after_the_gates_cleared() -> None:
    evidence, verdict = look(POLICY, None, clean(2000))
    assert verdict.verdict is Verdict.PASSED
    same, failed = watch(Source(None), POLICY, STABLE, "2", evidence)
    assert (failed.verdict, failed.reason) == (Verdict.INCONCLUSIVE, InconclusiveReason.QUERY_ERROR)
    assert same == evidence
    _, down = watch(Source(None, online=False), POLICY, STABLE, "2", evidence)
    assert down.reason is InconclusiveReason.PROMETHEUS_DOWN


def test_no_series_in_prometheus_is_no_data() -> None:
    _, verdict = watch(Source({}), POLICY, STABLE, "2", None)
    assert verdict.reason is InconclusiveReason.NO_DATA


def test_evidence_survives_a_round_trip_through_status() -> None:
    evidence, _ = look(POLICY, None, counts(300, 1, 900, 880))
    wire = evidence.model_dump(mode="json", by_alias=True)
    assert ShadowEvidence.model_validate(wire) == evidence
