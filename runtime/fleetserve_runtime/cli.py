"""`fleetserve-runtime serve`: flags and env into `RuntimeConfig`, then uvicorn.

(`fleetserve-runtime fetch`, the storage initializer an init container runs, takes its flags
from `storage.command`.)

Flags are derived from the config model, one per field, so the CLI, the `FLEETSERVE_*`
variables and the YAML file can never disagree: a top-level field `max_body_bytes` is
`--max-body-bytes`, a section field `batching.max_batch_size` is `--max-batch-size`, and
sections whose field names alone would be ambiguous prefix them (`--cache-max-entries`,
`--memory-budget-bytes`). Booleans take `--flag/--no-flag`; lists are comma-separated.

One uvicorn server runs with one socket per listener: `host:port` for inference and, with
`model_control: explicit`, `admin_host:admin_port` for model control (`server.app.listener_app`
tells them apart). Both sockets are bound before anything starts, so a taken port stops
start-up with a message instead of leaving a half-started server; so is `grpc_port`'s, then
released for the gRPC server (`grpc_api`), which binds it in the inference app's lifespan.

With `tls_cert_file` and `tls_key_file`, every listener (inference, model control, gRPC)
serves TLS only. The files are read at start-up, and a bad pair stops it with a message; a
rotated certificate is served from the next restart.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import logging
import socket
import ssl
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from fleetserve_runtime.core.config import RuntimeConfig, load_config
from fleetserve_runtime.storage import command as fetch_command

EXIT_LOAD_FAILED = 3
"""Exit status when the first model load fails (2 is a bad configuration)."""

TLS_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""TLS 1.2 cipher suites of the HTTP listeners: forward secret and authenticated only (TLS 1.3
has only such suites). uvicorn's own default, `TLSv1`, admits CBC and SHA-1 suites too."""

__all__ = ["EXIT_LOAD_FAILED", "ConfigFlag", "build_parser", "config_flags", "main", "parse_config"]


@dataclass(frozen=True)
class ConfigFlag:
    """One CLI flag and the config field it sets."""

    flag: str
    section: str | None
    field: str
    info: Any

    @property
    def dest(self) -> str:
        """The argparse destination: `section__field` for section fields."""
        return f"{self.section}__{self.field}" if self.section else self.field


def config_flags() -> list[ConfigFlag]:
    """Every leaf field of `RuntimeConfig` with its flag, in declaration order."""
    flags: list[ConfigFlag] = []
    for name, info in RuntimeConfig.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            prefix = getattr(annotation, "flag_prefix", "")
            flags.extend(
                ConfigFlag(f"--{prefix}{sub.replace('_', '-')}", name, sub, subinfo)
                for sub, subinfo in annotation.model_fields.items()
            )
        else:
            flags.append(ConfigFlag(f"--{name.replace('_', '-')}", None, name, info))
    return flags


def build_parser() -> argparse.ArgumentParser:
    """The `fleetserve-runtime` parser, with one flag per config field."""
    parser = argparse.ArgumentParser(prog="fleetserve-runtime")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over HTTP")
    serve.add_argument("--config", type=Path, help="YAML config file (flags and env override it)")
    for flag in config_flags():
        where = f"{flag.section}.{flag.field}" if flag.section else flag.field
        help_text = f"{flag.info.description or ''} [{where}; default {flag.info.default!r}]"
        if flag.info.annotation is bool:
            serve.add_argument(
                flag.flag, dest=flag.dest, action=argparse.BooleanOptionalAction, help=help_text
            )
        else:
            serve.add_argument(flag.flag, dest=flag.dest, help=help_text)
    fetch_command.add_arguments(
        commands.add_parser("fetch", help="fetch a model into a volume (an init container)")
    )
    return parser


def parse_config(argv: Sequence[str]) -> RuntimeConfig:
    """Parse `serve` argv (after env and YAML) into a validated `RuntimeConfig`."""
    args = vars(build_parser().parse_args(["serve", *argv]))
    args.pop("command")
    yaml_path = args.pop("config")
    overrides: dict[str, Any] = {}
    for key, value in args.items():
        if value is None:
            continue
        section, _, name = key.rpartition("__")
        (overrides.setdefault(section, {}) if section else overrides)[name] = value
    return load_config(overrides, yaml_path=yaml_path)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fleetserve-runtime`; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fetch":
        return fetch_command.run(build_parser().parse_args(argv))
    if not argv or argv[0] != "serve":
        build_parser().parse_args(argv)
        return 2
    try:
        config = parse_config(argv[1:])
    except (ValidationError, FileNotFoundError) as exc:
        print(f"fleetserve-runtime: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    tls_problem = _tls_problem(config)
    if tls_problem is not None:
        print(f"fleetserve-runtime: invalid configuration: {tls_problem}", file=sys.stderr)
        return 2
    try:
        sockets = _bind(config)
    except OSError as exc:
        print(f"fleetserve-runtime: {exc}", file=sys.stderr)
        return 1
    from fleetserve_runtime.core.logs import configure_logging
    from fleetserve_runtime.server.app import create_apps, listener_app

    listener = configure_logging(config.log_level, config.log_format)
    admin_port = sockets[1].getsockname()[1] if len(sockets) > 1 else None
    load_failures: list[BaseException] = []

    def stop_serving(exc: BaseException) -> None:
        load_failures.append(exc)
        server.should_exit = True

    # The model and the runtime built at start-up live as long as the process, like the
    # imports frozen below: frozen as well once loaded, they leave the collector's passes.
    apps = create_apps(config, on_load_failure=stop_serving, on_ready=gc.freeze)
    # The server's exit path stops logging too, and QueueListener.stop fails a second time.
    stop_logging = functools.cache(listener.stop)
    server = _server(listener_app(apps, admin_port=admin_port), config, on_exit=stop_logging)
    for name, sock in zip(("inference", "model control"), sockets, strict=False):
        host, port = sock.getsockname()[:2]
        logging.getLogger("fleetserve.cli").info(
            "listening",
            extra={
                "listener": name,
                "address": f"{host}:{port}",
                "tls": bool(_tls_settings(config)),
            },
        )
    # What was imported so far (torch, FastAPI, pydantic: ~200k objects) lives as long as
    # the process; frozen, the cyclic collector stops rescanning it, so a full collection
    # under load no longer stalls the event loop for ~0.3 s (the request tail). A request
    # allocates a few hundred tracked objects, nearly all freed by reference counting: a
    # larger first generation collects every few dozen requests instead of every few.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    try:
        server.run(sockets=sockets)
    finally:
        stop_logging()
    if load_failures:
        print(f"fleetserve-runtime: model load failed: {load_failures[0]}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    return 0


def _tls_problem(config: RuntimeConfig) -> str | None:
    """Why `tls_cert_file` and `tls_key_file` cannot serve TLS, or None (also when unset)."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            config.tls_cert_file, config.tls_key_file
        )
    except OSError as exc:  # ssl.SSLError is an OSError
        reason = exc.strerror or str(exc)
        return (
            f"cannot load tls_cert_file {config.tls_cert_file} with tls_key_file "
            f"{config.tls_key_file}: {reason}"
        )
    return None


def _bind(config: RuntimeConfig) -> list[socket.socket]:
    """The inference socket and, with model control, the admin socket; bound, not listening."""
    addresses = [(config.host, config.port)]
    if config.model_control == "explicit":
        addresses.append((config.admin_host, config.admin_port))
    if config.grpc_port:
        addresses.append((config.host, config.grpc_port))
    sockets: list[socket.socket] = []
    for host, port in addresses:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            for bound in sockets:
                bound.close()
            msg = f"cannot listen on {host}:{port}: {exc.strerror}"
            raise OSError(msg) from None
        sockets.append(sock)
    if config.grpc_port:
        # grpc binds its own socket (`grpc_api`); this one only proved the port free in time
        # for start-up to stop with a message.
        sockets.pop().close()
    return sockets


def _server(app: Any, config: RuntimeConfig, *, on_exit: Callable[[], None]) -> Any:
    """A uvicorn server that flushes the log queue before it re-raises a caught signal.

    uvicorn ends a SIGTERM-triggered shutdown by re-raising the signal, which kills the
    process before any `finally` of ours runs; without this the last log lines (the shutdown
    itself) would be lost in the queue.
    """
    import uvicorn

    from fleetserve_runtime.server.http_protocol import hardened_protocol

    class _FlushingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    on_exit()

    settings = uvicorn.Config(
        app,
        loop="uvloop",
        http=hardened_protocol(
            header_timeout_s=config.http.header_timeout_s,
            max_header_bytes=config.http.max_header_bytes,
        ),
        ws="none",
        server_header=False,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=10,
        **_tls_settings(config),
    )
    return _FlushingServer(settings)


def _tls_settings(config: RuntimeConfig) -> dict[str, Any]:
    """The uvicorn TLS settings for `tls_cert_file` and `tls_key_file`; none without them."""
    if config.tls_cert_file is None:
        return {}
    return {
        "ssl_certfile": config.tls_cert_file,
        "ssl_keyfile": config.tls_key_file,
        "ssl_ciphers": TLS_CIPHERS,
    }
