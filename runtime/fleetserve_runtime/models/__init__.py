"""Model handlers: the protocol, the registry, and the built-in models."""
