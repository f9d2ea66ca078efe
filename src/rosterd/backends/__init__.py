"""The backends boundary (between DESIGN.md layers 5 and 6): how a node's scheduler reaches
the backends of its roles.

- :mod:`rosterd.backends.values`: the plain values that cross the boundary
  (``Endpoint``, ``ProbeResult``, ``BackendEvent``; layer 1, since the supervisor gives
  them; the node machine imports only these);
- :mod:`rosterd.backends.interface`: the Protocols, the scheduler's syscall table (pure);
- :mod:`rosterd.backends.local`: :class:`~rosterd.backends.local.SupervisorBackends`,
  the implementation over this machine's supervisor and the flavor adapters;
- :mod:`rosterd.backends.shared`: :class:`~rosterd.backends.shared.SharedServers`, the
  shared-server path (ollama: one server per node, models loaded by its API);
- :mod:`rosterd.backends.kv_keep`: :class:`~rosterd.backends.kv_keep.KvKeeper`, a
  role's KV cache saved when its backend stops and restored when it starts again;
- :mod:`rosterd.backends.kv_record`: a kept KV slot's record, in memory and on disk;
- :mod:`rosterd.backends.copy_names`: the names of a role's copies on one supervisor
  (``<role>@<node>``, for a role with ``replicas`` on several nodes of one ``rosterd up``;
  layer 1), and what each node's backends were started with;
- :mod:`rosterd.backends.node_host`: :class:`~rosterd.backends.node_host.NodeHost`, the
  one way to run a machine's nodes (the state folder's lock, one supervisor, leftovers
  reaped, one weights rule).

This package imports nothing itself, so that importing the interface does not import
the supervisor's implementation.
"""
