"""One way to run fleet nodes on a machine (between DESIGN.md layers 5 and 6): the state
folder's lock, one supervisor, the leftovers of an earlier run reaped, and the backends
of each node it runs, with one rule for finding a role's weights.

``rosterd up`` opens one :class:`NodeHost` for the nodes of this machine (on its state
folder), and a node agent opens one on its own node (on ``<root>/nodes/<node>``):
both then start, stop, probe and measure backends through the same
:class:`~rosterd.backends.local.SupervisorBackends`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rosterd.adapters import WeightsSource
from rosterd.backends.copy_names import LocalCopies, role_of_copy
from rosterd.backends.kv_keep import DEFAULT_KV_DISK_BYTES, KvKeeper
from rosterd.backends.local import SupervisorBackends
from rosterd.errors import WeightsError
from rosterd.fleet import Fleet
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, StateDirLock, Supervisor, lock_state_dir
from rosterd.weights import resolve_for_fleet


@dataclass(frozen=True)
class ServingFacts:
    """What a node's backends need of a configuration to start its roles (sent to a node
    agent as is): the ``fleet`` (its ``models`` and ``model_roots`` resolve the weights,
    on the node), ``repos`` (role -> the roster's Hugging Face repo) and ``model_names``
    (role -> the roster's own ``name``, which a shared server knows the model by)."""

    fleet: Fleet
    repos: Mapping[str, str | None] = field(default_factory=dict)
    model_names: Mapping[str, str] = field(default_factory=dict)


def weights_resolver(facts: ServingFacts) -> Callable[[InferenceSpec], WeightsSource]:
    """The one rule for a role's weights: the fleet's ``models:`` entry, else the local
    Hugging Face cache by the roster's repo (``rosterd.weights.resolve_for_fleet``).

    The resolver raises ``WeightsError`` naming what it looked for, also for a flavor
    that keeps its own weights (ollama: nothing to resolve).
    """

    def resolve(spec: InferenceSpec) -> WeightsSource:
        # A further copy on a node's other device (chat~2) has its role's weights.
        spec = dataclasses.replace(spec, role=role_of_copy(spec.role))
        found = resolve_for_fleet(spec, facts.fleet, repo=facts.repos.get(spec.role) or None)
        if found is None:
            raise WeightsError(f"role {spec.role}: its flavor keeps its own weights")
        return found

    return resolve


def _asks_copies(facts: ServingFacts) -> Callable[[InferenceSpec], bool]:
    """Whether a spec's fleet ``models:`` entry asks for more than one copy."""
    return lambda spec: facts.fleet.replicas_of(role_of_copy(spec.role), spec.model) > 1


def listen_host(address: str) -> str:
    """Where a node's backends listen: its address (``localhost`` as ``127.0.0.1``)."""
    return "127.0.0.1" if address == "localhost" else address


class NodeHost:
    """The fleet nodes one machine runs (see the module): ``state_dir`` holds the lock,
    the backends' logs and pid records; ``grace_s``: SIGTERM to SIGKILL, seconds;
    ``on_event`` hears every backend event of the supervisor; ``auto_ports`` and
    ``ready_timeout_s`` (seconds) as ``SupervisorBackends``'; ``kv_disk_bytes``: the disk
    the kept KV caches may take (``--kv-disk-gb``); ``progress_window_s`` as
    ``SupervisorBackends``' (``--progress-window``); ``names_copies``: this machine may run
    several nodes (``rosterd up``), so the copies of a role whose fleet entry asks for
    ``replicas`` run as ``<role>@<node>`` (``rosterd.backends.copy_names``); a node agent,
    which runs one node, keeps every role's name. Call :meth:`open` first."""

    def __init__(
        self,
        state_dir: Path,
        *,
        grace_s: float = 10.0,
        on_event: Callable[[BackendEvent], None] | None = None,
        auto_ports: bool = False,
        ready_timeout_s: float | None = None,
        kv_disk_bytes: int = DEFAULT_KV_DISK_BYTES,
        progress_window_s: float = 45.0,
        names_copies: bool = False,
    ) -> None:
        self.state_dir = state_dir
        self.names_copies = names_copies
        #: What every node's backends started here, by (node, role): names and ports.
        self.copies = LocalCopies()
        self.progress_window_s = progress_window_s
        #: The kept KV caches of this machine's roles (``<state_dir>/kv``).
        self.kv = KvKeeper(state_dir / "kv", disk_budget_bytes=kv_disk_bytes)
        self.auto_ports = auto_ports
        self.ready_timeout_s = ready_timeout_s
        self.supervisor = Supervisor(state_dir, grace_s=grace_s, on_event=on_event)
        self._lock: StateDirLock | None = None
        #: The pids of backends an earlier run left, stopped by :meth:`open`.
        self.reaped: tuple[int, ...] = ()

    def lock(self) -> None:
        """Take the state folder's lock (idempotent), before anything else is done there.

        Raises:
            StateDirLockedError: another rosterd runs from this folder.
            OSError: the folder cannot be made.
        """
        if self._lock is None:
            self._lock = lock_state_dir(self.state_dir)

    async def open(self) -> tuple[int, ...]:
        """Take the lock (:meth:`lock`), stop the backends an earlier run left here and read
        the kept KV records (in a thread: file I/O stays off the event loop); the pids.

        Raises:
            StateDirLockedError: another rosterd runs from this folder.
        """
        self.lock()
        self.reaped = tuple(await self.supervisor.reap_leftovers())
        await asyncio.to_thread(self.kv.load)
        return self.reaped

    def backends(
        self, node: str, address: str, specs: Mapping[str, InferenceSpec], facts: ServingFacts
    ) -> SupervisorBackends:
        """New backends for fleet node ``node`` (at ``address``) serving ``specs`` (role ->
        spec) under ``facts``, over this machine's supervisor."""
        return SupervisorBackends(
            self.supervisor,
            specs,
            host=listen_host(address),
            resolve_weights=weights_resolver(facts),
            auto_ports=self.auto_ports,
            ready_timeout_s=self.ready_timeout_s,
            node=node,
            model_names=facts.model_names,
            kv=self.kv,
            progress_window_s=self.progress_window_s,
            copies=self.copies,
            names_copies=_asks_copies(facts) if self.names_copies else None,
        )

    async def close(self) -> None:
        """Stop every backend (returns once all exited) and release the lock."""
        try:
            await self.supervisor.stop_all()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
