"""The edge: HTTP and gRPC in, the serving layer's answers out.

The only user of FastAPI, Starlette, uvicorn, grpc and protobuf in the runtime (with the
command line, which starts uvicorn).

- `app`: app assembly (the inference and admin listeners, one runtime, the gRPC server's
  start); `middleware`: request context, bearer tokens, the infer fast path.
- `inference_routes`: the Open Inference Protocol routes (`/v2/...`), KServe v1 predict,
  health and metrics; `repository_routes`: the admin app's model load and unload.
- `responses`: error answers in either shape; `request_body`: bodies read within their
  media type, size and time limits.
- `generation`, `sse`: the OpenAI-compatible routes and the OIP generate extension, and the
  server-sent-event streams they answer with; `embeddings`: OpenAI's `/v1/embeddings` over
  the encoder, on the OIP infer route's serving path.
- `grpc_api` and its generated `oip` package: the OIP over gRPC.
- `schemas`, `binary_tensors`, and for generation `generation_schemas` (shared),
  `openai_requests`, `openai_responses`, `oip_generate_schemas`: request and response
  bodies, decoded within bounds before any data is touched.
- `http_errors`: domain error to status and body; `http_protocol`: the hardened HTTP/1.1
  protocol uvicorn runs with.

It reaches the runtime through `serving.facade.ServingFacade`.
"""
