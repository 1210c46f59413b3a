"""MiniLM behind plain FastAPI, no batching: the endpoint most tutorials write first.

FastAPI's docs put blocking work in a plain ``def`` path operation, which FastAPI runs in its
thread pool, so each request is one forward pass of one text. Runs in the project's .venv.

Usage: ``python -m bench.peers.fastapi.server --port N``
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from bench.peers.cli import parse_port
from bench.peers.encoder import MiniLM


class EmbedRequest(BaseModel):
    """One text to embed."""

    text: str


class EmbedResponse(BaseModel):
    """Its unit-norm embedding."""

    embedding: list[float]


def build_app(model: MiniLM) -> FastAPI:
    """Return the app: ``POST /embed`` and ``GET /health``."""
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> EmbedResponse:
        return EmbedResponse(embedding=model.embed([request.text])[0].tolist())

    return app


def main() -> None:
    """Load the model, then serve on 127.0.0.1."""
    port = parse_port()
    uvicorn.run(build_app(MiniLM()), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
