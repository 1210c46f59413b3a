"""The edge: HTTP and gRPC in, the serving layer's answers out.

The only user of FastAPI, Starlette, uvicorn, grpc and protobuf in the runtime (with the
command line, which starts uvicorn).

- `app`: app assembly (the inference and admin listeners), middlewares, the Open Inference
  Protocol routes (`/v2/...`), health and metrics.
- `generation`, `sse`: the OpenAI-compatible routes and the OIP generate extension, and the
  server-sent-event streams they answer with.
- `grpc_api` and its generated `oip` package: the OIP over gRPC.
- `schemas`, `generation_schemas`, `binary_tensors`: request and response bodies, decoded
  within bounds before any data is touched.
- `http_errors`: domain error to status and body; `http_protocol`: the hardened HTTP/1.1
  protocol uvicorn runs with.

It reaches the runtime through `serving.facade.ServingFacade`.
"""
