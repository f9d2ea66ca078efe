"""The signals of one ``rosterd up`` run (layer 8): who handles SIGINT, SIGTERM and SIGHUP
at each stage of the run, and what each does.

- **Before the run takes them** (reading, planning): the process's SIGINT handler
  (:meth:`RunSignals.interrupted`, set by ``run_up`` before the event loop exists) only
  notes the interrupt; the run then ends (exit 130, one line) before anything starts.
  Not raising there keeps a Ctrl-C from landing inside an import.
- **While joining Ray** (:meth:`RunSignals.cutting`): SIGINT and SIGTERM end the join
  at once.
- **Serving** (:meth:`RunSignals.take`, set again after each plan by
  :meth:`RunSignals.again`, so that no handler a library set while planning outlives
  it): SIGINT or SIGTERM stops (the drain); a second one stops now (no drain; the
  backends still stop politely, then firmly); SIGHUP reloads in the background (a
  refusal is logged and kept for ``/status``).
- **The last clean-up** (:meth:`RunSignals.give_back`): the event loop's handlers are
  removed and SIGINT only says that rosterd is stopping (not Python's default, a
  ``KeyboardInterrupt`` in the middle of the clean-up).

Only the process's own run in its main thread handles signals (``enabled``); a run that
tests start in their event loop leaves them alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from typing import Protocol

from rosterd.fleet_scheduler.effects import Level
from rosterd.up.report import Reporter

#: The signals that stop a run.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StoppableRun(Protocol):
    """What the signals act on: a run that stops, stops now, and reloads."""

    @property
    def stop_asked(self) -> bool:
        """Whether :meth:`stop` was called."""
        ...

    @property
    def stopping_now(self) -> bool:
        """Whether :meth:`stop_now` was called."""
        ...

    def stop(self) -> None:
        """Stop serving after the drain."""
        ...

    def stop_now(self) -> None:
        """Stop at once, without the drain."""
        ...

    async def try_reload(self) -> None:
        """Reload the files; a refusal only logged."""
        ...


class RunSignals:
    """The signal handling of one run (see the module): ``run`` is what they stop or
    reload, ``reporter`` hears what they say, ``grace_s`` (seconds) is named when a
    second signal stops at once; ``enabled``: the process's own run in its main thread."""

    def __init__(
        self, run: StoppableRun, reporter: Reporter, *, grace_s: float, enabled: bool
    ) -> None:
        self.run = run
        self.reporter = reporter
        self.grace_s = grace_s
        self.enabled = enabled
        #: The event loop handles the run's signals (:meth:`take` was called).
        self.taken = False
        #: A Ctrl-C came before :meth:`take`: the run ends before anything starts.
        self.interrupt_noted = False
        self._reloads: set[asyncio.Task[None]] = set()

    def interrupted(self, signum: int, frame: object) -> None:
        """The SIGINT handler of the whole process (``signal.signal``), outside the spans
        where the event loop handles signals: before :meth:`take` it notes the interrupt,
        after it says that rosterd is stopping and changes nothing."""
        if self.taken:
            self.say_stopping()
        else:
            self.interrupt_noted = True

    def take(self) -> None:
        """The event loop handles the run's signals from now on: SIGINT and SIGTERM stop,
        SIGHUP reloads. A no-op unless ``enabled``."""
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        self.taken = True
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._reload_soon)

    def again(self) -> None:
        """After a plan: the run's handlers again, once it took them."""
        if self.enabled and self.taken:
            self.take()

    def give_back(self) -> None:
        """The last clean-up: remove the event loop's handlers; SIGINT only says that
        rosterd is stopping. A no-op unless the run took its signals."""
        if not (self.enabled and self.taken):
            return
        loop = asyncio.get_running_loop()
        for sig in (*STOP_SIGNALS, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        signal.signal(signal.SIGINT, self.interrupted)

    @contextlib.contextmanager
    def cutting(self, cut: asyncio.Future[None]) -> Iterator[None]:
        """While inside: SIGINT and SIGTERM resolve ``cut`` (the Ray join waits on it); it
        is resolved at once when a Ctrl-C was noted already. After: SIGINT is
        :meth:`interrupted` again."""
        loop = asyncio.get_running_loop()
        if self.enabled:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, _settle, cut)
        try:
            if self.interrupt_noted:
                _settle(cut)
            yield
        finally:
            if self.enabled:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                signal.signal(signal.SIGINT, self.interrupted)  # as before the join

    def say_stopping(self) -> None:
        """One line: a signal came while every backend is being stopped."""
        self.reporter.say(Level.INFO, "already stopping: every backend is being stopped")

    def _stop_signal(self) -> None:
        """SIGINT or SIGTERM while serving: stop; again while stopping: stop now (no drain;
        the backends still stop politely, then firmly)."""
        if not self.run.stop_asked:
            self.run.stop()
        elif not self.run.stopping_now:
            self.reporter.say(
                Level.INFO,
                "stopping now: requests in flight are cut; every backend stops "
                f"(SIGTERM, then SIGKILL after --grace {self.grace_s:g} s)",
            )
            self.run.stop_now()
        else:
            self.say_stopping()

    def _reload_soon(self) -> None:
        """SIGHUP: reload in the background (a refusal is logged and kept for /status)."""
        task = asyncio.get_running_loop().create_task(self.run.try_reload())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)


def _settle(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` unless it is already (a signal handler's, called again)."""
    if not future.done():
        future.set_result(None)
