"""The precision benchmark's prompts and speedup lines (no timings asserted)."""

from __future__ import annotations

from bench.generate_precision_bench import prompts, ratio_lines


def test_prompts_are_seeded_and_within_their_lengths() -> None:
    """The same seed gives the same prompts, every token in the vocabulary."""
    first = prompts(8, vocab=50, seed=3)
    assert first == prompts(8, vocab=50, seed=3)
    assert first != prompts(8, vocab=50, seed=4)
    assert all(16 <= len(p) <= 128 and all(0 <= t < 50 for t in p) for p in first)


def test_ratio_lines_put_int8_over_fp32_at_32_sequences_last() -> None:
    """Every pair at both batch sizes, the headline last."""
    medians = {
        (name, size): rate
        for size in (1, 32)
        for name, rate in (("fp32", 10.0 * size), ("bf16", 15.0 * size), ("int8", 20.0 * size))
    }
    lines = ratio_lines(medians)
    assert lines[0] == "generate_bf16_speedup_vs_fp32_batch1=1.50"
    assert "generate_int8_speedup_vs_bf16_batch32=1.33" in lines
    assert lines[-1] == "generate_int8_speedup_vs_fp32_batch32=2.00"
    assert len(lines) == 6
