"""The encoder engine: dynamic batching of fixed-shape requests (embeddings, classifiers).

- `request_queue` (pure): a bounded queue of pending items by (group, length bucket,
  priority), with per-item deadlines.
- `batcher` (pure): which items the next batch takes, under the padded-token and memory
  limits and the length buckets.
- `executor`: runs a batch on the device on its worker thread, splits out-of-memory batches
  and reports each item's result.
- `engine`: the loop that admits `InferenceCall`s, plans batches, consults the result cache
  and hands batches to the executor.

It serves any `models.base.ModelHandler` and knows nothing of the generative engine.
"""
