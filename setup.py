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

#: compiled with NSQ_SANSIO_MYPYC=1: the typed core on the hot paths of the consumer and the
#: producer (frames, messages, commands, the connection, the two cores and their parts: RDY and
#: backoff, in-flight books, ordered repeats, start positions, the consumer's lifecycle, its
#: discovery and its stop procedure, the producer's topic lookups, events, outputs, states,
#: timers).  The rest stays Python: the configuration (``_config``: its checks
#: look at the type of each value given, e.g. ``True`` is not a count, which a compiled
#: attribute would convert first), the lookupd HTTP/JSON parsing (fed ``bytearray`` by h11), the
#: handshake features, names, compression, partition hashing, start positions and extension
#: filters (cold paths whose argument checks a compiled signature would pre-empt with a
#: TypeError), the exceptions (``_errors``: some are also a builtin exception, which a native
#: class cannot be) and the re-exporting ``__init__``/``wire`` (the emulator, ``nsq_emulator``,
#: and the command line, ``nsq_cli``, are not the core).
MYPYC_MODULES = [
    "nsq_proto/_connection.py",
    "nsq_proto/_consumer.py",
    "nsq_proto/_core.py",
    "nsq_proto/_discovery.py",
    "nsq_proto/_events.py",
    "nsq_proto/_frames.py",
    "nsq_proto/_in_flight.py",
    "nsq_proto/_intake.py",
    "nsq_proto/_lifecycle.py",
    "nsq_proto/_message.py",
    "nsq_proto/_ordered.py",
    "nsq_proto/_outputs.py",
    "nsq_proto/_producer.py",
    "nsq_proto/_publish_queue.py",
    "nsq_proto/_rdy.py",
    "nsq_proto/_reachability.py",
    "nsq_proto/_routes.py",
    "nsq_proto/_start_positions.py",
    "nsq_proto/_state.py",
    "nsq_proto/_stopping.py",
    "nsq_proto/_timers.py",
    "nsq_proto/_topic_lookups.py",
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
