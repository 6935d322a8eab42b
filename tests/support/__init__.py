"""What more than one part of the test suite needs, in one place (no tests here).

- :mod:`.net`: free loopback ports, waiting for an HTTP server, plain HTTP calls;
- :mod:`.backends`: the ``way``/``lib``/``anyio_backend`` fixtures (every adapter, on every
  event loop it runs on);
- :mod:`.servers`: real nsqd and nsqlookupd processes (started, killed, frozen, restarted)
  and an nsqd auth endpoint;
- :mod:`.partitioned`: a real partitioned cluster (youzan/nsq nsqd and nsqlookupd, etcd);
- :mod:`.served`: the emulator served on loopback by the command line, in a process of its
  own, and commands run as a user runs them;
- :mod:`.emulator_client`: a scripted client writing raw commands to the emulated nsqd;
- :mod:`.spec_fixtures`: loading ``spec-fixtures/`` and replaying its sessions;
- :mod:`.codeblocks`: running the Python blocks of the README and the docs;
- :mod:`.extras`: what each extra installs, and programs run as where only some are.

``tests/compiled.py`` (is the core the compiled one) stays where the core's tests and
``.ci/mypyc.sh`` import it.
"""

from __future__ import annotations

from pathlib import Path

#: the checkout
ROOT = Path(__file__).resolve().parents[2]
