"""Stop strings over streamed text: held back while they may start, cut where they match."""

from __future__ import annotations

import random

import pytest

from fleetserve_runtime.generate.stops import StopMatcher


def stream(matcher: StopMatcher, deltas: list[str]) -> tuple[list[str], str]:
    emitted = [matcher.push(delta) for delta in deltas]
    tail = "" if matcher.stopped else matcher.flush()
    return emitted, "".join(emitted) + tail


def test_without_stop_strings_text_passes_through() -> None:
    """No stop strings: every delta is emitted as it comes."""
    emitted, text = stream(StopMatcher(()), ["ab", "c", ""])
    assert emitted == ["ab", "c", ""]
    assert text == "abc"


def test_a_stop_inside_one_delta_cuts_the_text_before_it() -> None:
    """The stop string and everything after it are dropped; later deltas are ignored."""
    matcher = StopMatcher(["END"])
    assert matcher.push("hello END world") == "hello "
    assert matcher.stopped
    assert matcher.push("more") == ""


def test_a_stop_split_over_deltas_is_held_back_then_cut() -> None:
    """A possible stop start is not emitted until the next delta decides it."""
    matcher = StopMatcher(["</s>"])
    assert matcher.push("abc</") == "abc"
    assert matcher.push("s") == ""
    assert matcher.push(">tail") == ""
    assert matcher.stopped


def test_a_held_prefix_that_does_not_become_a_stop_is_released() -> None:
    """Held text comes out as soon as it can no longer start a stop, and at flush."""
    matcher = StopMatcher(["</s>"])
    assert matcher.push("a</") == "a"
    assert matcher.push("b") == "</b"
    assert matcher.push("<") == ""
    assert matcher.flush() == "<"


def test_the_earliest_of_several_stops_wins() -> None:
    """With several stop strings, the output ends at the first one in the text."""
    matcher = StopMatcher(["xyz", "b"])
    assert matcher.push("aaxyb") == "aaxy"


@pytest.mark.parametrize("seed", range(20))
def test_random_texts_and_splits_match_a_whole_text_search(seed: int) -> None:
    """Property: however the text is split, the output is the text up to the earliest stop.

    What is emitted is never taken back: each push extends a prefix of that answer.
    """
    rng = random.Random(seed)
    text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 40)))
    stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(2)]
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 10))))
    deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    found = [pos for stop in stops if (pos := text.find(stop)) >= 0]
    expected = text[: min(found)] if found else text
    matcher = StopMatcher(stops)
    so_far = ""
    for delta in deltas:
        so_far += matcher.push(delta)
        assert expected.startswith(so_far)
    if not matcher.stopped:
        so_far += matcher.flush()
    assert so_far == expected
    assert matcher.stopped == bool(found)
