"""What a role's memory counts (DESIGN.md "Memory"), one concept per module:

- :mod:`rosterd.memory.estimate`: the estimate from a model's shapes (pure, layer 3);
- :mod:`rosterd.memory.count`: which figure counts, the roster's, the estimate or the
  measured peak (pure, layer 3);
- :mod:`rosterd.memory.peaks`: the measured peaks kept in the state folder (layer 5);
- :mod:`rosterd.memory.split`: a role's estimate by pool (pure, layer 3);
- :mod:`rosterd.memory.gathering`: every role's figures gathered from the roster, the
  fleet, the weights and the peaks (layer 5);
- :mod:`rosterd.memory.by_pool`: what each role needs on a device, from the gathered
  figures (layer 5);
- :mod:`rosterd.memory.watch`: following the running backends' peaks (layer 6).

This package imports nothing itself, so that the pure modules stay pure when imported.
"""
