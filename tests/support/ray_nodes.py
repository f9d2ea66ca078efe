"""Shared by the Ray tests: the loopback addresses of the test cluster's nodes and the skip
when Ray (the ``ray`` extra) is missing. No tests here; the ``cluster`` fixture is in
``conftest.py``.

Ray rewrites 127.0.0.1 to the machine's network IP, so no test node sits there:
the head is 127.0.0.2 and the other nodes 127.0.0.3, 127.0.0.4 (all of 127/8 is
loopback on Linux); 127.0.0.9 has no Ray node.
"""

from __future__ import annotations

import pytest

from rosterd.ray_cluster import RAY_MISSING

try:
    import ray  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

needs_ray = pytest.mark.skipif(not HAVE_RAY, reason=f"{RAY_MISSING} (the Ray tests need it)")

HEAD_IP, WORKER_IP, SPARE_IP, ABSENT_IP = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.9"
