"""The InferenceService whose children are rendered: the metadata every child carries."""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve_operator import naming
from fleetserve_operator.records import Manifest

__all__ = ["Owner"]


@dataclass(frozen=True, slots=True)
class Owner:
    """The InferenceService whose children are rendered."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> Manifest:
        """The controller owner reference every child carries (for garbage collection)."""
        return {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: dict[str, str]) -> Manifest:
        """Child metadata: name, namespace, labels and the owner reference."""
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [self.reference()],
        }
