"""The node agent (beside DESIGN.md layer 5, the supervisor): one node's backends, run on that node.

A fleet node that is not this machine is run by a :class:`NodeAgent`: a Ray
actor pinned to the node's Ray node (see ``rosterd.ray_cluster``) that owns the
node's :class:`~rosterd.supervisor.Supervisor` and starts, stops and measures
the node's backends through the same adapters and weights resolution as the
local backends (``rosterd.scheduler.SupervisorBackends``). Backends listen on
the node's address, so the router reaches them over HTTP directly: control
goes through Ray, request and stream bytes never do.

On the head, :class:`AgentBackends` is the node scheduler's backends boundary
(``start(role) -> Endpoint``, ``stop(role)``) over the agent's actor handle,
and forwards the agent's backend events to a callback of the shape
``Supervisor(on_event=...)`` has: the node scheduler cannot tell a remote node
from the local one. Ray's errors become rosterd's in one place,
:func:`map_ray_errors`; a rosterd error raised on the node (``WeightsError``,
``PortInUseError``, ``BackendStartError`` ...) crosses Ray as a
:class:`CarriedError` and is raised on the head as itself, same class and
attributes.

Library choice: Ray (an existing distributed engine, the ``ray`` extra) carries
control calls; it is imported only when a call reaches it, so ``rosterd``
without the extra never imports it. ``NodeAgent`` itself does not import Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, ParamSpec, TypeVar

from rosterd.adapters import WeightsSource
from rosterd.backends import Endpoint, SupervisorBackends
from rosterd.errors import NodeAgentError, NodeLostError, RosterdError
from rosterd.fleet import Fleet
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, ProbeResult, StateDirLock, Supervisor, lock_state_dir
from rosterd.weights import resolve_for_fleet

#: How long one pull of the agent's backend events waits for one to happen (seconds).
EVENT_POLL_S: Final[float] = 5.0

_P = ParamSpec("_P")
_T = TypeVar("_T")


def default_state_root() -> Path:
    """``$XDG_STATE_HOME/rosterd`` (default ``~/.local/state/rosterd``) on the machine that
    calls it; an agent's state folder is ``<root>/nodes/<node>``. (Same rule as ``rosterd
    up``'s ``--state-dir`` default, which lives in the CLI layer.)"""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rosterd"


@dataclass(frozen=True)
class AgentConfig:
    """What a node agent needs to run one fleet node's roles (sent to the node as is).

    ``node``: the fleet node's name; ``host``: the address its backends listen on
    (the node's ``address``); ``specs``: role -> spec of the roles planned on it;
    ``fleet``: its ``models``/``model_roots`` resolve the weights, on the node;
    ``repos``: role -> the roster's Hugging Face repo; ``state_root``: the folder
    under which the agent keeps ``nodes/<node>/`` (``None``: the node's
    :func:`default_state_root`); ``auto_ports``, ``ready_timeout_s`` (seconds):
    as ``SupervisorBackends``; ``grace_s``: SIGTERM to SIGKILL, seconds.
    """

    node: str
    host: str
    specs: Mapping[str, InferenceSpec]
    fleet: Fleet
    repos: Mapping[str, str | None] = field(default_factory=dict)
    state_root: str | None = None
    auto_ports: bool = False
    ready_timeout_s: float | None = None
    grace_s: float = 10.0


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """An opened agent: its ``node``, its process ``pid`` and ``state_dir`` on the node, and
    the ``reaped`` pids of backends an earlier run had left there."""

    node: str
    pid: int
    state_dir: str
    reaped: tuple[int, ...]


class CarriedError(RosterdError):
    """A rosterd error on its way from a node agent to the head, kept whole.

    Many rosterd errors take keyword arguments that plain exception pickling
    loses; this carries the class, ``args`` and attributes and rebuilds the
    same error with :meth:`unwrap`. Only :func:`map_ray_errors` sees it.
    """

    def __init__(self, error: RosterdError) -> None:
        super().__init__(str(error))
        self.error_type = type(error)
        self.error_args = error.args
        self.error_state = dict(vars(error))

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_carried, (self.error_type, self.error_args, self.error_state))

    def unwrap(self) -> RosterdError:
        """The carried error: the same class, ``args`` and attributes."""
        error = self.error_type.__new__(self.error_type)
        error.args = self.error_args
        error.__dict__.update(self.error_state)
        return error


def _rebuild_carried(
    error_type: type[RosterdError], args: tuple[object, ...], state: dict[str, object]
) -> CarriedError:
    carried = CarriedError.__new__(CarriedError)
    RosterdError.__init__(carried, *args)
    carried.error_type, carried.error_args, carried.error_state = error_type, args, state
    return carried


def _carry_errors(
    method: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Raise a rosterd error of ``method`` as a :class:`CarriedError`, so it crosses Ray whole."""

    @functools.wraps(method)
    async def carrying(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await method(*args, **kwargs)
        except CarriedError:
            raise
        except RosterdError as err:
            raise CarriedError(err) from None

    return carrying


class NodeAgent:
    """One fleet node's backends, run on that node (the body of the Ray actor).

    Call :meth:`open` first (lock the state folder ``<state_root>/nodes/<node>``,
    reap the backends an earlier run left there). :meth:`start`/:meth:`stop`
    are ``SupervisorBackends``' on this node; every ``BackendEvent`` the
    supervisor emits is kept until :meth:`next_events` hands it out. All
    methods run on one event loop (the actor's), which lives as long as the
    agent's process: the backends' parent-death signal is tied to it, so they
    die with the agent. Errors: rosterd errors come out as :class:`CarriedError`.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        root = Path(config.state_root) if config.state_root else default_state_root()
        self.state_dir = root / "nodes" / config.node
        self._events: list[BackendEvent] = []
        self._arrived = asyncio.Event()
        self._lock: StateDirLock | None = None
        self._supervisor: Supervisor | None = None
        self._backends: SupervisorBackends | None = None
        self._reaped: tuple[int, ...] = ()

    @_carry_errors
    async def open(self) -> AgentInfo:
        """Lock the state folder, reap leftovers, get ready to start backends (idempotent).

        Raises (carried): ``StateDirLockedError`` when another rosterd runs this
        node from the same folder.
        """
        if self._supervisor is None:
            self._lock = lock_state_dir(self.state_dir)
            self._supervisor = Supervisor(
                self.state_dir, grace_s=self.config.grace_s, on_event=self._record
            )
            self._reaped = tuple(await self._supervisor.reap_leftovers())
            self._backends = SupervisorBackends(
                self._supervisor,
                self.config.specs,
                host=self.config.host,
                resolve_weights=self._weights_for,
                auto_ports=self.config.auto_ports,
                ready_timeout_s=self.config.ready_timeout_s,
                node=self.config.node,
            )
        return AgentInfo(self.config.node, os.getpid(), str(self.state_dir), self._reaped)

    @_carry_errors
    async def add_roles(self, specs: Mapping[str, InferenceSpec]) -> None:
        """Run the roles ``specs`` (role -> spec) on this node too, from now on (a re-plan
        moved them here); a role already known takes the new spec for its next start."""
        self._opened().add_specs(specs)

    @_carry_errors
    async def start(self, role: str) -> Endpoint:
        """Start ``role``'s backend on this node and return once it is ready.

        Raises (carried): as ``SupervisorBackends.start`` (``WeightsError``,
        ``PortInUseError``, ``BackendStartError`` ...).
        """
        return await self._opened().start(role)

    @_carry_errors
    async def stop(self, role: str) -> None:
        """Stop ``role``'s backend; returns after its process exited (a start under way fails)."""
        await self._opened().stop(role)

    @_carry_errors
    async def probe(self, role: str, timeout_s: float) -> ProbeResult:
        """The adapter's generation probe against ``role``'s backend on this node."""
        return await self._opened().probe(role, timeout_s=timeout_s)

    @_carry_errors
    async def restart(self, role: str) -> None:
        """Kill ``role``'s backend on this node; its supervisor starts it again."""
        await self._opened().restart(role)

    @_carry_errors
    async def close(self) -> None:
        """Stop every backend (returns once all exited) and release the state folder."""
        if self._supervisor is not None:
            await self._supervisor.stop_all()
        if self._lock is not None:
            self._lock.release()

    async def measured_bytes(self) -> dict[str, int]:
        """Backend name -> resident memory (RSS, bytes) of it and its children, measured now."""
        supervisor = self._supervisor
        if supervisor is None:
            return {}
        measured = {name: supervisor.measured_bytes(name) for name in supervisor.names()}
        return {name: rss for name, rss in measured.items() if rss is not None}

    async def peak_rss_bytes(self) -> dict[str, int]:
        """Role -> the largest peak RSS (bytes) of its backend on this node so far
        (``rosterd.backends.PeakSource``)."""
        if self._backends is None:
            return {}
        return await self._backends.peak_rss_bytes()

    async def backend_pids(self) -> dict[str, int]:
        """Backend name -> its current process id on this node."""
        supervisor = self._supervisor
        if supervisor is None:
            return {}
        backends = (supervisor.backend(name) for name in supervisor.names())
        return {b.name: b.pid for b in backends if b is not None}

    async def next_events(self, timeout_s: float = EVENT_POLL_S) -> list[BackendEvent]:
        """The backend events since the last call, oldest first; waits up to ``timeout_s``
        seconds for one when there is none (an empty list then)."""
        if not self._events:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
        events, self._events = self._events, []
        self._arrived.clear()
        return events

    def _record(self, event: BackendEvent) -> None:
        self._events.append(event)
        self._arrived.set()

    def _weights_for(self, spec: InferenceSpec) -> WeightsSource:
        found = resolve_for_fleet(spec, self.config.fleet, repo=self.config.repos.get(spec.role))
        if found is None:
            raise RosterdError(f"role {spec.role}: its flavor keeps its own weights")
        return found

    def _opened(self) -> SupervisorBackends:
        if self._backends is None:
            node = self.config.node
            raise NodeAgentError(node, f"the agent of node {node} is not open")
        return self._backends


@contextlib.contextmanager
def map_ray_errors(node: str) -> Iterator[None]:
    """Turn Ray's errors of a call to ``node``'s agent into rosterd's (the one place it is done).

    - a rosterd error raised by the agent -> that error, same class and attributes;
    - the actor died (its process, or its whole Ray node) -> ``NodeLostError``;
    - any other Ray error (a fault inside the agent, the actor unreachable for
      a moment, the Ray system) -> ``NodeAgentError``; the cause is chained.
    """
    from ray import exceptions as ray_errors  # the ray extra; only reached with a Ray fleet

    try:
        yield
    except ray_errors.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, CarriedError):
            raise cause.unwrap() from None
        raise NodeAgentError(
            node, f"the agent of node {node} failed: {type(cause).__name__}: {cause}"
        ) from exc
    except ray_errors.ActorUnavailableError as exc:
        raise NodeAgentError(node, f"the agent of node {node} cannot be reached: {exc}") from exc
    except ray_errors.RayActorError as exc:
        why = _first_line(exc)
        raise NodeLostError(node, f"node {node} is lost: its agent died ({why})") from exc
    except ray_errors.RayError as exc:
        raise NodeAgentError(node, f"Ray failed calling node {node}'s agent: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def _await_ref(ref: Awaitable[_T]) -> _T:
    """Await a Ray ObjectRef; cancelled while waiting, cancel the remote call too."""
    try:
        return await ref
    except asyncio.CancelledError:
        import ray

        with contextlib.suppress(Exception):
            ray.cancel(ref)
        raise


class AgentBackends:
    """The node scheduler's backends boundary for a node run by a :class:`NodeAgent`.

    ``node``: the fleet node; ``actor``: the opened agent's Ray actor handle
    (made by ``rosterd.ray_cluster``); ``on_event``: hears every backend event
    of the node as ``Supervisor(on_event=...)`` would (called on the event
    loop; the event's ``pid`` is a process on the node's machine);
    ``on_lost(node, reason)``: told once when the node is taken as lost.

    ``start`` returns an ``Endpoint`` whose ``pid`` is ``None`` (the process is
    not on this machine; :meth:`measured_bytes` gives its RSS). After the node
    is lost (:meth:`lost`), ``start`` raises ``NodeLostError``, ``stop`` returns
    at once (nothing of the node runs: its backends died with the agent), and
    every role that was running gets an ``exited`` then a final
    ``restart_failed`` event, so its node scheduler stops serving it, and the
    agent is ended if it still runs (its backends die with it).
    """

    def __init__(
        self,
        node: str,
        actor: Any,  # a ray.actor.ActorHandle: its methods are looked up at run time
        *,
        on_event: Callable[[BackendEvent], None] | None = None,
        on_lost: Callable[[str, str], None] | None = None,
        event_poll_s: float = EVENT_POLL_S,
    ) -> None:
        self.node = node
        self._actor = actor
        self._on_event = on_event
        self._on_lost = on_lost
        self._event_poll_s = event_poll_s
        self._running: set[str] = set()
        self._pids: dict[str, int] = {}  # role -> its backend's last pid on the node
        self._lost_reason: str | None = None
        self._pump: asyncio.Task[None] | None = None
        #: What the agent said when it opened (set by whoever opened it).
        self.info: AgentInfo | None = None

    @property
    def lost_reason(self) -> str | None:
        """Why the node is lost, or ``None`` while it is not."""
        return self._lost_reason

    def start_events(self) -> None:
        """Start forwarding the agent's backend events to ``on_event`` (on the running loop)."""
        if self._pump is None:
            self._pump = asyncio.create_task(
                self._forward_events(), name=f"rosterd-agent-{self.node}"
            )

    async def start(self, role: str) -> Endpoint:
        """Start ``role``'s backend on the node; returns once it is ready.

        Raises:
            NodeLostError: the node (or its agent) is gone.
            NodeAgentError: the agent failed otherwise.
            RosterdError: what the node's supervisor raised (same class as locally).
        """
        self._check_not_lost()
        endpoint: Endpoint = await self.call(self._actor.start.remote(role))
        self._running.add(role)
        return Endpoint(endpoint.base_url, endpoint.served_model, None)

    async def add_roles(self, specs: Mapping[str, InferenceSpec]) -> None:
        """Let the node run the roles ``specs`` (role -> spec) too (a re-plan moved them
        here); call before the node scheduler is given them.

        Raises:
            NodeLostError: the node (or its agent) is gone.
            NodeAgentError: the agent failed otherwise.
        """
        self._check_not_lost()
        await self.call(self._actor.add_roles.remote(dict(specs)))

    async def stop(self, role: str) -> None:
        """Stop ``role``'s backend on the node; returns after it exited (at once when lost:
        the backend died with the agent, so there is nothing to wait for).

        Raises:
            NodeAgentError: the agent failed otherwise (the backend may still run).
            RosterdError: what the node's supervisor raised.
        """
        if self._lost_reason is None:
            with contextlib.suppress(NodeLostError):
                await self.call(self._actor.stop.remote(role))
        self._running.discard(role)

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        """The generation probe of ``role``'s backend, run on its node (a failed result
        when the node is lost).

        Raises:
            NodeAgentError: the agent failed otherwise.
        """
        if self._lost_reason is not None:
            return ProbeResult(False, None, f"node {self.node} is lost: {self._lost_reason}")
        result: ProbeResult = await self.call(self._actor.probe.remote(role, timeout_s))
        return result

    async def restart(self, role: str) -> None:
        """Kill ``role``'s backend on its node; that node's supervisor starts it again.

        Raises:
            NodeLostError: the node (or its agent) is gone.
            NodeAgentError: the agent failed otherwise.
        """
        self._check_not_lost()
        await self.call(self._actor.restart.remote(role))

    async def measured_bytes(self) -> dict[str, int]:
        """Role -> RSS in bytes of its backend on the node, measured now (``{}`` when lost)."""
        if self._lost_reason is not None:
            return {}
        measured: dict[str, int] = await self.call(self._actor.measured_bytes.remote())
        return measured

    async def peak_rss_bytes(self) -> dict[str, int]:
        """Role -> the largest peak RSS (bytes) of its backend on the node so far, sampled
        there (``rosterd.backends.PeakSource``; ``{}`` when lost)."""
        if self._lost_reason is not None:
            return {}
        peaks: dict[str, int] = await self.call(self._actor.peak_rss_bytes.remote())
        return peaks

    async def backend_pids(self) -> dict[str, int]:
        """Role -> the pid of its backend on the node's machine (``{}`` when lost)."""
        if self._lost_reason is not None:
            return {}
        pids: dict[str, int] = await self.call(self._actor.backend_pids.remote())
        return pids

    def lost(self, reason: str) -> None:
        """Take the node as lost (idempotent): see the class docstring for what follows."""
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
        for role in sorted(self._running):
            pid = self._pids.get(role)
            self._emit(BackendEvent(role, "exited", pid=pid, detail=reason))
            self._emit(BackendEvent(role, "restart_failed", pid=pid, detail=reason, final=True))
        self._running.clear()
        self._pids.clear()
        # Ray may declare a node dead that still runs (a network split): end the agent,
        # and with it its backends, so that nothing of a lost node goes on holding memory.
        self._kill_actor()
        if self._on_lost is not None:
            self._on_lost(self.node, reason)

    async def close(self) -> None:
        """Stop every backend of the node and end the agent; returns once they exited."""
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        if self._lost_reason is None:
            with contextlib.suppress(NodeAgentError):
                await self.call(self._actor.close.remote())
        self._running.clear()
        self._kill_actor()

    def _kill_actor(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # already dead is fine
            ray.kill(self._actor, no_restart=True)

    async def call(self, ref: Awaitable[_T]) -> _T:
        """Await ``ref`` (a call to the agent), Ray's errors mapped by :func:`map_ray_errors`;
        a ``NodeLostError`` also takes the node as lost."""
        try:
            with map_ray_errors(self.node):
                return await _await_ref(ref)
        except NodeLostError as err:
            self.lost(str(err))
            raise

    def _check_not_lost(self) -> None:
        if self._lost_reason is not None:
            raise NodeLostError(self.node, self._lost_reason)

    def _emit(self, event: BackendEvent) -> None:
        if event.kind == "ready" and event.pid is not None:
            self._pids[event.name] = event.pid
        if event.name in self._running and (
            event.kind == "stopped" or (event.kind == "restart_failed" and event.final)
        ):
            self._running.discard(event.name)
        if self._on_event is not None:
            self._on_event(event)

    async def _forward_events(self) -> None:
        while self._lost_reason is None:
            try:
                events: list[BackendEvent] = await self.call(
                    self._actor.next_events.remote(self._event_poll_s)
                )
            except NodeLostError:
                return
            except NodeAgentError:
                await asyncio.sleep(1.0)  # unreachable for a moment: ask again
                continue
            for event in events:
                self._emit(event)
