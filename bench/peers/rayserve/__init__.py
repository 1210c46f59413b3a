"""Ray Serve peer: one deployment replica batching with ``@serve.batch``."""
