"""PyTriton peer: a Python function bound to Triton Inference Server's dynamic batcher."""
