"""Fleetserve operator: reconciles InferenceService objects into runtime Deployments."""

__version__ = "0.1.0"
