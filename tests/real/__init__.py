"""The client against real servers (marked ``real_nsqd``): nsqd and nsqlookupd v1.3.0
(``test_nsqd.py``) and the partitioned cluster (``test_partitioned.py``), started on loopback
from the binaries the environment names (``tests/support/servers.py``,
``tests/support/partitioned.py``).  Skipped without them; failed instead under
``--require-real-servers``.  Elsewhere, beside the tests they twin: the fault suite
(``tests/faults``), and some tests of the command line (``tests/cli``), the benchmarks and the
Spark source and sink."""
