"""The exceptions of ``_errors.py``: the abstract base, the server's errors and pickling."""

from __future__ import annotations

import pickle

import pytest

from nsq_proto import ProtocolError, ServerError


def test_protocol_error_is_abstract_and_server_errors_survive_pickling() -> None:
    with pytest.raises(TypeError, match="ProtocolError is abstract"):
        ProtocolError("x")
    refused = ServerError("E_AUTH_FAILED", "AUTH failed", True)
    copy = pickle.loads(pickle.dumps(refused))
    assert (copy.code, copy.text, copy.fatal, copy.permanent) == (
        "E_AUTH_FAILED",
        "AUTH failed",
        True,
        True,
    )
    assert str(copy) == "E_AUTH_FAILED AUTH failed"
    assert ServerError("E_INVALID", "TLS required", True).permanent
    assert not ServerError("E_INVALID", "bad", True).permanent
    assert str(ServerError("E_TIMEOUT", "", False)) == "E_TIMEOUT"
