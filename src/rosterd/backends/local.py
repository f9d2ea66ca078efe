"""The backends boundary's implementation on this machine (between DESIGN.md layers 5 and 6):
:class:`SupervisorBackends`, over the local supervisor and the flavor adapters.

It implements the Protocols of :mod:`rosterd.backends.interface` (``RoleBackends``,
``BackendEventSource``, ``MeasuredBackends``, ``PeakSource``, ``ReportedDeviceBytes``).

A flavor with one server per node (ollama) declares the capability on its
adapter (``Adapter.shared_server``); this module asks for the capability, never
for the adapter's type, and hands such roles to
:class:`rosterd.backends.shared.SharedServers`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from rosterd.adapters import Adapter, Launch, SharedServer, WeightsSource, adapter_for
from rosterd.backends.copy_names import (
    HeldBackend,
    LocalCopies,
    copy_backend_name,
    role_of_backend,
)
from rosterd.backends.interface import Endpoint
from rosterd.backends.kv_keep import KeptTotals, KvKeeper
from rosterd.backends.shared import SharedServers
from rosterd.backends.values import KeptKv
from rosterd.devices.load_buffers import LoadReport, parse_load_report
from rosterd.errors import BackendAlreadySupervisedError, PortInUseError
from rosterd.model_facts.slot_reuse import slot_reuse_of
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.supervisor import (
    BackendEvent,
    ProbeResult,
    Supervisor,
    free_port,
    latest_run_output,
    process_tree_peak_rss_bytes,
)

#: How long a start waits for the role's process on the node it moved from to exit, seconds
#: (that node drains first: up to ``--drain``, then ``--grace``).
_PREVIOUS_WAIT_S = 600.0
#: Starts tried on ports rosterd picked, when another process takes one before the bind.
_BIND_RACE_TRIES = 3

#: Re-exported: a TCP port nothing listens on (``rosterd.supervisor.free_port``).
__all__ = ["SupervisorBackends", "free_port"]

log = logging.getLogger("rosterd.kv")


class SupervisorBackends:
    """:class:`RoleBackends` over the supervisor and the flavor adapters (what ``rosterd up`` uses).

    ``specs``: role -> spec for the roles of one node run by ``supervisor``;
    ``host``: where backends listen (the node's address);
    ``resolve_weights(spec)`` gives the role's weights (raises a
    ``WeightsError`` naming what it looked for); ``auto_ports``: ignore the
    roster's ports and let the OS pick free ones (roles without a port always
    get one); ``ready_timeout_s``: readiness deadline, seconds (``None``: the
    supervisor's, which grows with the weights' size); ``adapters``: flavor ->
    adapter (default ``adapter_for``); ``model_names``: role -> the name a shared server
    knows the role's model by when its spec names none (the roster's own ``name``: an
    ollama tag such as ``llama3.1:8b`` is no plain token, so the import keeps no model
    for it, as roster.rs does); otherwise the spec's model, then the role id; ``kv``: the
    machine's kept KV caches (``None``: nothing is kept), used for roles whose adapter can
    save its slots and whose fleet entry keeps them (``keep_kv``, the default): a start
    restores them before it returns, a stop saves them before the process is stopped unless
    they were saved while the role was idle (:meth:`save_kv`) and served nothing since;
    ``progress_window_s``: how long a backend that gave its generation probe no answer is
    watched for progress before it counts as wedged (``--progress-window``, seconds);
    ``copies``: the backends this machine's supervisor was asked to start, shared by every
    node it runs (default: this node's own); ``names_copies(spec)``: whether the role of
    ``spec`` runs under its copy's name (``<role>@<node>``, :meth:`backend_name`; default:
    never, as on a node agent, whose supervisor runs one node).

    Roles of a flavor with one shared server per node (an adapter whose
    ``shared_server`` is set: ollama) are not processes: they go to
    :class:`~rosterd.backends.shared.SharedServers` (the node's server, named
    ``<flavor>.<node>`` after ``node``, loads and unloads their models).

    It is also a :class:`BackendEventSource`: hand it the supervisor's events
    with :meth:`notice` and :meth:`changes` gives back those of its roles; and a
    :class:`PeakSource`: the peak RSS of each role it started, sampled before every
    stop (for a shared server's role, the size the server reports for its model,
    read after the load, before the unload and whenever peaks are asked for).
    """

    def __init__(
        self,
        supervisor: Supervisor,
        specs: Mapping[str, InferenceSpec],
        *,
        host: str,
        resolve_weights: Callable[[InferenceSpec], WeightsSource],
        auto_ports: bool = False,
        ready_timeout_s: float | None = None,
        adapters: Callable[[InferFlavor], Adapter] = adapter_for,
        node: str = "node",
        model_names: Mapping[str, str] | None = None,
        kv: KvKeeper | None = None,
        progress_window_s: float = 45.0,
        copies: LocalCopies | None = None,
        names_copies: Callable[[InferenceSpec], bool] | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.copies = copies if copies is not None else LocalCopies()
        self.names_copies = names_copies
        self.progress_window_s = progress_window_s
        self.kv = kv
        # role -> why its KV cache is not kept (its architecture cannot reuse a restore).
        self.kv_not_kept: dict[str, str] = {}
        self.model_names = dict(model_names or {})
        self.specs = dict(specs)
        self.host = host
        self.resolve_weights = resolve_weights
        self.auto_ports = auto_ports
        self.ready_timeout_s = ready_timeout_s
        self.adapters = adapters
        self.node = node
        self.shared = SharedServers(
            supervisor, host=host, node=node, auto_ports=auto_ports, ready_timeout_s=ready_timeout_s
        )
        self._changes: asyncio.Queue[BackendEvent] = asyncio.Queue()
        self._peaks: dict[str, int] = {}
        # role -> (pid, what that process logged allocating as it loaded): read once a run
        self._load_reports: dict[str, tuple[int, LoadReport]] = {}
        self._started: set[str] = set()  # whose peaks are this instance's to report
        #: Role -> the flags pinning its device and offload (issue 29: ``--device CUDA0
        #: -ngl 999 --fit off``), given by the plan; appended last, so they win over the
        #: fleet's ``args``. A role not in it (a node without devices) launches as before.
        self.pins: dict[str, tuple[str, ...]] = {}

    #: Whether an endpoint's pid is a process of this machine (``NodeBackends``).
    pids_are_local = True

    def add_specs(self, specs: Mapping[str, InferenceSpec]) -> None:
        """Run the roles ``specs`` (role -> spec) too, from now on (a re-plan moved them
        to this node); a role already known takes the new spec for its next start."""
        self.specs.update(specs)

    def reconfigure(
        self,
        specs: Mapping[str, InferenceSpec],
        resolve_weights: Callable[[InferenceSpec], WeightsSource],
        model_names: Mapping[str, str],
    ) -> None:
        """Serve a reloaded configuration from now on: the roles ``specs`` too, weights
        found by ``resolve_weights``, shared-server models named by ``model_names``. A
        role running now keeps its process; its next start takes the new spec."""
        self.add_specs(specs)
        self.resolve_weights = resolve_weights
        self.model_names = dict(model_names)

    async def start(self, role: str) -> Endpoint:
        """Resolve the weights, build the adapter's launch, start it and wait until ready.

        Raises:
            AdapterError: the flavor cannot serve this role (``OllamaError``
                when ollama refuses the model).
            WeightsError: weights not found.
            SupervisorError: its subclasses
                (``PortInUseError``, ``BackendStartError`` with the output tail).
        """
        spec = self.specs[role]
        adapter = self.adapters(spec.flavor)
        shared = adapter.shared_server
        if shared is not None:
            return await self._load_shared(spec, shared)
        name = self._start_name(role)
        await self._after_previous(role, name)
        self._started.add(role)
        # A new run: its peak is its own (a reload may have changed what it launches;
        # the recorder keeps the largest of this `up` for unchanged settings).
        self._peaks.pop(role, None)
        source = self.resolve_weights(spec)
        grace = getattr(source, "grace_s", None)  # the fleet's models: entry, if it sets one
        keeping = adapter.slot_keeping if self.kv is not None else None
        if not getattr(source, "keep_kv", True):
            keeping = None  # the fleet's models: entry says keep_kv: false
        picked = self.auto_ports or spec.serve.port is None
        for attempt in range(1, _BIND_RACE_TRIES + 1):
            port = free_port(self.host) if picked else spec.serve.port
            assert port is not None
            if not picked and self.copies.port_held_by_other_copy(self.node, role, self.host, port):
                # Another copy of the role (another node's on this same address, or this
                # node's on another device) listens on the roster's port: this one takes a
                # free one.
                picked, port = True, free_port(self.host)
            # Held before anything awaits: a copy starting at once sees the port taken.
            self.copies.hold(self.node, role, HeldBackend(name, self.host, port))
            try:
                launch = adapter.launch(spec, source, host=self.host, port=port)
                if self.pins.get(role):
                    launch = replace(launch, argv=(*launch.argv, *self.pins[role]))
                if keeping is not None and not await self._slots_reusable(role, source, launch):
                    keeping = None  # its architecture cannot reuse a restored slot: not saved
                if keeping is not None and self.kv is not None:
                    folder = self.kv.folder(name)
                    launch = replace(launch, argv=(*launch.argv, *keeping.launch_args(folder)))
                backend = await self.supervisor.start(
                    name,
                    launch,
                    ready_timeout_s=self.ready_timeout_s,
                    grace_s=grace if isinstance(grace, int | float) else None,
                )
            except PortInUseError:
                self.copies.release(self.node, role)
                # A port we picked was taken between the pick and the bind: pick again.
                if not picked or attempt == _BIND_RACE_TRIES:
                    raise
                continue
            except BaseException:
                self.copies.release(self.node, role)
                raise
            restored = 0
            if keeping is not None and self.kv is not None:
                # Before the start returns: the first request is granted only after it.
                result = await self.kv.started(name, keeping, launch, backend.base_url, source.path)
                restored = result.tokens if result.outcome == "restored" else 0
            return Endpoint(backend.base_url, launch.served_model, backend.pid, restored)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _slots_reusable(self, role: str, source: WeightsSource, launch: Launch) -> bool:
        """Whether ``role``'s backend, launched as ``launch``, could reuse a restored slot
        (``rosterd.model_facts.slot_reuse``: not a hybrid or recurrent model, nor a
        sliding-window one without ``--swa-full``); when not, says why once, and
        :meth:`kept_kv` shows it."""
        reuse = await asyncio.to_thread(slot_reuse_of, source.path, launch.argv)
        if reuse.reusable:
            self.kv_not_kept.pop(role, None)
        elif self.kv_not_kept.get(role) != reuse.why:
            self.kv_not_kept[role] = reuse.why
            log.info("%s: %s", role, reuse.why)
        return reuse.reusable

    def backend_name(self, role: str) -> str:
        """The supervisor's name of ``role``'s backend on this node: the name its process was
        started under while it runs (a reload may have changed the rule since), else the one
        a start takes (:meth:`_start_name`). Its log is ``logs/<name>.log``, its kept KV
        ``kv/<name>/``."""
        held = self.copies.held(self.node, role)
        return held.name if held is not None else self._start_name(role)

    def _start_name(self, role: str) -> str:
        """The name a start of ``role`` takes: ``<role>@<node>`` for a role whose fleet
        entry asks for copies on a supervisor that runs several nodes (``names_copies``),
        else the role's id, as for every role with one copy and for a shared server's
        roles, which are no process of their own (``rosterd.backends.copy_names``)."""
        spec = self.specs.get(role)
        if spec is None or self.names_copies is None or not self.names_copies(spec):
            return role
        if self.adapters(spec.flavor).shared_server is not None:
            return role
        return copy_backend_name(role, self.node)

    async def _after_previous(self, role: str, name: str) -> None:
        """Wait until no backend named ``name`` runs under the supervisor that other backends
        started: a re-plan that moved a role with one copy between two nodes of this machine
        (a node renamed, say) drains the old node while the new one starts, and the
        supervisor runs one process per name. A copy's name is its node's alone.

        Raises:
            BackendAlreadySupervisedError: the old process still runs after
                ``_PREVIOUS_WAIT_S``.
        """
        if role in self._started:
            return  # ours: the node's machine stops it before it starts it again
        deadline = asyncio.get_running_loop().time() + _PREVIOUS_WAIT_S
        # another node's drain, then its stop, free the name: there is no event to await
        while self.supervisor.backend(name) is not None:
            if asyncio.get_running_loop().time() > deadline:
                raise BackendAlreadySupervisedError(
                    f"backend {name} of the node it moved from still runs after "
                    f"{_PREVIOUS_WAIT_S:.0f} s"
                )
            await asyncio.sleep(0.05)

    async def stop(self, role: str) -> None:
        """Stop the role's backend; returns after the process exited (or, for a
        shared server, after it no longer holds the role's model)."""
        spec = self.specs[role]
        shared = self.adapters(spec.flavor).shared_server
        if shared is not None:
            measure = role in self._started
            size = await self.shared.unload(spec, shared, self._model_of(spec), measure=measure)
            self._note_size(role, size)
            return
        name = self.backend_name(role)
        if self.kv is not None and self.supervisor.backend(name) is not None:
            await self.kv.stopping(name)  # every stop we ask for saves first
        self._sample_peak(role)  # the process and its high-water mark are gone after the stop
        await self.supervisor.stop(name)
        self.copies.release(self.node, role)

    async def save_kv(self, role: str) -> None:
        """Save ``role``'s KV cache while it is idle (``IdleKvSaver``): its next stop only
        stops the process. A no-op without a keeper, or for a role whose KV is not kept."""
        if self.kv is not None:
            await self.kv.save_idle(self.backend_name(role))

    def kv_changing(self, role: str) -> None:
        """A lease was granted on ``role`` (``IdleKvSaver``): its KV must be saved again."""
        if self.kv is not None:
            self.kv.changing(self.backend_name(role))

    def past_loads_s(self, role: str) -> tuple[float, ...]:
        """``role``'s past loads on this machine (``LoadHistory``), seconds, oldest first:
        the supervisor's run records, kept across runs; a copy with none yet has its role's
        (the same weights and settings load alike)."""
        name = self.backend_name(role)
        return self.supervisor.past_loads_s(name) or self.supervisor.past_loads_s(role)

    def kept_kv(self, role: str) -> KeptKv | None:
        """What the machine keeps of ``role``'s KV cache (``KeptKvSource``), with the
        counts and bytes of its saves, restores and refusals in this run; ``None``
        without a keeper or for a role of another node."""
        if self.kv is None or role not in self.specs:
            return None
        if role in self.kv_not_kept:
            return KeptKv(tokens=0, file_bytes=0, not_kept=self.kv_not_kept[role])
        name = self.backend_name(role)  # each copy keeps its own: kv/<role>@<node>/
        kept = self.kv.kept(name)
        restore = self.kv.last_restore.get(name)
        totals = self.kv.totals.get(name) or KeptTotals()
        return KeptKv(
            tokens=kept.tokens,
            file_bytes=kept.file_bytes,
            last_restore=restore.outcome if restore is not None else None,
            last_restore_detail=restore.detail if restore is not None else None,
            saves=totals.saves,
            restores=totals.restores,
            refusals=totals.refusals,
            saved_bytes=totals.saved_bytes,
            restored_bytes=totals.restored_bytes,
        )

    async def measured_bytes(self) -> dict[str, int]:
        """Role -> RSS in bytes of its backend's process tree on this machine, measured now
        (roles without a process of their own, such as a shared server's, are left out)."""
        measured = {
            role: self.supervisor.measured_bytes(self.backend_name(role)) for role in self.specs
        }
        return {role: rss for role, rss in measured.items() if rss is not None}

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        """The adapter's generation probe against the role's process (one that gives no answer
        but whose progress probe shows it busy passes: ``Supervisor.probe``). Roles of a shared
        server (ollama) are not probed (their server is one process for many roles, so
        restarting it is not a per-role step): the result is ``ok``."""
        spec = self.specs[role]
        adapter = self.adapters(spec.flavor)
        if adapter.shared_server is not None:
            return ProbeResult(True, None, "a shared server's roles are not probed")
        name = self.backend_name(role)
        backend = self.supervisor.backend(name)
        if backend is None:
            return ProbeResult(False, None, "its backend is not running")
        probe = adapter.generation_probe(backend.launch.served_model)
        # A backend busy with a long prefill cannot answer in time: its progress says so.
        return await self.supervisor.probe(
            name,
            probe,
            timeout_s=timeout_s,
            progress=adapter.progress_probe,
            window_s=self.progress_window_s,
        )

    async def restart(self, role: str) -> None:
        """Kill the role's process and let the supervisor start it again (``Supervisor.restart``).

        Raises:
            BackendNotSupervisedError: the role has no running process.
        """
        await self.supervisor.restart(self.backend_name(role))

    async def peak_rss_bytes(self) -> dict[str, int]:
        """Role -> its backend's largest peak RSS (bytes) so far (see :class:`PeakSource`)."""
        for role in self._started:
            self._sample_peak(role)
        await self._sample_shared_sizes()
        return dict(self._peaks)

    async def load_reports(self) -> dict[str, LoadReport]:
        """Role -> what its backend's running process logged allocating per buffer as it
        loaded (llama-server's load lines: :mod:`rosterd.devices.load_buffers`), for each
        role these backends started whose process is ready; an empty report for a backend
        that logs none (another flavor; a build that logs them at trace level, run without
        ``-lv 4``). Read from the process's part of its log once per process, off the event
        loop: what it allocated while it loaded does not change while it runs."""
        reports: dict[str, LoadReport] = {}
        for role in sorted(self._started):
            name = self.backend_name(role)  # a copy's process and log: <role>@<node>
            backend = self.supervisor.backend(name)
            if backend is None or not backend.ready:
                continue  # a load under way has not logged all its buffers yet
            known = self._load_reports.get(role)
            if known is None or known[0] != backend.pid:
                text = await asyncio.to_thread(latest_run_output, backend.log_path, name)
                known = self._load_reports[role] = (backend.pid, parse_load_report(text))
            reports[role] = known[1]
        return reports

    async def reported_device_bytes(self) -> dict[str, dict[str, int]]:
        """Role -> device id -> bytes its running backend logged allocating on that device
        as it loaded (``ReportedDeviceBytes``: :meth:`load_reports`); roles whose backend
        allocated nothing on a device are left out."""
        reports = await self.load_reports()
        on_devices = {role: report.device_bytes() for role, report in reports.items()}
        return {role: held for role, held in on_devices.items() if held}

    def _sample_peak(self, role: str) -> None:
        if role not in self._started:
            return
        backend = self.supervisor.backend(self.backend_name(role))
        if backend is None:
            return
        peak = process_tree_peak_rss_bytes(backend.pid)
        if peak:
            self._peaks[role] = max(self._peaks.get(role, 0), peak)

    def _note_size(self, role: str, size: int) -> None:
        if size > 0:
            self._peaks[role] = max(self._peaks.get(role, 0), size)

    def notice(self, event: BackendEvent) -> bool:
        """Take a supervisor event (wire to ``Supervisor(on_event=...)``); whether it is
        one of this node's roles (only those reach :meth:`changes`, named by the role: a
        copy's ``<role>@<node>`` as ``<role>``)."""
        role, node = role_of_backend(event.name)
        if role not in self.specs or node not in (None, self.node):
            return False
        self._changes.put_nowait(replace(event, name=role) if node is not None else event)
        return True

    async def changes(self) -> Sequence[BackendEvent]:
        """The events :meth:`notice` took since the last call, oldest first (waits for one)."""
        events = [await self._changes.get()]
        while not self._changes.empty():
            events.append(self._changes.get_nowait())
        return events

    # ---- roles of a shared server (ollama) --------------------------------------

    def _model_of(self, spec: InferenceSpec) -> str:
        """The name the shared server knows ``spec``'s model by (see ``model_names``)."""
        return spec.model or self.model_names.get(spec.role) or spec.role

    async def _load_shared(self, spec: InferenceSpec, shared: SharedServer) -> Endpoint:
        endpoint, size = await self.shared.load(spec, shared, self._model_of(spec))
        self._started.add(spec.role)
        # What the server holds for the model is its measured figure (ollama's /api/ps).
        self._note_size(spec.role, size)
        return endpoint

    async def _sample_shared_sizes(self) -> None:
        """Note the size each shared server reports for the loaded models of its roles."""
        by_flavor: dict[InferFlavor, list[InferenceSpec]] = {}
        for role in self._started:
            spec = self.specs.get(role)
            if spec is not None and self.adapters(spec.flavor).shared_server is not None:
                by_flavor.setdefault(spec.flavor, []).append(spec)
        for flavor, specs in by_flavor.items():
            shared = self.adapters(flavor).shared_server
            if shared is None:
                continue
            sizes = await self.shared.sizes(flavor, shared, {self._model_of(s) for s in specs})
            for spec in specs:
                self._note_size(spec.role, sizes.get(self._model_of(spec), 0))
