"""What ``rosterd up`` reads before the fleet decides (layer 8): the files, every role's
memory figures and weights on this machine, and how each fleet node can be run now.

All of it is I/O (files, the Hugging Face cache, the resolver, the Ray cluster's node
list), done before a change is posted to the fleet scheduler, which decides on the
values only (``rosterd.fleet_scheduler``): :func:`read_files`, then :func:`gather`
(a :class:`~rosterd.fleet_scheduler.values.ServedConfig`) and :func:`connections`.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from rosterd.adapters import adapter_for
from rosterd.backends.node_host import ServingFacts, weights_resolver
from rosterd.devices.pools import with_default_gpu_shares
from rosterd.errors import RosterdError
from rosterd.fleet import Fleet
from rosterd.fleet.addresses import is_this_machine
from rosterd.fleet.local import local_fleet
from rosterd.fleet.reader import load_fleet
from rosterd.fleet_scheduler.values import Connection, NodeRun, ServedConfig
from rosterd.memory.gathering import gather_memory
from rosterd.placement import Plan
from rosterd.placement.conflicts import without_port_conflicts
from rosterd.ray_cluster import RayCluster
from rosterd.roster import ImportedRoster
from rosterd.roster.importer import load_roster
from rosterd.spec import InferFlavor
from rosterd.up.options import UpOptions
from rosterd.weights import WeightsSource, separate_aliases


def read_files(options: UpOptions) -> tuple[ImportedRoster, Fleet]:
    """Import the roster (with its overlay) and read the fleet of ``options``; an alias the
    fleet gives other weights than its target is served as a role of its own
    (``rosterd.weights.separate_aliases``); a Mac that declares no GPU share gets the default
    one where the roster has llama.cpp or mlx_lm roles (``with_default_gpu_shares``).

    Raises:
        RosterError, FleetError: a file is rejected (file, line and column named).
    """
    roster = load_roster(options.roster_path, options.overlay_path)
    fleet = load_fleet(options.fleet_path) if options.fleet_path is not None else local_fleet()
    # A Mac that declares no GPU share gets Metal's default one for the roster's roles that
    # run on its GPU (llama.cpp, mlx_lm).
    fleet = with_default_gpu_shares(fleet, {s.spec.flavor for s in roster.specs})
    return separate_aliases(roster, fleet), fleet


def serving_facts(config: ServedConfig) -> ServingFacts:
    """What a node's backends need of ``config`` to start its roles."""
    return ServingFacts(config.fleet, config.repos(), config.model_names())


def gather(roster: ImportedRoster, fleet: Fleet, state_dir: Path | None) -> ServedConfig:
    """``roster`` on ``fleet`` as the fleet scheduler takes it: every role's memory figures
    (``gather_memory``: ``ram_gb``, the estimate from its weights, the peaks measured
    in ``state_dir``), what it launches with on this machine, why this machine
    cannot use its weights, for each role that has any, and the dialects its backend
    answers (``Adapter.dialects_for`` its weights, or its fleet ``models:`` entry when
    they are not here) (blocking: call it in a thread while serving)."""
    memory = gather_memory(roster, fleet, state_dir)
    config = ServedConfig(roster, fleet, memory)
    resolve = weights_resolver(serving_facts(config))
    fingerprints = memory.fingerprints()
    launch: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    dialects: dict[str, frozenset[str]] = {}
    for role, imported in config.first_by_role().items():
        words = "its flavor keeps its own weights"
        adapter = adapter_for(imported.spec.flavor)
        source: WeightsSource | None = None
        if adapter.shared_server is None:
            try:
                source = resolve(imported.spec)
                words = repr(source)
            except RosterdError as exc:
                unavailable[role] = str(exc)
                words = "no weights"
                source = fleet.entry_of(role, imported.spec.model)
        launch[role] = f"{words} {fingerprints.get(role, '')}"
        dialects[role] = adapter.dialects_for(source)
    return ServedConfig(roster, fleet, memory, launch, unavailable, dialects)


def connections(fleet: Fleet, cluster: RayCluster | None) -> dict[str, Connection]:
    """How each node of ``fleet`` can be run now: by a node agent when a live Ray node of
    ``cluster`` has its address, by this machine's supervisor when its address is this
    machine (and no Ray node is there), else not at all, with why (blocking: it lists
    the cluster's nodes and resolves names).

    Raises:
        ClusterError: the cluster's nodes cannot be listed.
    """
    if cluster is None:
        return {
            n.name: Connection(n.name, n.address, NodeRun.LOCAL, "this machine")
            if is_this_machine(n.address)
            else Connection(n.name, n.address, NodeRun.ABSENT, "not this machine")
            for n in fleet.nodes
        }
    matched, addresses = cluster.connections(fleet)
    out: dict[str, Connection] = {}
    for c in matched:
        ips = addresses.get(c.node, ())
        if c.connected:
            out[c.node] = Connection(c.node, c.address, NodeRun.AGENT, c.reason, c.ray_node_id, ips)
        elif is_this_machine(c.address):
            reason = "this machine, no Ray node"
            out[c.node] = Connection(c.node, c.address, NodeRun.LOCAL, reason, None, ips)
        else:
            out[c.node] = Connection(c.node, c.address, NodeRun.ABSENT, c.reason, None, ips)
    return out


def shared_flavors() -> tuple[InferFlavor, ...]:
    """The flavors whose roles share one server per node (and its port)."""
    return tuple(f for f in InferFlavor if adapter_for(f).shared_server is not None)


def check_ports(
    result: Plan,
    roster: ImportedRoster,
    fleet: Fleet,
    *,
    router_port: int | None,
    router_nodes: Collection[str] | None = None,
) -> Plan:
    """``result`` with every role whose roster port collides (with an earlier role on its
    node, or with ``router_port`` on a node of this machine: ``router_nodes``, default
    those :func:`~rosterd.fleet.addresses.is_this_machine` says) unplaced, with a reason
    naming both (``rosterd.placement.conflicts``)."""
    if router_nodes is None:
        router_nodes = [n.name for n in fleet.nodes if is_this_machine(n.address)]
    return without_port_conflicts(
        result,
        [s.spec for s in roster.specs],
        router_port=router_port,
        router_nodes=router_nodes,
        shared_flavors=shared_flavors(),
    )
