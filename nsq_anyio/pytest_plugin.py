"""Kept so that older references keep working: the pytest plugin is
:mod:`nsq_emulator.pytest_plugin` (the package's ``pytest11`` entry point names it); these are
its hook and fixtures."""

from nsq_emulator.pytest_plugin import nsq_emulator as nsq_emulator
from nsq_emulator.pytest_plugin import nsq_memory_network as nsq_memory_network
from nsq_emulator.pytest_plugin import pytest_configure as pytest_configure

__all__ = ["nsq_emulator", "nsq_memory_network"]
