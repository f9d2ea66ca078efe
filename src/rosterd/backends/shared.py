"""The shared-server path of the backends boundary (between DESIGN.md layers 5 and 6): the roles
of a flavor whose one server per node serves every role (ollama), made resident by its API.

A role of such a flavor is not a process of its own. The first load on a node
runs the node's server under the supervisor as ``<flavor>.<node>``; a role then
becomes resident when the server loads its model (``SharedServer.load``) and
leaves when the server no longer lists it after an unload (its memory is free
only then). The server itself stops with the supervisor. What the server holds
for a model (ollama's ``/api/ps`` ``size``) is the role's measured figure.

:class:`~rosterd.backends.local.SupervisorBackends` asks its adapters for the
capability (``Adapter.shared_server``) and hands such roles to
:class:`SharedServers`; neither asks which flavor it holds. httpx (the project's
HTTP client) talks to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import httpx

from rosterd.adapters import SharedServer
from rosterd.backends.interface import Endpoint
from rosterd.errors import AdapterError
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.supervisor import Backend, Supervisor, free_port, ready_timeout_for
from rosterd.supervisor.backend_http import backend_client

#: How long an unload waits for a shared server to answer, seconds.
SHARED_UNLOAD_S = 30.0
#: How long a shared server may take to free a model's memory after an unload, seconds.
SHARED_FREE_S = 60.0
#: How long a query of what a shared server holds may take, seconds.
SHARED_QUERY_S = 5.0


def listed_name(resident: Mapping[str, int] | None, model: str) -> str | None:
    """The name under which a shared server lists ``model`` (ollama lists a name without a
    tag as ``NAME:latest``), or ``None`` when it does not list it."""
    for name in (model, f"{model}:latest") if ":" not in model else (model,):
        if name in (resident or {}):
            return name
    return None


def listed_size(resident: Mapping[str, int] | None, model: str) -> int:
    """The size (bytes) a shared server lists for ``model``, 0 when it lists none."""
    name = listed_name(resident, model)
    return (resident or {}).get(name, 0) if name is not None else 0


class SharedServers:
    """The shared servers of one node, run by ``supervisor``: one per flavor that has one.

    ``host``: where the servers listen (the node's address); ``node`` names them
    (``<flavor>.<node>``); ``auto_ports``: let the OS pick the port instead of the
    role's or the flavor's default; ``ready_timeout_s``: the readiness deadline of a
    server and of a load, seconds (``None``: the supervisor's, which grows with the
    weights' size the roster declares).
    """

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        host: str,
        node: str,
        auto_ports: bool = False,
        ready_timeout_s: float | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.host = host
        self.node = node
        self.auto_ports = auto_ports
        self.ready_timeout_s = ready_timeout_s
        self._lock = asyncio.Lock()

    def server_name(self, flavor: InferFlavor) -> str:
        """The supervisor's name for ``flavor``'s server on this node: ``<flavor>.<node>``."""
        return f"{flavor.id}.{self.node}"

    async def _server(self, spec: InferenceSpec, shared: SharedServer) -> Backend:
        name = self.server_name(spec.flavor)
        async with self._lock:  # one server per node, however many roles ask at once
            running = self.supervisor.backend(name)
            if running is not None:
                return running
            port = spec.serve.port or shared.default_port
            if self.auto_ports:
                port = free_port(self.host)
            launch = shared.server_launch(host=self.host, port=port)
            return await self.supervisor.start(name, launch, ready_timeout_s=self.ready_timeout_s)

    async def load(
        self, spec: InferenceSpec, shared: SharedServer, model: str
    ) -> tuple[Endpoint, int]:
        """Start the node's server of ``spec``'s flavor if it is not running, then load
        ``model`` into it; return the role's endpoint and the size (bytes) the server
        reports holding for the model (0 when it cannot say now).

        Raises:
            AdapterError: the server refused or failed the load (``OllamaError``).
            SupervisorError: its server could not be started (``PortInUseError``,
                ``BackendStartError`` with the output tail).
        """
        server = await self._server(spec, shared)
        timeout = self.ready_timeout_s or ready_timeout_for(spec.memory.weights_bytes)
        async with backend_client(base_url=server.base_url) as client:
            await shared.load(client, model, timeout_s=timeout)
            resident = await self._resident_or_none(client, shared)
        return Endpoint(server.base_url, model, None), listed_size(resident, model)

    async def unload(
        self, spec: InferenceSpec, shared: SharedServer, model: str, *, measure: bool
    ) -> int:
        """Unload ``model`` and return once the server no longer lists it (its memory is
        free then); a no-op when the server does not run. Returns the size (bytes) the
        server listed for the model just before, when ``measure``; otherwise 0.

        Raises:
            AdapterError: the server refused or failed the unload (``OllamaError``).
            TimeoutError: the server still lists the model ``SHARED_FREE_S`` after it.
        """
        server = self.supervisor.backend(self.server_name(spec.flavor))
        if server is None:
            return 0  # no server: nothing is loaded
        size = 0
        async with backend_client(base_url=server.base_url) as client:
            if measure:  # its figure, before the memory is given back
                size = listed_size(await self._resident_or_none(client, shared), model)
            await shared.unload(client, model, timeout_s=SHARED_UNLOAD_S)
            # ollama frees memory asynchronously: free means "no longer listed".
            async with asyncio.timeout(SHARED_FREE_S):
                # polling another process's state: there is no event to wait on
                while listed_name(await shared.resident(client, timeout_s=SHARED_QUERY_S), model):  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
        return size

    async def sizes(
        self, flavor: InferFlavor, shared: SharedServer, models: Iterable[str]
    ) -> dict[str, int]:
        """Model -> the size (bytes) ``flavor``'s server on this node reports for it now
        (0 for a model it does not list); empty when the server does not run or cannot
        say now."""
        server = self.supervisor.backend(self.server_name(flavor))
        if server is None:
            return {}
        async with backend_client(base_url=server.base_url) as client:
            resident = await self._resident_or_none(client, shared)
        if resident is None:
            return {}
        return {model: listed_size(resident, model) for model in models}

    @staticmethod
    async def _resident_or_none(
        client: httpx.AsyncClient, shared: SharedServer
    ) -> dict[str, int] | None:
        """The server's models and their sizes, or ``None`` when it cannot say now (a figure
        is evidence only: its absence never fails a load or a stop)."""
        try:
            return await shared.resident(client, timeout_s=SHARED_QUERY_S)
        except AdapterError:
            return None
