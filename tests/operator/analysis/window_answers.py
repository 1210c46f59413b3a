"""Threshold mode's queries over one window, answered with a test's figures.

The threshold tests (an encoder's in test_threshold, a generative model's in
test_generative_analysis) script the same queries for every model: canary requests, its 5xx
ratio, both tracks' 503/504 ratios, and the p99 of a histogram on each track; each adds the
figures of its own model.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetserve_operator import analysis


def window_answers(
    target: analysis.AnalysisTarget, figures: Mapping[str, float | None], p99s: Mapping[str, str]
) -> dict[str, float | None]:
    """Each query of `target`'s window and the figure it answers with.

    `figures` holds `requests`, `errors`, `rejections` and `stable_rejections`; `p99s` maps a
    figure's name to the histogram whose canary p99 it is (`stable_<name>`: stable's).
    """
    canary, stable, w = target.canary, target.stable, target.window
    answers = {
        analysis.requests_query(canary, w): figures["requests"],
        analysis.code_ratio_query(canary, w, analysis.SERVER_ERRORS): figures["errors"],
        analysis.code_ratio_query(canary, w, analysis.REJECTIONS): figures["rejections"],
        analysis.code_ratio_query(stable, w, analysis.REJECTIONS): figures["stable_rejections"],
    }
    for name, histogram in p99s.items():
        answers[analysis.p99_ms_query(histogram, canary, w)] = figures[name]
        answers[analysis.p99_ms_query(histogram, stable, w)] = figures[f"stable_{name}"]
    return answers
