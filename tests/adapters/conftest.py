from __future__ import annotations

from tests.support.backends import anyio_backend, lib, way

__all__ = ["anyio_backend", "lib", "way"]
