"""The node agent (DESIGN.md layer 6: the backends boundary of a remote node): a fleet node's
backends run by a Ray actor on that node (beside layer 5, the supervisor), and the
head's backends boundary over it.

- :mod:`~rosterd.node_agent.actor`: ``NodeAgent``, the actor's body, run on the
  node (its ``AgentConfig``, ``AgentInfo``, ``ProbedPools``: its node's devices as
  probed there, and ``CarriedError``, how a rosterd error crosses Ray whole).
- :mod:`~rosterd.node_agent.head`: ``AgentBackends``, the node scheduler's
  backends boundary over the agent's actor handle, and ``map_ray_errors``, the
  one place Ray's errors become rosterd's.

Ray is imported only when a call reaches it (the ``ray`` extra).
"""

from __future__ import annotations

from rosterd.errors import CarriedError
from rosterd.node_agent.actor import (
    EVENT_POLL_S,
    AgentConfig,
    AgentInfo,
    NodeAgent,
    ProbedPools,
)
from rosterd.node_agent.head import AgentBackends, map_ray_errors

__all__ = [
    "EVENT_POLL_S",
    "AgentBackends",
    "AgentConfig",
    "AgentInfo",
    "CarriedError",
    "NodeAgent",
    "ProbedPools",
    "map_ray_errors",
]
