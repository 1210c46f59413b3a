"""The MiniLM servers ``bench.peers_bench`` compares the runtime with, one package per peer.

Each peer runs in its own virtualenv (their dependencies conflict), built by the bench from
the peer's hash-pinned ``requirements.txt``; only ``fastapi`` runs in the project's .venv.
"""
