"""What a scheme's fetcher gets: the options, the staging directory, the budget, progress."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetserve_runtime.storage.budget import ByteBudget
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.progress import Progress
from fleetserve_runtime.storage.staging import Staging

__all__ = ["FetchContext"]


@dataclass(frozen=True)
class FetchContext:
    """One fetch in progress.

    A fetcher writes every file of the model through `staging`, charges `budget` with the
    bytes it writes and counts the bytes it transfers with `progress`. `resume_dir` (on the
    same volume) survives a failed run, for what a retry can continue: partial downloads,
    the Hugging Face scratch cache.
    """

    options: FetchOptions
    staging: Staging
    budget: ByteBudget
    progress: Progress
    resume_dir: Path
