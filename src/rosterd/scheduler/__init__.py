"""The scheduler (DESIGN.md layer 6): per node, a pure state machine and the loop applying it.

- :mod:`~rosterd.scheduler.values`: phases, limits, leases, the logged events.
- its errors (``SchedulerError`` and subclasses: why a request could not get
  its role) are in :mod:`rosterd.errors`.
- :mod:`~rosterd.scheduler.events`: the machine's events in and effects out.
- :mod:`~rosterd.scheduler.machine`: ``NodeMachine``, the dispatch and the step,
  composed of the node's shared state and its rule families (pure):
- :mod:`~rosterd.scheduler.state`: ``MachineState``, the state the families share.
- :mod:`~rosterd.scheduler.grants`: ``GrantRules``, who gets a lease.
- :mod:`~rosterd.scheduler.transition`: ``Transitions``, the node's one transition
  (stops, then a load).
- :mod:`~rosterd.scheduler.loads`: ``LoadRules``, what to load or evict, who waits.
- :mod:`~rosterd.scheduler.health`: ``HealthRules``, the probe and backoff policy
  (probes, crash restarts, load backoff, cancelled loads, a lost node).
- :mod:`~rosterd.scheduler.replan`: ``ReplanRules``, a re-plan (``Reconfigure``) and
  a measured peak (``MeasuredPeak``).
- :mod:`~rosterd.scheduler.kv_saves`: ``KvSaveRules``, an idle role's KV cache saved
  before anything evicts it.
- :mod:`~rosterd.scheduler.shutdown`: ``ShutdownRules``, the last change.
- :mod:`~rosterd.scheduler.loop`: ``NodeLoop``, the asyncio loop of one node that
  applies the machine's effects.
- :mod:`~rosterd.scheduler.node`: ``NodeScheduler``, the node's public API over its loop.
- :mod:`~rosterd.scheduler.lease`: ``Lease``, a granted lease, with its revocation future.
- :mod:`~rosterd.scheduler.views`: what a node shows (``RoleSnapshot``, ``NodeSnapshot``,
  ``DirectoryNode``), read-only values.
- :mod:`~rosterd.scheduler.directory`: ``NodeDirectory``, the nodes of one process by role.

Effects reach backends through :mod:`rosterd.backends.interface` (``RoleBackends``).
``docs/scheduler.md`` draws the state table.

This package imports nothing itself: importing one of the pure modules (the machine
and its rules) must not import the loop, asyncio or the backends' implementation.
Import each name from the module that defines it.
"""
