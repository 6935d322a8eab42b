"""nsq_cli: the command line (``nsq-sansio``).

``nsq-sansio serve`` (the emulator on loopback), ``pub``, ``tail``, ``stats``, ``demo`` and
``worker`` (an application's handler run as a service); also run as ``python -m nsq_cli``.
``python -m nsq_emulator`` is its ``serve`` alone: the emulator's own program, which the
``serve`` command runs.  Each command is a module of this package (``_serve``, ``_pub``,
``_tail``, ``_stats``, ``_demo``, ``_worker``), run by ``_cli``.  It sits above the client: it
runs on :mod:`nsq_anyio` and serves :mod:`nsq_emulator`, and neither imports it.  The script
is installed with the package; it needs the ``anyio`` extra (``pip install
"nsq-sansio[anyio]"``), and without it says so (exit status 1).  See the documentation's
"Command line" page for the options and the exit statuses.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main", "serve_main"]

#: what the command line needs beyond the package itself, and the extra that installs it
_NEEDS = {"anyio": "anyio"}


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``) and return its exit status;
    ``prog`` is the program's name in its usage (default: the name it was started by, e.g.
    ``nsq-sansio``)."""
    try:
        from ._cli import main as run
    except ModuleNotFoundError as exc:
        return _missing(exc)
    return run(argv, prog=prog)


def serve_main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """``serve`` alone, as a program of its own: ``python -m nsq_emulator``, which it runs
    (the same options, checks, output and exit statuses)."""
    from nsq_emulator._serve import main as serve

    return serve(argv, prog=prog)


def _missing(error: ModuleNotFoundError) -> int:
    """One line for a dependency that is not installed (exit status 1); another missing
    module is a bug, raised as it is."""
    name = (error.name or "").partition(".")[0]
    extra = _NEEDS.get(name)
    if extra is None:
        raise error
    print(
        f"nsq: error: the command line needs {name}, which is not installed: "
        f'pip install "nsq-sansio[{extra}]"',
        file=sys.stderr,
    )
    return 1
