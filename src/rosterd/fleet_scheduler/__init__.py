"""The fleet scheduler (DESIGN.md layer 6, above the node schedulers): the one owner of the
plan in force, the nodes (run here, on Ray, not connected, lost, back), the node agents
and the served configuration. ``docs/fleet.md`` draws it.

- :mod:`~rosterd.fleet_scheduler.values`: what the fleet is made of (pure values);
- :mod:`~rosterd.fleet_scheduler.events`: what happens to the fleet (events in);
- :mod:`~rosterd.fleet_scheduler.effects`: what the fleet asks for (effects out);
- :mod:`~rosterd.fleet_scheduler.state`: the machine's state and the steps its rules share;
- :mod:`~rosterd.fleet_scheduler.machine`: :class:`FleetMachine`, the pure decisions
  (reloads and the start);
- :mod:`~rosterd.fleet_scheduler.losses`: what it does when nodes are lost and come back;
- :mod:`~rosterd.fleet_scheduler.notices`: what the operator is told, in words (pure);
- :mod:`~rosterd.fleet_scheduler.served`: what a plan serves, node by node (pure);
- :mod:`~rosterd.fleet_scheduler.views`: what ``/status`` shows of the fleet (pure);
- :mod:`~rosterd.fleet_scheduler.loop`: :class:`FleetLoop`, the one task that applies
  the effects through the fleet's syscall table (``FleetEffects``).

This package imports nothing itself, so that its pure modules stay pure when imported.
"""
