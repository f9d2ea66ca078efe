"""The fleet loop (DESIGN.md layer 6): the one task that takes fleet events one at a time,
hands each to the pure :class:`~rosterd.fleet_scheduler.machine.FleetMachine` and applies
the effects it returns, in order, through :class:`FleetEffects`.

:class:`FleetEffects` is the fleet's syscall table, as ``RoleBackends`` is a node's:
everything the fleet level can do to the world (solve a plan, start and end node
agents, teach nodes their roles, apply a plan to the node schedulers, route, tell
the operator, warm roles). ``rosterd.up`` implements it. An effect whose answer is
an event (``Solve``, ``StartAgents``, ``Teach``, ``ApplyPlan``) is awaited and its
answer handled before the next event from outside, so a change is never
interleaved with another: a node lost while a reload solves is handled once the
reload is over, against the state it left. Callers never read the machine's state
to decide; they post an event (:meth:`FleetLoop.change`, :meth:`FleetLoop.node_lost`,
:meth:`FleetLoop.cluster_seen`) and, for a change, wait for its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from rosterd.errors import NothingToServeError, ReloadRefusedError
from rosterd.fleet_scheduler.effects import (
    Answer,
    ApplyPlan,
    DropAgents,
    FleetEffect,
    MarkLost,
    Record,
    Routes,
    Say,
    ShowPlan,
    Solve,
    StartAgents,
    Teach,
    Warm,
)
from rosterd.fleet_scheduler.events import (
    AgentsStarted,
    ClusterSeen,
    EffectFailed,
    FleetEvent,
    NodeLost,
    PlanApplied,
    PlanSolved,
    Reload,
    Taught,
)
from rosterd.fleet_scheduler.machine import FleetMachine
from rosterd.fleet_scheduler.values import Connection, ServedConfig
from rosterd.placement.problem import Plan
from rosterd.ray_match import RayNode

log = logging.getLogger("rosterd.fleet")


class FleetEffects(Protocol):
    """What the fleet loop asks of the world (the fleet's syscall table).

    Each method applies one effect of :mod:`rosterd.fleet_scheduler.effects`. The
    awaited ones answer with what happened; none of them decides anything.
    """

    async def solve(self, effect: Solve) -> tuple[Plan, Plan]:
        """``(full, served)``: the whole fleet's plan (``served`` itself unless
        ``effect.whole``) and the plan of ``effect.running``. Runs the solver off the
        loop. Contract: raises only for a bug (the loop answers it as a refusal)."""
        ...

    async def start_agents(
        self, effect: StartAgents
    ) -> tuple[AgentsStarted, Sequence[BaseException]]:
        """Start an agent on each node of the effect (concurrently, each to its end); what
        started and what failed with why, and the errors of those that failed.
        Contract: never raises for an agent that cannot start."""
        ...

    async def drop_agents(self, effect: DropAgents) -> None:
        """End the agents of the effect's nodes; returns once their backends stopped."""
        ...

    async def teach(self, effect: Teach) -> tuple[Taught, Sequence[BaseException]]:
        """Each node's backends learn what it serves; the nodes that could not, with why,
        and their errors. Contract: never raises for a node that cannot learn."""
        ...

    def apply_plan(self, effect: ApplyPlan) -> Mapping[str, object]:
        """Serve the effect's nodes from now on, in one step; what changed
        (``PlanChange.as_json``). Synchronous: no request sees half of it."""
        ...

    def route(self, effect: Routes) -> None:
        """Route by the effect from now on (in one step)."""
        ...

    def mark_lost(self, effect: MarkLost) -> None:
        """Tell the node's scheduler that it is lost."""
        ...

    def record(self, effect: Record) -> None:
        """Log and show a change decided for the fleet, in the node's event log."""
        ...

    def say(self, effect: Say) -> None:
        """Tell the operator one line, and log it."""
        ...

    def show_plan(self, effect: ShowPlan) -> None:
        """Show the plan the run starts with."""
        ...

    def warm(self, effect: Warm) -> None:
        """Load the roles in the background, evicting nothing (returns at once)."""
        ...


class FleetLoop:
    """The fleet's one task (see the module): ``machine`` decides, ``effects`` acts."""

    def __init__(self, machine: FleetMachine, effects: FleetEffects) -> None:
        self.machine = machine
        self.effects = effects
        self._inbox: asyncio.Queue[FleetEvent] = asyncio.Queue()
        self._tickets = itertools.count(1)
        self._answers: dict[int, asyncio.Future[Mapping[str, object]]] = {}
        self._failures: list[BaseException] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop's task on the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rosterd-fleet")

    async def close(self) -> None:
        """Stop taking events (a change under way is cut); waiting callers are refused."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for future in self._answers.values():
            if not future.done():
                future.set_exception(ReloadRefusedError("rosterd is stopping"))
        self._answers.clear()

    async def change(
        self,
        config: ServedConfig,
        connections: Mapping[str, Connection],
        *,
        force: bool = False,
        start: bool = False,
    ) -> Mapping[str, object]:
        """Serve ``config`` from now on (the machine's ``Reload``); what changed, as
        ``PlanChange.as_json`` with ``why`` (role -> why a reload stopped serving it)
        and ``warnings`` (the import's).

        Raises:
            ReloadRefusedError: the configuration was refused; the one in force stays.
            NothingToServeError: no node of it runs here or on the Ray cluster.
            RosterdError: at ``start``, the error of an agent that could not start.
        """
        ticket = next(self._tickets)
        future: asyncio.Future[Mapping[str, object]] = asyncio.get_running_loop().create_future()
        self._answers[ticket] = future
        self._inbox.put_nowait(Reload(ticket, config, dict(connections), force, start))
        try:
            return await asyncio.shield(future)
        finally:
            self._answers.pop(ticket, None)

    def node_lost(self, node: str, reason: str) -> None:
        """Fleet node ``node`` is lost (``reason``, in words); safe from any task."""
        self._inbox.put_nowait(NodeLost(node, reason))

    def cluster_seen(self, ray_nodes: Sequence[RayNode]) -> None:
        """A look at the Ray cluster listed ``ray_nodes`` (alive and dead)."""
        self._inbox.put_nowait(ClusterSeen(tuple(ray_nodes)))

    async def _run(self) -> None:
        while True:
            event = await self._inbox.get()
            self._failures = []
            await self.handle(event)

    async def handle(self, event: FleetEvent) -> None:
        """Hand ``event`` to the machine and apply its effects, with every answer they
        bring, until the change it started is over (what the task does for each event;
        tests call it directly)."""
        pending: list[FleetEvent] = [event]
        while pending:
            for effect in self.machine.handle(pending.pop(0)):
                try:
                    answer = await self._apply(effect)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a bug in an effect: the change ends as a refusal
                    log.exception("fleet effect %s failed", type(effect).__name__)
                    self._failures.append(exc)
                    pending = [EffectFailed(f"{type(exc).__name__}: {exc}")]
                    break
                if answer is not None:
                    pending.append(answer)

    async def _apply(self, effect: FleetEffect) -> FleetEvent | None:
        match effect:
            case Solve():
                full, served = await self.effects.solve(effect)
                return PlanSolved(full, served)
            case StartAgents():
                started, errors = await self.effects.start_agents(effect)
                self._failures.extend(errors)
                return started
            case Teach():
                taught, errors = await self.effects.teach(effect)
                self._failures.extend(errors)
                return taught
            case ApplyPlan():
                return PlanApplied(self.effects.apply_plan(effect))
            case DropAgents():
                await self.effects.drop_agents(effect)
            case Routes():
                self.effects.route(effect)
            case MarkLost():
                self.effects.mark_lost(effect)
            case Record():
                self.effects.record(effect)
            case Say():
                self.effects.say(effect)
            case ShowPlan():
                self.effects.show_plan(effect)
            case Warm():
                self.effects.warm(effect)
            case Answer():
                self._answer(effect)
        return None

    def _answer(self, answer: Answer) -> None:
        future = self._answers.get(answer.ticket)
        if future is None or future.done():
            return  # the caller gave up
        if answer.error is None:
            future.set_result(dict(answer.change or {}))
            return
        # At start an agent's own error says it best (its class and words, e.g. a
        # state folder another rosterd holds); a reload's refusal says the whole story.
        if len(self._failures) == 1 and _is_start(self.machine):
            future.set_exception(self._failures[0])
        elif answer.nothing_to_serve:
            future.set_exception(NothingToServeError(answer.error))
        else:
            future.set_exception(ReloadRefusedError(answer.error))


def _is_start(machine: FleetMachine) -> bool:
    """Whether nothing was served yet (the start's change was refused)."""
    return machine.config is None
