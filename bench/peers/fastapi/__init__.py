"""Plain FastAPI + uvicorn, one text per forward pass: the no-batching peer."""
