"""Prometheus metrics of a running ``rosterd up`` (used by the scheduler and the router).

prometheus_client is the reference Python client: it gives the text exposition
format, histograms with cumulative buckets and label handling, so we do not
write our own. Every :class:`RosterdMetrics` owns its own ``CollectorRegistry``
(not the process-global one), so several routers in one process (tests, the
benchmark) never share or clash on counters.

Metric names (all prefixed ``rosterd_``):

- ``requests_total{role, endpoint, code}``: finished OpenAI requests by HTTP status;
- ``request_duration_seconds{role, endpoint}``: time from request to last byte, seconds;
- ``queue_wait_seconds{role}``: time a request waited for its role (load or slot), seconds;
- ``loads_total{node, role, cause}``, ``load_failures_total{node, role}``;
- ``load_duration_seconds{node, role}``: from process start to ready, seconds;
- ``evictions_total{node, role, cause}``: backends stopped; ``cause`` is one of
  ``make_room`` (evicted for another role's memory), ``exclusion`` (for a role it
  excludes), ``drain`` (either of those, cutting requests still in flight after
  ``--drain``), ``idle_ttl``, ``unload`` (``rosterd unload``) or ``shutdown``;
- ``resident_bytes{node}``: spec bytes of the roles holding memory (loading, ready or
  stopping) on the node; ``capacity_bytes{node}``;
- ``in_flight{role}``, ``queued{role}``: requests being served / waiting now;
- ``node_connected{node}``: 1 while the node is run (this machine, or a live Ray
  node), 0 when it is not connected or lost;
- ``role_phase{node, role, phase}``: 1 for the role's phase now, 0 for the others
  (``ROLE_PHASES``);
- ``measured_rss_bytes{node, role}``: its backend's RSS, measured on its node;
- ``kv_kept_bytes{node, role}``, ``kv_kept_tokens{node, role}``: its KV cache kept on
  disk across stops; ``kv_files_total{node, role, action}`` (``save``, ``restore``,
  ``refusal``) and ``kv_file_bytes_total{node, role, action}``: what was saved,
  restored or refused.

The last three (and ``capacity_bytes``/``resident_bytes`` of nodes no scheduler
runs) are set from the fleet's view at each scrape (:meth:`RosterdMetrics.observe_nodes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from rosterd.backends.values import KeptKv
    from rosterd.fleet_scheduler.views import FleetNodeView
    from rosterd.scheduler.views import DirectoryNode

#: Buckets for request and load durations, seconds: from a proxied token to a long generation.
DURATION_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

#: Every phase ``rosterd_role_phase`` reports: the scheduler's, and ``unavailable``
#: (cannot be served), ``moved`` (re-planned onto another node at start),
#: ``not_connected`` (its node is not connected and it fits nowhere else).
ROLE_PHASES = (
    "stopped",
    "loading",
    "ready",
    "restarting",
    "unhealthy",
    "stopping",
    "lost",
    "unavailable",
    "moved",
    "not_connected",
)

#: The ``Content-Type`` of :meth:`RosterdMetrics.render`.
CONTENT_TYPE = CONTENT_TYPE_LATEST


class RosterdMetrics:
    """The counters, histograms and gauges of one router and its schedulers.

    Attributes are prometheus_client metric families (see the module docstring
    for names and labels); :meth:`render` gives the exposition text.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "rosterd_requests",
            "OpenAI requests finished, by role, endpoint and HTTP status code.",
            ["role", "endpoint", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "rosterd_request_duration_seconds",
            "Time from receiving a request to its last byte, seconds.",
            ["role", "endpoint"],
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "rosterd_queue_wait_seconds",
            "Time a request waited for its role to load or for a free slot, seconds.",
            ["role"],
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.loads = Counter(
            "rosterd_loads",
            "Backends made resident, by node, role and cause.",
            ["node", "role", "cause"],
            registry=r,
        )
        self.load_failures = Counter(
            "rosterd_load_failures",
            "Backends that failed to start or become ready.",
            ["node", "role"],
            registry=r,
        )
        self.load_duration = Histogram(
            "rosterd_load_duration_seconds",
            "Time from starting a backend to it being ready, seconds.",
            ["node", "role"],
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.evictions = Counter(
            "rosterd_evictions",
            "Backends stopped, by node, role and cause "
            "(make_room, exclusion, drain, idle_ttl, unload, shutdown).",
            ["node", "role", "cause"],
            registry=r,
        )
        self.resident_bytes = Gauge(
            "rosterd_resident_bytes",
            "Spec bytes of the roles holding memory on the node (loading, ready or stopping).",
            ["node"],
            registry=r,
        )
        self.capacity_bytes = Gauge(
            "rosterd_capacity_bytes",
            "The node's memory budget (memory minus reserved), bytes.",
            ["node"],
            registry=r,
        )
        self.pool_capacity_bytes = Gauge(
            "rosterd_pool_capacity_bytes",
            "Each memory pool's budget on the node, bytes: device `host` (RAM, as "
            "rosterd_capacity_bytes) and one per GPU or Mac GPU share (issue 29).",
            ["node", "device"],
            registry=r,
        )
        self.pool_resident_bytes = Gauge(
            "rosterd_pool_resident_bytes",
            "Bytes the resident roles count in each memory pool of the node: device `host` "
            "(as rosterd_resident_bytes) and one per GPU or Mac GPU share.",
            ["node", "device"],
            registry=r,
        )
        self.in_flight = Gauge(
            "rosterd_in_flight",
            "Requests being served by the role's copy on the node now.",
            ["node", "role"],
            registry=r,
        )
        self.queued = Gauge(
            "rosterd_queued",
            "Requests waiting for the role's copy on the node (its load or a free slot) now.",
            ["node", "role"],
            registry=r,
        )
        self.copy_requests = Counter(
            "rosterd_copy_requests",
            "Requests sent to the role's copy on the node (a role with replicas has several; "
            "a further copy on another device of a node is node=NODE/ROLE~N).",
            ["node", "role"],
            registry=r,
        )

        self.node_connected = Gauge(
            "rosterd_node_connected",
            "1 while the node is run (this machine or a live Ray node), 0 if not connected or lost",
            ["node"],
            registry=r,
        )
        self.role_phase = Gauge(
            "rosterd_role_phase",
            "1 for the role's phase now, 0 for the other phases.",
            ["node", "role", "phase"],
            registry=r,
        )
        self.measured_rss = Gauge(
            "rosterd_measured_rss_bytes",
            "Resident memory of the role's backend and its children, measured on its node, bytes.",
            ["node", "role"],
            registry=r,
        )

        self.kv_kept_bytes = Gauge(
            "rosterd_kv_kept_bytes",
            "Bytes of the role's KV cache kept on disk across stops.",
            ["node", "role"],
            registry=r,
        )
        self.kv_kept_tokens = Gauge(
            "rosterd_kv_kept_tokens",
            "Tokens of the role's KV cache kept on disk across stops.",
            ["node", "role"],
            registry=r,
        )
        self.kv_events = Counter(
            "rosterd_kv_files",
            "KV cache files of the role saved, restored or refused (a record that did not match).",
            ["node", "role", "action"],
            registry=r,
        )
        self.kv_moved_bytes = Counter(
            "rosterd_kv_file_bytes",
            "Bytes of KV cache files of the role saved or restored.",
            ["node", "role", "action"],
            registry=r,
        )
        self.key_requests = Counter(
            "rosterd_key_requests_total",
            "Finished proxied requests by key name, role and HTTP status",
            ["key", "role", "code"],
            registry=r,
        )
        self.key_tokens = Counter(
            "rosterd_key_tokens_total",
            "Tokens the backends reported, by key name, role and kind (prompt, completion)",
            ["key", "role", "kind"],
            registry=r,
        )
        self._kv_seen: dict[tuple[str, str, str], int] = {}

    def _kv_count(self, counter: Counter, node: str, role: str, action: str, now: object) -> None:
        """Advance ``counter`` to ``now``, a running total the backends report."""
        if not isinstance(now, int):
            return
        key = (str(id(counter)), node, role + "\0" + action)
        before = self._kv_seen.get(key, 0)
        if now > before:
            counter.labels(node=node, role=role, action=action).inc(now - before)
        self._kv_seen[key] = now

    def _observe_kv(self, node: str, role: str, kv: KeptKv) -> None:
        self.kv_kept_bytes.labels(node=node, role=role).set(kv.file_bytes)
        self.kv_kept_tokens.labels(node=node, role=role).set(kv.tokens)
        for action, count, moved in (
            ("save", kv.saves, kv.saved_bytes),
            ("restore", kv.restores, kv.restored_bytes),
            ("refusal", kv.refusals, None),
        ):
            self._kv_count(self.kv_events, node, role, action, count)
            if moved is not None:
                self._kv_count(self.kv_moved_bytes, node, role, action, moved)

    def _observe_phase(self, node: str, role: str, phase: str) -> None:
        for known in ROLE_PHASES:
            self.role_phase.labels(node=node, role=role, phase=known).set(
                1 if known == phase else 0
            )

    def observe_nodes(
        self,
        nodes: Mapping[str, DirectoryNode],
        measured: Mapping[str, Mapping[str, int]],
        fleet: Mapping[str, FleetNodeView],
    ) -> None:
        """Set the per-node and per-role gauges from the directory's snapshot (``nodes``:
        name -> :class:`~rosterd.scheduler.views.DirectoryNode`), each role's measured
        peak RSS (``measured``: node -> role -> bytes) and, on Ray, the fleet's nodes
        (``fleet``: whether each is connected; a node no scheduler of this process runs
        shows its budget and its planned roles' phases). A role no longer measured loses
        its RSS sample. Every role counts, whatever key scrapes."""
        for name, view in fleet.items():
            self.node_connected.labels(node=name).set(1 if view.connected else 0)
            if name in nodes or view.planned is None:
                continue
            if view.capacity_bytes is not None:
                self.capacity_bytes.labels(node=name).set(view.capacity_bytes)
            self.resident_bytes.labels(node=name).set(0)
            for role, planned in view.planned.items():
                self._observe_phase(name, role, planned.phase)
        for name, entry in nodes.items():
            node = entry.node
            self.capacity_bytes.labels(node=name).set(node.capacity_bytes)
            self.resident_bytes.labels(node=name).set(node.resident_bytes)
            if name not in fleet:
                self.node_connected.labels(node=name).set(1)
            for role, shown in node.roles.items():
                self._observe_phase(name, role, shown.phase)
                if shown.kv is not None:
                    self._observe_kv(name, role, shown.kv)
                rss = measured.get(name, {}).get(role)
                if rss is not None:
                    self.measured_rss.labels(node=name, role=role).set(rss)
                else:
                    with contextlib.suppress(KeyError):  # never measured
                        self.measured_rss.remove(name, role)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (``Content-Type``: ``CONTENT_TYPE``)."""
        return generate_latest(self.registry)
