"""LitServe peer: a ``LitAPI`` with LitServe's own dynamic batching."""
