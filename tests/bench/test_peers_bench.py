"""The peer comparison: a real run against the plain-FastAPI peer, and its pure decisions.

Only the FastAPI peer runs here: it needs nothing beyond the project's .venv, so the tests
never build a peer virtualenv.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.peers.cli import Ports, parse_port, parse_ports
from bench.peers_bench import (
    CHECK_TEXTS,
    MIN_COSINE,
    OURS,
    OURS_TORCH,
    PEERS,
    Row,
    batch_sizes,
    build_workloads,
    closing_lines,
    main,
    min_cosine,
    parse_args,
    run_server,
    server_command,
    venv_dir,
)


@pytest.fixture
def restore_affinity() -> Iterator[None]:
    """The bench pins the calling process to the client core; give pytest its cores back."""
    cores = os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, cores)


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("restore_affinity")
def test_fastapi_peer_is_checked_then_timed_beside_the_runtime(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both servers start, embed alike, answer every request; the closing lines name the peer."""
    cores = sorted(os.sched_getaffinity(0))
    main(
        [
            "--peers=fastapi",
            "--profile=short",
            "--requests=48",
            "--warmup=8",
            "--concurrency=8",
            f"--server-core={cores[0]}",
            f"--client-core={cores[-1]}",
        ]
    )
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[-2] == "best_peer=fastapi"
    assert lines[-1].startswith("vs_best_peer=")
    assert lines[-3].startswith("vs_best_peer_torch=")
    ratio = float(lines[-1].removeprefix("vs_best_peer="))
    torch_ratio = float(lines[-3].removeprefix("vs_best_peer_torch="))
    assert ratio > 0
    document = json.loads(out[out.index("\n{") : out.rindex("}") + 1])
    rows = {r["server"]: r for r in document["results"]}
    assert set(rows) == {OURS.name, OURS_TORCH.name, "fastapi"}
    for row in rows.values():
        assert row["ok"], row["reason"]
        assert row["profile"] == "short"
        assert (row["sent"], row["errors"]) == (48, 0)
        assert row["min_cosine"] > MIN_COSINE
        assert row["mean_batch"] >= 1.0
        # The server's process group did the work: CPU time was charged to it.
        assert row["cpu_ms_per_request"] > 0
    assert rows["fastapi"]["version"].startswith("0.")
    assert "(torch " in rows["fastapi"]["version"]
    assert "(onnxruntime " in rows[OURS.name]["version"]
    assert "(torch " in rows[OURS_TORCH.name]["version"]
    # The FastAPI peer logs one text per forward pass: no batching to report.
    assert rows["fastapi"]["mean_batch"] == 1.0
    assert ratio == pytest.approx(
        rows[OURS.name]["throughput_rps"] / rows["fastapi"]["throughput_rps"], rel=0.01
    )
    assert torch_ratio == pytest.approx(
        rows[OURS_TORCH.name]["throughput_rps"] / rows["fastapi"]["throughput_rps"], rel=0.01
    )


@pytest.mark.timeout(300)
def test_peer_whose_embeddings_differ_is_failed_and_not_timed(tmp_path: Path) -> None:
    """Against a reference it does not match, the real FastAPI peer gets no figures."""
    core = min(os.sched_getaffinity(0))
    args = parse_args(
        ["--profile=short,mixed", "--requests=16", "--warmup=4", f"--server-core={core}"]
    )
    reference = [[1.0] + [0.0] * 383 for _ in CHECK_TEXTS]
    rows, vectors = run_server(
        PEERS["fastapi"],
        python=Path(sys.executable),
        reference=reference,
        workloads=build_workloads(args),
        args=args,
        log_dir=tmp_path,
    )
    assert [r.profile for r in rows] == ["short", "mixed"]
    for row in rows:
        assert not row.ok
        assert row.min_cosine < MIN_COSINE
        assert "embeddings differ" in row.reason
        assert row.sent == 0
    # The vectors it did return are real unit-norm embeddings, one per check text.
    assert len(vectors) == len(CHECK_TEXTS)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(1.0, abs=1e-4)


def test_min_cosine_fails_vectors_that_are_not_the_same_embeddings() -> None:
    """Same rows pass; rows of other texts, or a different shape, fall below the gate."""
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((len(CHECK_TEXTS), 384)).tolist()
    rescaled = [[2.0 * x for x in row] for row in reference]
    assert min_cosine(reference, rescaled) == pytest.approx(1.0)
    assert min_cosine(reference, reference[::-1]) < MIN_COSINE
    assert min_cosine(reference, reference[:-1]) == -1.0


def test_batch_sizes_read_the_encoder_lines_among_other_log_lines() -> None:
    """Plain lines and Ray's replica-prefixed forwarded lines both count."""
    log = (
        b"INFO: Uvicorn running\nbatch_size=3\n"
        b"(ServeReplica:default:MiniLM pid=12) batch_size=17\nbatch_size=1\n"
    )
    assert batch_sizes(log) == [3, 17, 1]


def test_venv_dir_changes_with_the_pins(tmp_path: Path) -> None:
    """A new pin set gets a fresh virtualenv; the same pins reuse one."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("litserve==1.0 --hash=sha256:aa\n")
    first = venv_dir(tmp_path, "litserve", requirements)
    assert first == venv_dir(tmp_path, "litserve", requirements)
    assert first.name.startswith("litserve-")
    requirements.write_text("litserve==1.1 --hash=sha256:bb\n")
    assert venv_dir(tmp_path, "litserve", requirements) != first


def _row(server: str, rps: float, *, ok: bool = True) -> Row:
    return Row(server, "1", "", "mixed", ok=ok, throughput_rps=rps)


def test_closing_lines_divide_by_the_fastest_peer_that_passed() -> None:
    """A failed peer never counts as best, whatever figure it carries."""
    rows = [_row(OURS.name, 300.0), _row("litserve", 100.0), _row("pytriton", 900.0, ok=False)]
    assert closing_lines(rows, "mixed") == ["best_peer=litserve", "vs_best_peer=3.00"]
    assert closing_lines(rows[:1], "mixed") == ["best_peer=none", "vs_best_peer=nan"]


def test_closing_lines_never_count_the_torch_row_as_a_peer() -> None:
    """The runtime's torch row gets its own ratio and is never the best peer, even if faster."""
    rows = [_row(OURS.name, 300.0), _row(OURS_TORCH.name, 200.0), _row("litserve", 100.0)]
    assert closing_lines(rows, "mixed", suffix="_short") == [
        "vs_best_peer_torch_short=2.00",
        "best_peer_short=litserve",
        "vs_best_peer_short=3.00",
    ]
    faster_torch = [_row(OURS.name, 300.0), _row(OURS_TORCH.name, 900.0), _row("fastapi", 150.0)]
    assert closing_lines(faster_torch, "mixed")[1:] == ["best_peer=fastapi", "vs_best_peer=2.00"]


def test_unknown_peer_is_refused() -> None:
    """A misspelt peer stops the run before anything starts."""
    with pytest.raises(SystemExit):
        parse_args(["--peers=litserve,tritonn"])
    assert parse_args(["--quick"]).requests == 300


def test_a_peer_with_side_listeners_is_given_their_ports() -> None:
    """The bench picks the gRPC and metrics ports with the HTTP one; the peer never does."""
    args = parse_args([])
    python = Path("/venv/bin/python")
    mlserver = server_command(PEERS["mlserver"], python, (8000, 8001, 8002), args)
    assert mlserver[-4:] == ["--port=8000", "--side-ports", "8001", "8002"]
    assert parse_ports(mlserver[-4:]) == Ports(http=8000, grpc=8001, metrics=8002)
    fastapi = server_command(PEERS["fastapi"], python, (8000,), args)
    assert fastapi[-1] == "--port=8000"
    assert parse_port(fastapi[-1:]) == 8000
    assert PEERS["pytriton"].side_ports == PEERS["mlserver"].side_ports == 2
