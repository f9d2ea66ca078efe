"""The head's side of a node agent (DESIGN.md layer 6): the backends boundary over its actor.

On the head, :class:`AgentBackends` is the node scheduler's backends boundary
(``start(role) -> Endpoint``, ``stop(role)``, probes, restarts, measurements)
over the agent's (:class:`~rosterd.node_agent.actor.NodeAgent`) actor handle,
and forwards the agent's backend events to a callback of the shape
``Supervisor(on_event=...)`` has: the node scheduler cannot tell a remote node
from the local one. Ray's errors become rosterd's in one place,
:func:`map_ray_errors`; a rosterd error raised on the node crosses Ray as a
:class:`~rosterd.errors.CarriedError` and is raised here as itself.

Library choice: Ray (an existing distributed engine, the ``ray`` extra) carries
control calls; it is imported only when a call reaches it, so ``rosterd``
without the extra never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from rosterd.backends.interface import Endpoint
from rosterd.backends.node_host import ServingFacts
from rosterd.backends.values import KeptKv
from rosterd.errors import (
    CarriedError,
    NodeAgentError,
    NodeLostError,
    NodeUnreachableError,
    RosterdError,
)
from rosterd.fleet.model import Node
from rosterd.node_agent.actor import EVENT_POLL_S, AgentInfo, ProbedPools
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, ProbeResult

_T = TypeVar("_T")

#: How long a probe's call may outlive the probe's own timeout (it runs on the node and
#: bounds itself) before the agent counts as not answering, seconds: a node whose power
#: was cut answers nothing, and Ray says so only once it declares the node dead.
PROBE_CALL_MARGIN_S = 3.0


@contextlib.contextmanager
def map_ray_errors(node: str) -> Iterator[None]:
    """Turn Ray's errors of a call to ``node``'s agent into rosterd's (the one place it is done).

    - a rosterd error raised by the agent -> that error, same class and attributes;
    - the actor died (its process, or its whole Ray node) -> ``NodeLostError``;
    - the actor unreachable (Ray's ``ActorUnavailableError``: its node may be gone,
      or cut off for a moment) -> ``NodeUnreachableError``;
    - any other Ray error (a fault inside the agent, the Ray system) -> ``NodeAgentError``;
      the cause is chained.
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
        why = _first_line(exc)
        raise NodeUnreachableError(
            node, f"the agent of node {node} cannot be reached ({why})"
        ) from exc
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
    not on this machine; :meth:`measured_bytes` gives its RSS, :meth:`device_bytes` what it
    holds on the node's NVIDIA GPUs). :meth:`pools` asks the agent for its node's devices,
    probed there. What the node keeps of
    each role's KV cache (:meth:`kept_kv`) is asked of the agent after every start and
    stop (:meth:`refresh_kept`): it changes only then. After the node
    is lost (:meth:`lost`), ``start`` raises ``NodeLostError``, ``stop`` returns
    at once (nothing of the node runs: its backends died with the agent), and
    every role that was running gets an ``exited`` then a final
    ``restart_failed`` event, so its node scheduler stops serving it, and the
    agent is ended if it still runs (its backends die with it).
    """

    #: An endpoint's pid is a process of the node's machine, not of this one.
    pids_are_local = False

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
        self._kept: dict[str, dict[str, object]] = {}  # role -> the node's kept KV, as last asked
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
        await self.refresh_kept()  # the start restored what was kept
        return Endpoint(endpoint.base_url, endpoint.served_model, None, endpoint.restored_tokens)

    async def add_roles(self, specs: Mapping[str, InferenceSpec]) -> None:
        """Let the node run the roles ``specs`` (role -> spec) too (a re-plan moved them
        here); call before the node scheduler is given them.

        Raises:
            NodeLostError: the node (or its agent) is gone.
            NodeAgentError: the agent failed otherwise.
        """
        self._check_not_lost()
        await self.call(self._actor.add_roles.remote(dict(specs)))

    async def reconfigure(
        self,
        specs: Mapping[str, InferenceSpec],
        facts: ServingFacts,
        pins: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """Let the node serve a reloaded configuration: the roles ``specs`` (role -> spec),
        weights found there and ollama models named by ``facts``, each role pinned to its
        device by ``pins`` (role -> llama-server flags; ``None``: unchanged); call before
        the node scheduler is given them.

        Raises:
            NodeLostError: the node (or its agent) is gone.
            NodeAgentError: the agent failed otherwise.
        """
        self._check_not_lost()
        pinned = dict(pins) if pins is not None else None
        await self.call(self._actor.reconfigure.remote(dict(specs), facts, pinned))

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
            await self.refresh_kept()  # the stop saved its slots
        self._running.discard(role)

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        """The generation probe of ``role``'s backend, run on its node (a failed result
        when the node is lost).

        Raises:
            NodeUnreachableError: the agent did not answer within ``timeout_s`` plus
                ``PROBE_CALL_MARGIN_S`` (or Ray could not reach it): the node's verdict
                (back or lost) is Ray's, not a failed probe.
            NodeLostError: Ray says the agent (or its node) died.
            NodeAgentError: the agent failed otherwise.
        """
        if self._lost_reason is not None:
            return ProbeResult(False, None, f"node {self.node} is lost: {self._lost_reason}")
        bound_s = timeout_s + PROBE_CALL_MARGIN_S
        try:
            async with asyncio.timeout(bound_s):
                result: ProbeResult = await self.call(self._actor.probe.remote(role, timeout_s))
        except TimeoutError:
            raise NodeUnreachableError(
                self.node, f"the agent of node {self.node} did not answer within {bound_s:g} s"
            ) from None
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
        there (``rosterd.backends.interface.PeakSource``; ``{}`` when lost)."""
        if self._lost_reason is not None:
            return {}
        peaks: dict[str, int] = await self.call(self._actor.peak_rss_bytes.remote())
        return peaks

    async def pools(self, node: Node) -> ProbedPools:
        """``node``'s pools (``node``: this agent's fleet node as the fleet file declares it)
        probed on the node by its agent (``NodeAgent.pools``): ``llama-server
        --list-devices`` and NVML there, merged with ``node``'s declared devices.

        Raises:
            NodeLostError: the node (or its agent) is gone.
            NodeUnreachableError: the agent cannot be reached.
            NodeAgentError: the agent failed otherwise.
        """
        self._check_not_lost()
        probed: ProbedPools = await self.call(self._actor.pools.remote(node))
        return probed

    async def device_bytes(self) -> dict[str, dict[str, int]]:
        """Role -> device id -> bytes its backend holds on that NVIDIA GPU of the node now,
        read there by NVML, per process (``rosterd.backends.interface.DeviceBytesSource``;
        ``{}`` when lost, or where NVML reads nothing)."""
        if self._lost_reason is not None:
            return {}
        held: dict[str, dict[str, int]] = await self.call(self._actor.device_bytes.remote())
        return held

    def kept_kv(self, role: str) -> KeptKv | None:
        """What the node keeps of ``role``'s KV cache (``KeptKvSource``), as the agent said
        after the last start or stop (``None``: nothing known, or the node is lost)."""
        if self._lost_reason is not None:
            return None
        kept = self._kept.get(role)
        return KeptKv.from_json(kept) if kept is not None else None

    async def refresh_kept(self) -> None:
        """Ask the agent what its node keeps of each role's KV cache now (a failed call
        keeps the last answer: the figures are for display)."""
        if self._lost_reason is not None:
            return
        with contextlib.suppress(RosterdError):
            self._kept = await self.call(self._actor.kept_kv.remote())

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
