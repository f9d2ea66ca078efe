"""The backends boundary (between DESIGN.md layers 5 and 6): how a node's scheduler reaches
the backends of its roles.

- :mod:`rosterd.backends.interface`: the Protocols (the scheduler's syscall table) and
  the values that cross them (pure; the node machine imports only this).
- :mod:`rosterd.backends.local`: :class:`~rosterd.backends.local.SupervisorBackends`,
  the implementation over this machine's supervisor and the flavor adapters.
- :mod:`rosterd.backends.shared`: :class:`~rosterd.backends.shared.SharedServers`, the
  shared-server path (ollama: one server per node, models loaded by its API).

This package imports nothing itself, so that importing the interface does not import
the supervisor's implementation.
"""
