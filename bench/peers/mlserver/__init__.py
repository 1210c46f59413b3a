"""MLServer peer: a custom ``MLModel`` runtime with MLServer's adaptive batching."""
