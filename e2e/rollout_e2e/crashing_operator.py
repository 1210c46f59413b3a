"""`fleetserve-operator run` that SIGKILLs itself right after its first write of a given step.

Run as `python crashing_operator.py run` with `E2E_CRASH_AT_CANARY_WEIGHT=<percent>`: the
operator runs unchanged until it has written a status with that `canaryWeight`, or an
HTTPRoute giving the canary that weight, whichever it writes first; then it dies at once, as
a node loss or an OOM kill would end it, before its next request. It is the operator's own
process (the e2e tests otherwise treat the operator as a black box) because only the process
itself can stop exactly between two of its writes.

The crash point is defined by what reached the API server, not by a line of code, so the same
fault hits any order of the two writes: that is what makes the test prove the property.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

from fleetserve_operator.__main__ import main
from fleetserve_operator.controller.kube import KubeApi

WEIGHT = int(os.environ["E2E_CRASH_AT_CANARY_WEIGHT"])


def _route_at_weight(manifest: Mapping[str, Any]) -> bool:
    if manifest.get("kind") != "HTTPRoute":
        return False
    refs = [ref for rule in manifest["spec"]["rules"] for ref in rule["backendRefs"]]
    return any(ref["name"].endswith("-canary") and ref["weight"] == WEIGHT for ref in refs)


def _status_at_weight(status: Mapping[str, Any]) -> bool:
    return bool(status.get("canaryWeight") == WEIGHT)


def _die_after(write: Callable[..., Any], carries: Callable[[Any], bool], arg: int) -> Any:
    """`write`, then SIGKILL when its `arg`-th positional argument carries the weight."""

    @functools.wraps(write)
    def wrapper(self: KubeApi, *args: Any, **kwargs: Any) -> Any:
        result = write(self, *args, **kwargs)
        if carries(args[arg]):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return wrapper


# (method, what carries the weight, which positional argument holds it)
for name, carries, arg in (
    ("apply_status", _status_at_weight, 1),
    ("apply", _route_at_weight, 0),
    ("create", _route_at_weight, 0),
):
    setattr(KubeApi, name, _die_after(getattr(KubeApi, name), carries, arg))

if __name__ == "__main__":
    raise SystemExit(main())
