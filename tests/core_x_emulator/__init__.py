"""The client's sans-IO core (``nsq_proto``) against the emulator (``nsq_emulator``, mostly
over its in-memory network on a virtual clock): what the core does with a server that answers,
fails, restarts and moves partitions.  These test the core; they belong beside its own tests
(``tests/proto``) and are kept apart only while that directory is being reorganised.
``test_start_from.py`` holds every start-from test outside ``tests/proto`` and
``tests/spark``, its twins against the real partitioned cluster included."""
