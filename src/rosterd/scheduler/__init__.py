"""The scheduler (DESIGN.md layer 6): per node, a pure state machine and the loop applying it.

- :mod:`~rosterd.scheduler.values`: phases, limits, leases, the logged events.
- its errors (``SchedulerError`` and subclasses: why a request could not get
  its role) are in :mod:`rosterd.errors`.
- :mod:`~rosterd.scheduler.events`: the machine's events in and effects out.
- :mod:`~rosterd.scheduler.machine`: ``NodeMachine``, the rules (pure).
- :mod:`~rosterd.scheduler.grants`: the machine's rules for who gets a lease (pure).
- :mod:`~rosterd.scheduler.health`: the machine's rules for probes, crash
  restarts, load backoff and cancelled loads (pure).
- :mod:`~rosterd.scheduler.replan`: the machine's rules for a re-plan (pure).
- :mod:`~rosterd.scheduler.loop`: ``NodeLoop``, the asyncio loop of one node that
  applies the machine's effects.
- :mod:`~rosterd.scheduler.node`: ``NodeScheduler``, the node's public API over its loop.
- :mod:`~rosterd.scheduler.directory`: ``NodeDirectory``, the nodes of one process by role.

Effects reach backends through :mod:`rosterd.backends.interface` (``RoleBackends``).
``docs/scheduler.md`` draws the state table.

This package imports nothing itself: importing one of the pure modules (the machine
and its rules) must not import the loop, asyncio or the backends' implementation.
Import each name from the module that defines it.
"""
