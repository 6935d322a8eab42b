"""The optional compiled build of the protocol core (everything else is in pyproject.toml).

By default this is a plain ``setup()``: the package is pure Python and building it needs
nothing but setuptools.  With ``NSQ_SANSIO_MYPYC=1`` in the environment the typed modules of
``nsq_proto`` listed below are compiled with mypyc (as black and mypy ship theirs)::

    NSQ_SANSIO_MYPYC=1 pip wheel --no-deps -w dist .

Under a PEP 517 frontend (pip, build) mypy is then asked for as a build requirement and
installed into the isolated build environment; ``python setup.py build_ext --inplace`` needs it
installed already.  ``NSQ_SANSIO_MYPYC_OPT_LEVEL`` (default 3) is passed to mypyc.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

#: the mypy that compiles the core (mypyc ships with it)
MYPY_REQUIREMENT = "mypy>=1.15"

#: compiled with NSQ_SANSIO_MYPYC=1: the pure, typed core on the hot path and around it.
#: Left out: ``_errors`` (exception classes, some of them also a builtin exception, cannot be
#: native classes, and gain nothing), ``_version``, the package ``__init__`` and ``wire`` (only
#: re-exports), and the emulator ``nsq_proto/testing``.
MYPYC_MODULES = [
    "nsq_proto/_compress.py",
    "nsq_proto/_config.py",
    "nsq_proto/_connection.py",
    "nsq_proto/_consumer.py",
    "nsq_proto/_core.py",
    "nsq_proto/_events.py",
    "nsq_proto/_ext_filter.py",
    "nsq_proto/_features.py",
    "nsq_proto/_frames.py",
    "nsq_proto/_lookupd.py",
    "nsq_proto/_message.py",
    "nsq_proto/_names.py",
    "nsq_proto/_outputs.py",
    "nsq_proto/_partitioned.py",
    "nsq_proto/_producer.py",
    "nsq_proto/_rdy.py",
    "nsq_proto/_start_from.py",
    "nsq_proto/_state.py",
    "nsq_proto/_timers.py",
    "nsq_proto/commands.py",
]


def _mypyc_requested() -> bool:
    return os.environ.get("NSQ_SANSIO_MYPYC", "").strip().lower() not in ("", "0", "false", "no")


def _ext_modules() -> list[object]:
    try:
        from mypyc.build import mypycify
    except ImportError:
        # a PEP 517 frontend asking for the build requirements: setuptools turns setup_requires
        # into one and stops here (it raises), the frontend installs mypy and calls us again
        setup(setup_requires=[MYPY_REQUIREMENT])
        sys.exit(f"NSQ_SANSIO_MYPYC=1 needs mypyc: install {MYPY_REQUIREMENT!r} first")
    opt_level = os.environ.get("NSQ_SANSIO_MYPYC_OPT_LEVEL", "3")
    return list(mypycify(MYPYC_MODULES, opt_level=opt_level, group_name="nsq_proto"))


if _mypyc_requested():
    setup(ext_modules=_ext_modules())
else:
    setup()
