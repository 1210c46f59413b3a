"""BentoML peer: a service whose API is ``batchable``, batched by BentoML's adaptive batcher."""
