"""Errors of the model store. Each message is one line, fit to print as-is by the CLI."""

from __future__ import annotations


class ModelStoreError(Exception):
    """Base class: anything that stops a model from being resolved or fetched."""


class ModelNotFoundError(ModelStoreError):
    """A model name is not in the registry, or a model path does not exist."""


class ModelIntegrityError(ModelStoreError):
    """A fetched file (or part) has the wrong size or sha256."""


class ModelDownloadError(ModelStoreError):
    """A source could not deliver the file (pip failed, wheel lacks the member, hub error)."""
