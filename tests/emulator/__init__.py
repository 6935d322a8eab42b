"""Tests of the emulator (``nsq_emulator``), a module of tests per module of the emulator:
its nsqd (protocol, topics and channels, HTTP, timers, faults), nsqlookupd, the partitioned
cluster, its clock, its loopback host, its pytest plugin and its exports; and every capture of
a real nsqd replayed against it.  Tests that use the emulator to test the client's core are in
``tests/proto/test_*_x_emulator.py``."""
