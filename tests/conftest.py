"""Shared test fixtures: free ports, a supervisor in a temporary state folder, the fake
backend, the tiny random GGUF and the llama-server binary (skipped with a reason if absent)."""

from __future__ import annotations

import platform
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rosterd.adapters.base import Launch
from rosterd.supervisor import Supervisor
from support.backends import fake_launch, pick_free_port
from support.gguf import write_tiny_gguf
from support.ray_nodes import HAVE_RAY, HEAD_IP, WORKER_IP

# The openai and anthropic SDKs name the platform in every request's headers, and the
# first ``platform.platform()`` forks ``uname -p``. Forked from this process once many
# tests' threads run, that child once hung before exec (the whole test waited out
# pytest's timeout in ``Popen``); asked here, at collection, with one thread, the answer
# is cached for the session.
platform.platform()


@pytest.fixture
def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    return pick_free_port()


@pytest.fixture
def make_fake_launch() -> Callable[..., Launch]:
    """``fake_launch`` as a fixture: ``make_fake_launch(port, mode, load_s=..., ...)``."""
    return fake_launch


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    """A supervisor with short grace and backoff; every backend is stopped afterwards."""
    sup = Supervisor(tmp_path / "state", grace_s=2.0, initial_backoff_s=0.1, max_backoff_s=1.0)
    try:
        yield sup
    finally:
        await sup.stop_all()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama-architecture GGUF (2 blocks, n_embd 64, byte vocab)."""
    pytest.importorskip("gguf", reason="the gguf package (dev extra) writes the tiny model")
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The llama-server binary, or a skip saying how to build it."""
    from rosterd.adapters.llamacpp import find_llama_server
    from rosterd.errors import AdapterError

    try:
        return find_llama_server()
    except AdapterError as err:
        pytest.skip(f"llama-server is missing: {err}")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--screenshot-dir`` for the page's browser test; ``--long-reliability``: the
    reliability suite's long soak, chaos and fuzzing runs."""
    parser.addoption(
        "--screenshot-dir",
        default=None,
        help="also keep the browser test's screenshot of the page here (page.png)",
    )
    parser.addoption(
        "--long-reliability",
        action="store_true",
        default=False,
        help="run the reliability suite's long versions (docs/reliability.md)",
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    """A Ray test cluster (``ray.cluster_utils``): a head at 127.0.0.2 and a second Ray node at
    127.0.0.3, one CPU each; shut down by its own handle at the end, never ``ray stop``.

    Session-wide: starting a cluster takes seconds on two cores. A test that adds
    a node removes it; one that joins leaves the cluster (``disconnect``) or
    leaves it to this fixture.
    """
    if not HAVE_RAY:
        from rosterd.ray_cluster import RAY_MISSING

        pytest.skip(f"{RAY_MISSING} (the Ray tests need it)")
    from ray.cluster_utils import Cluster

    from rosterd.ray_cluster import disconnect

    ray_cluster: Any = Cluster(  # Ray's test cluster is untyped
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": HEAD_IP},
    )
    try:
        ray_cluster.add_node(num_cpus=1, node_ip_address=WORKER_IP)
        ray_cluster.wait_for_nodes()
        yield ray_cluster
    finally:
        disconnect()
        ray_cluster.shutdown()


@pytest.fixture
def long_reliability(request: pytest.FixtureRequest) -> bool:
    """Whether ``--long-reliability`` was given (or ``ROSTERD_LONG_RELIABILITY=1``)."""
    import os

    flag = bool(request.config.getoption("--long-reliability"))
    return flag or os.environ.get("ROSTERD_LONG_RELIABILITY") == "1"
