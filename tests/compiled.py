"""Whether the tests run against the compiled (mypyc) build of the core (``setup.py``,
``NSQ_SANSIO_MYPYC=1``) instead of its Python source."""

from __future__ import annotations

import importlib.machinery

import nsq_proto._connection

#: the core was imported from mypyc-compiled extension modules
COMPILED = nsq_proto._connection.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))

#: the reason a test of a wrongly typed argument does not run on the compiled build
WRONG_TYPE = (
    "compiled core: a typed signature converts (True -> 1) or refuses (TypeError) an argument "
    "of the wrong type before the library's own check can"
)
