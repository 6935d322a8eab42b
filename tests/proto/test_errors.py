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


def test_every_timeout_is_an_nsq_timeout_and_a_timeout_error() -> None:
    import pickle

    from nsq_proto import HandshakeTimeout, NSQError, NSQTimeout, PublishTimeout, ReadTimeout
    from nsq_spark import ConnectTimeout

    for kind in (ReadTimeout, HandshakeTimeout, PublishTimeout, ConnectTimeout):
        error = kind("took too long")
        assert isinstance(error, NSQTimeout)
        assert isinstance(error, NSQError) and isinstance(error, TimeoutError)
        assert str(error) == "took too long"
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is kind and str(again) == "took too long"
