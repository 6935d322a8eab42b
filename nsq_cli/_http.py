"""The HTTP requests of ``stats`` (nsqd's ``/stats``) and ``tail`` (nsqlookupd's
``/lookup``): a blocking GET with a timeout, each failure one line naming the address."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any

from ._output import Failure

__all__ = ["get", "json_object", "not_json"]


def _not_http(address: str, service: str) -> str:
    if service == "nsqlookupd":
        return (
            f"{address} does not answer HTTP: give nsqlookupd's HTTP address (port 4161 by default)"
        )
    return (
        f"{address} does not answer HTTP: is it nsqd's TCP port? "
        "give nsqd's HTTP address (port 4151 by default)"
    )


def _os_error(exc: OSError, address: str, service: str, timeout: float) -> str:
    """One line for a failure to reach ``address``."""
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {address}"
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError):
        return _not_http(address, service)
    if isinstance(exc, TimeoutError):
        return f"{address} did not answer within {timeout:g} s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {address}: {exc.strerror}"
    return f"{address}: {exc.strerror or exc}"


def get(address: str, target: str, *, service: str, timeout: float) -> tuple[int, bytes]:
    """The status and body that ``service`` (nsqd or nsqlookupd) at ``address`` answers ``GET
    target`` with, when it is 200 or 404; a :class:`Failure` naming anything else that went
    wrong."""
    path = target.split("?", 1)[0]
    try:
        with urllib.request.urlopen(f"http://{address}{target}", timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return 404, exc.read()
        raise Failure(f"{address} answered {path} with HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, OSError):
            raise Failure(_os_error(reason, address, service, timeout)) from None
        raise Failure(f"{address}: {reason}") from None
    except http.client.HTTPException:
        raise Failure(_not_http(address, service)) from None
    except OSError as exc:
        raise Failure(_os_error(exc, address, service, timeout)) from None


def not_json(address: str, path: str, service: str) -> Failure:
    return Failure(f"{address} did not answer {path} with JSON: is it {service}'s HTTP address?")


def json_object(address: str, path: str, body: bytes, *, service: str) -> dict[str, Any]:
    """The JSON object of an answer (without the envelope of older versions); a
    :class:`Failure` when it is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise not_json(address, path, service)
    answer = data.get("data", data)  # older versions answer in an envelope
    return answer if isinstance(answer, dict) else data
