"""The images e2e tier: the shipped images, built with podman and run as a restricted pod runs them.

Non-root, a read-only root filesystem, every capability dropped, memory-limited.

The session builds the operator image and the runtime's GPU-track image (the CPU track needs
torch's CPU wheel, which only PyTorch's own index serves). podman keeps each step's layers, so
a second run rebuilds only what the source changed.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fleetserve_operator.contract import HTTP_PORT as RUNTIME_PORT

from fleetserve_e2e.images.build import Built
from fleetserve_e2e.images.catalog import RUNTIME_GPU
from fleetserve_e2e.images.containers import Container, ContainerSpec
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.waiting import GiveUpError, wait_until

READY_TIMEOUT_S = 240.0
MEMORY_LIMIT = "3g"


def serve(image: str, *args: str) -> Iterator[Container]:
    """A hardened runtime container serving ``args``, ready, on a loopback port."""
    spec = ContainerSpec(
        image,
        args=("serve", *args),
        memory=MEMORY_LIMIT,
        ports={RUNTIME_PORT: free_port()},
    )
    with Container(spec) as container:
        url = container.url(RUNTIME_PORT)

        def ready() -> bool:
            if container.state()["Status"] != "running":
                raise GiveUpError(f"the runtime container exited:\n{container.logs()[-4000:]}")
            return httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200

        wait_until(ready, timeout_s=READY_TIMEOUT_S, what="the runtime ready", interval_s=0.5)
        yield container


@pytest.fixture(scope="module")
def minilm(images: dict[str, Built]) -> Iterator[Container]:
    """The runtime image serving the built-in MiniLM."""
    yield from serve(images[RUNTIME_GPU].spec.tag, "--model", "builtin://minilm-l6")


@pytest.fixture(scope="module")
def smollm2(images: dict[str, Built]) -> Iterator[Container]:
    """The runtime image serving the built-in SmolLM2-135M-Instruct."""
    yield from serve(
        images[RUNTIME_GPU].spec.tag,
        *("--model", "builtin://smollm2-135m", "--generation-max-context", "512"),
        *("--threads", "2"),
    )
