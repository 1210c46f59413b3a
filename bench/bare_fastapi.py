"""The floor `bench.http_overhead_bench` compares the runtime against: FastAPI doing nothing.

One route at the runtime's inference path that does what any FastAPI service must do with
the same request: read the body, parse it with the runtime's own `decode_body` into the same
pydantic `InferenceRequest`, and answer a constant Open Inference Protocol response with
orjson. Served by uvicorn with the runtime's event loop and parser (uvloop, httptools), no
access log, one process. No model, no queue, no metrics, no request ids, no limits: whatever
the runtime's zero-cost path costs on top of this is its own overhead.

Usage: ``python -m bench.bare_fastapi --port N`` (``bench.http_overhead_bench`` starts it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

from fleetserve_runtime.server.schemas import InferenceRequest, decode_body

ANSWER = orjson.dumps(
    {
        "model_name": "bare",
        "model_version": "v1",
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}],
    }
)
"""The constant answer: the size of the synthetic model's default 8-dimensional answer."""


def create_app() -> FastAPI:
    """The bare app: a readiness route and the inference route."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    @app.post("/v2/models/{name}/infer")
    async def infer(request: Request, name: str) -> Response:
        decode_body(await request.body(), InferenceRequest)
        return Response(ANSWER, media_type="application/json")

    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the bare app on 127.0.0.1."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(
        create_app(),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="none",
        access_log=False,
        log_level="warning",
        server_header=False,
    )


if __name__ == "__main__":
    main()
