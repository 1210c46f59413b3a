"""Generative serving: a Llama-architecture engine with a paged KV cache and continuous batching.

The parts, each in its own module (`contracts` names the shapes that pass between them):

- `checkpoint`, `tokenizer`, `chat_template`: a checkpoint (a GGUF file, or a directory with
  `config.json`, `*.safetensors` and `tokenizer.json`) to a `Checkpoint`: the architecture,
  fp32 weights under the usual Llama parameter names, and a `TextCodec`.
- `llama`, `kv_cache`: our own Llama forward over a preallocated pool of fixed-size KV blocks;
  each step runs a flat batch of sequence chunks (prefill chunks and single decode tokens
  together) and returns the logits of each chunk's last token.
- `blocks`, `scheduler`, `stops` (pure): which blocks a sequence holds (shared prompt prefixes
  by hash, reference-counted), which sequences run, prefill or are preempted in the next step
  under the token budget, and where a stop string cuts the text.
- `sampling`: per-request greedy, temperature, top-k, top-p and seeded sampling of the logits.
- `engine`: the loop that turns requests into steps on a worker thread and streams events back.
- `synthetic`: a model with the same interface and a tunable per-token latency, output length
  and error rate, for fast tests and for regressing a canary on purpose.
"""
