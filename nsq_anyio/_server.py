"""Kept so that older imports keep working: the emulator's loopback host is
:mod:`nsq_emulator.loopback` (these are its objects)."""

from nsq_emulator.loopback import EmulatorCluster as EmulatorCluster
from nsq_emulator.loopback import serve_emulator as serve_emulator

__all__ = ["EmulatorCluster", "serve_emulator"]
