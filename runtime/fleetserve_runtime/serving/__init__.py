"""One served model: its versions, both engines composed, and who may ask what of them.

- `runtime`: the `Runtime` composes the model registry, the encoder engine, one generative
  engine per generative version, the shared result cache, buffer pool and metrics, and the
  liveness verdicts.
- `versions`: loading a version off the event loop, warming it, sizing its batches or KV pool
  from the memory budget, swapping it in without a gap, and draining the one it replaces.
- `facade`: `ServingFacade`, all the edge may ask of the runtime.
- `admission` (pure): a request's priority class and deadline, and who may raise them.
"""
