"""The options of one ``rosterd up`` (layer 8): :class:`UpOptions`, the command's options
parsed into one value, which :mod:`rosterd.up.runtime` runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rosterd.router.progress import ProgressCheck
from rosterd.router.routing import LoadProgressMode, RouterConfig
from rosterd.scheduler.values import SchedulerLimits
from rosterd.up.defaults import DEFAULT_HOST, DEFAULT_PORT


@dataclass(frozen=True)
class UpOptions:
    """What one ``rosterd up`` serves and how (the command's options, parsed).

    ``api_keys``: the keys requests must carry (empty: none, checked non-blank by
    the caller); ``state_dir``: backend logs, pid records and the lock (``None``:
    :func:`~rosterd.supervisor.default_state_dir`); ``grace_s``: SIGTERM to SIGKILL, seconds;
    ``max_body_bytes``: the largest request body; ``auto_backend_ports``: let the
    OS choose backend ports; ``warm_up``: load interactive and sticky roles that
    fit at start (and the roles a reload adds); ``watch``: reload when the roster,
    overlay or fleet file changes; ``cors_origins``: browser origins allowed to call
    the API; ``ray_address``: the Ray cluster to run the fleet's nodes on
    (``HOST:PORT``, what ``rosterd.ray_cluster.ray_address`` gives from
    ``--ray-address`` or ``RAY_ADDRESS``; ``None``: no Ray, this machine's nodes
    only); ``ray_join_timeout_s``: how long joining it may take, seconds. With an
    explicit ``state_dir``, every node agent keeps its state under
    ``<state_dir>/nodes/<node>`` on its node; without one, under that machine's
    default. ``first_byte_timeout_s`` / ``chunk_timeout_s``: a request's deadlines
    for its first byte and between chunks (then 504 and a probe); ``progress_check``:
    when a quiet request asks its backend whether it works (``rosterd.router.progress``);
    ``request_read_timeout_s``: for a client's request headers and body (then
    the connection is closed, or 408). Liveness probes are in ``limits``.
    ``kv_disk_bytes``: the disk this machine's kept KV caches may take, and each node
    agent's on its node (``--kv-disk-gb``; the least recently used go first).
    ``history_interval_s``: seconds between two points of the page's charts.
    ``load_progress``: what a streamed request waiting for a load gets (``--load-progress``).
    ``keys_path``: the keys file (``--keys``; :mod:`rosterd.keys`), read again on a reload.
    """

    roster_path: Path
    overlay_path: Path | None = None
    fleet_path: Path | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_keys: tuple[str, ...] = ()
    state_dir: Path | None = None
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    grace_s: float = 10.0
    max_body_bytes: int = 8 * 2**20
    auto_backend_ports: bool = False
    warm_up: bool = True
    cors_origins: tuple[str, ...] = ()
    watch: bool = False
    ray_address: str | None = None
    ray_join_timeout_s: float = 30.0
    first_byte_timeout_s: float = 300.0
    progress_check: ProgressCheck = field(default_factory=ProgressCheck)
    chunk_timeout_s: float = 120.0
    request_read_timeout_s: float = 30.0
    kv_disk_bytes: int = 10 * 2**30
    history_interval_s: float = 10.0
    load_progress: LoadProgressMode = LoadProgressMode.PING
    keys_path: Path | None = None

    def router_config(self) -> RouterConfig:
        """The router's limits for this run: API keys, body size, CORS origins, the
        request deadlines, the progress check and the charts' interval from these
        options; the upstream timeouts are :class:`RouterConfig`'s defaults."""
        return RouterConfig(
            api_keys=self.api_keys,
            max_body_bytes=self.max_body_bytes,
            cors_origins=self.cors_origins,
            first_byte_timeout_s=self.first_byte_timeout_s,
            progress_check=self.progress_check,
            chunk_timeout_s=self.chunk_timeout_s,
            request_read_timeout_s=self.request_read_timeout_s,
            history_interval_s=self.history_interval_s,
            load_progress=self.load_progress,
        )
