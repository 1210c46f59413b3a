"""The generative engine: continuous batching of causal-LM steps over a paged KV cache.

It steps any `models.causal_lm.CausalLM` (the Llama forward in `models.llama`, or the
synthetic model in `models.synthetic_lm`) and knows no model's code. The parts, each in its
own module (`contracts` names the requests and events that pass to and from its callers):

- `blocks`, `scheduler`, `stops` (pure): which blocks a sequence holds (shared prompt prefixes
  by hash, reference-counted), which sequences run, prefill or are preempted in the next step
  under the token budget, and where a stop string cuts the text.
- `sampling`: per-request greedy, temperature, top-k, top-p and seeded sampling of the logits.
- `metrics`: the engine's Prometheus series (tokens, steps, KV blocks, streams).
- `engine`: the loop that turns requests into steps on a worker thread and streams events back.
"""
