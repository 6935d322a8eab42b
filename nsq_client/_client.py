"""What the consumer and the producer share: options, TLS and the ``async with`` plumbing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Self

from nsq_proto import ClientCore, ConfigError, Event

from ._backend import Backend, TaskGroupContext, TaskGroupLike
from ._options import tls_context
from ._runner import CoreRunner

__all__ = ["ClientBase"]


class ClientBase:
    """``async with`` plumbing shared by the consumer and the producer."""

    #: the backend of a subclass bound to one event-loop library (``nsq_anyio``, ``nsq_trio``)
    default_backend: ClassVar[Backend | None] = None
    _runner: CoreRunner

    @classmethod
    def _backend_of(cls, backend: Backend | None) -> Backend:
        if backend is not None:
            return backend
        if cls.default_backend is None:
            raise ConfigError(
                f"{cls.__name__} needs backend=... (or use nsq_anyio's or nsq_trio's {cls.__name__})"
            )
        return cls.default_backend

    def __init__(self, backend: Backend | None, tls: object, tls_hostname: str | None) -> None:
        self._backend = backend = self._backend_of(backend)
        #: whether to upgrade to TLS, and with which context (``tls``: None, True or one)
        self._use_tls, self._ssl_context = tls_context(backend, tls)
        self._tls_hostname = tls_hostname
        self._clock: Callable[[], float] = backend.current_time
        self._tg_cm: TaskGroupContext | None = None
        self._tg: TaskGroupLike | None = None

    def _drive(
        self,
        core: ClientCore,
        on_event: Callable[[Event], None],
        write_timeout: float,
        before_output: Callable[[], None] | None = None,
    ) -> None:
        """Run ``core`` on this client's backend, its events to ``on_event``
        (``before_output``: see :class:`CoreRunner`)."""
        self._runner = CoreRunner(
            self._backend,
            core,
            on_event,
            ssl_context=self._ssl_context,
            tls_hostname=self._tls_hostname,
            write_timeout=write_timeout,
            before_output=before_output,
        )

    async def __aenter__(self) -> Self:
        self._clock = self._backend.clock()
        self._tg_cm = self._backend.task_group()
        self._tg = await self._tg_cm.__aenter__()
        self._runner.start(self._tg)
        self._runner.core.start(self._backend.current_time())
        self._runner.wake()
        return self

    async def _end_tasks(self) -> None:
        """Cancel this client's tasks and wait for them to end (a task group waits for its
        tasks even when its host is cancelled).  The transports stay open: a last exchange
        can follow in new tasks."""
        tg_cm, tg = self._tg_cm, self._tg
        if tg_cm is None or tg is None:
            return
        self._tg_cm = None
        tg.cancel_scope.cancel()
        # entered in __aenter__, so exited here under no scope of ours (scopes nest); the
        # caller's own cancellation, raised on the way out, is the caller's to carry on
        cancelled = self._backend.cancelled_exc_class()
        try:
            await tg_cm.__aexit__(None, None, None)
        except* cancelled:  # bare or in a group (a trio nursery groups what it raises)
            pass

    async def _exit(self, exc_info: tuple[Any, Any, Any]) -> bool | None:
        if self._tg_cm is None:  # the tasks already ended (see _end_tasks)
            return None
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        error = exc_info[1]
        if error is None or isinstance(error, self._backend.cancelled_exc_class()):
            return await self._tg_cm.__aexit__(*exc_info)
        # the body failed: close our tasks, then let its exception through as it is (not
        # wrapped in an exception group by our internal task group)
        await self._tg_cm.__aexit__(None, None, None)
        return False
