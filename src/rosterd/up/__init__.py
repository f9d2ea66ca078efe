"""The runtime of ``rosterd up`` (DESIGN.md layer 8, below the command itself): import,
plan, start the node schedulers and the router, serve, reload, follow the fleet on Ray,
drain and stop. ``rosterd.cli`` parses the command line and calls
:func:`rosterd.up.runtime.run_up`.
"""
