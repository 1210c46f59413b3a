"""The semantic-cache benchmark: its workload, its figures, and a tiny run end to end."""

from __future__ import annotations

import pytest

from bench import semantic_cache_bench as bench
from bench.semantic_cache_bench import (
    GROUPS,
    NEAR_MISSES,
    RunResult,
    WorkItem,
    build_workload,
    summarise,
)


def test_workload_asks_each_first_wording_before_its_repeats_and_paraphrases() -> None:
    items = build_workload(groups=3, repeats=2, seed=1)
    kinds = [item.kind for item in items]
    assert kinds[:3] == ["first"] * 3
    assert kinds.count("repeat") == 6
    assert kinds.count("paraphrase") == sum(len(group) - 1 for group in GROUPS[:3])
    assert {i.prompt for i in items if i.kind == "near_miss"} == set(NEAR_MISSES[:3])
    assert build_workload(groups=3, repeats=2, seed=1) == items


def test_false_hits_are_semantic_hits_unlike_the_models_own_answer() -> None:
    items = [
        WorkItem("a", "first"),
        WorkItem("a", "repeat"),
        WorkItem("a'", "paraphrase"),
        WorkItem("b", "near_miss"),
    ]
    off = RunResult("off", ["A", "A", "A", "B"], ["off"] * 4, seconds=4.0)
    on = RunResult(
        "on", ["A", "A", "A", "A"], ["miss", "exact_hit", "semantic_hit", "semantic_hit"], 1.0
    )
    summary = summarise(items, off, on)
    assert summary.exact_hit_ratio == 0.25
    assert summary.semantic_hit_ratio == 0.5
    assert summary.false_hits == 1
    assert summary.false_hit_rate == 0.5
    assert summary.near_miss_hit_rate == 1.0
    assert summary.semantic_hits[1] == {"prompt": "b", "served": "A", "model": "B"}
    assert summary.exact_hit_mismatches == 0
    assert summary.hits_by_kind == {
        "repeat:exact_hit": 1, "paraphrase:semantic_hit": 1, "near_miss:semantic_hit": 1,
    }  # fmt: skip
    assert summary.speedup == 4.0


def test_a_tiny_run_prints_the_figures_and_the_speedup_last(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two groups on the synthetic generative model: repeats hit exactly, paraphrases by meaning."""
    monkeypatch.setattr(bench, "pin_current_process", lambda core: None)
    bench.main(
        [
            "--model", "builtin://synthetic-generate?per_token_ms=5&output_tokens=4",
            "--groups", "2", "--max-tokens", "4", "--server-core", "0",
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    figures = dict(line.split("=", 1) for line in lines[-5:])
    assert list(figures) == [
        "semantic_cache_exact_hit_ratio",
        "semantic_cache_semantic_hit_ratio",
        "semantic_cache_false_hit_rate",
        "semantic_cache_near_miss_hit_rate",
        "semantic_cache_speedup",
    ]
    assert float(figures["semantic_cache_exact_hit_ratio"]) == pytest.approx(2 / 10, abs=1e-3)
    assert float(figures["semantic_cache_semantic_hit_ratio"]) > 0
    assert float(figures["semantic_cache_speedup"]) > 0  # no timing asserted: a shared machine
