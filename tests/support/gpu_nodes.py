"""Fleets of nodes with declared GPUs for the placement tests of issue 29 (the planner only
counts: no GPU is needed), the node plan and device step as ``rosterd plan`` and ``up``
make them, and a hypothesis strategy of random such fleets and roles. No tests here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hypothesis import strategies as st

from rosterd.fleet import Fleet, Node, Platform
from rosterd.fleet.model import DeviceSpec, ModelSource
from rosterd.placement import plan
from rosterd.placement.device_need import DeviceNeed
from rosterd.placement.devices import DevicePlan, place_on_devices
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.tokens import GB
from support.specs import spec

FLAVORS = frozenset({InferFlavor.LLAMACPP, InferFlavor.OLLAMA})


def gpus_node(name: str, gpus: int = 1, gpu_gb: int = 24, memory_gb: int = 128) -> Node:
    """A Linux node running llama.cpp and ollama with ``memory_gb`` of RAM (8 GiB reserved)
    and ``gpus`` GPUs of ``gpu_gb`` each (``CUDA0``, ``CUDA1``, ...; none for 0)."""
    return Node(
        name=name,
        memory_bytes=memory_gb * GB,
        reserved_bytes=8 * GB,
        platform=Platform.LINUX_X86_64,
        flavors=FLAVORS,
        devices=tuple(DeviceSpec(f"CUDA{i}", gpu_gb * GB) for i in range(gpus)),
    )


def fleet_of(*nodes: Node, **replicas: int) -> Fleet:
    """A fleet of ``nodes`` whose ``models:`` give each role of ``replicas`` that many
    copies (``chat=2``)."""
    return Fleet(
        nodes=nodes,
        models={role: ModelSource(Path("/m.gguf"), replicas=n) for role, n in replicas.items()},
    )


def planned(
    specs: list[InferenceSpec],
    fleet: Fleet,
    needs: Mapping[str, DeviceNeed] | None = None,
    previous: DevicePlan | None = None,
) -> DevicePlan:
    """The node plan (0.2 s of the solver), then each role's device, as ``rosterd plan`` and
    ``up`` make them; ``needs``: role -> what it needs on a device (default: its resident
    bytes, all offloaded)."""
    node_plan = plan(
        specs, fleet, previous.plan if previous else None, time_limit_s=0.2, device_needs=needs
    )
    return place_on_devices(specs, fleet, node_plan, needs or {}, previous)


@st.composite
def fleets_and_roles(
    draw: st.DrawFn,
    *,
    max_nodes: int,
    max_gpu_gb: int,
    max_memory_gb: int,
    max_roles: int,
    max_role_gb: int,
) -> tuple[Fleet, list[InferenceSpec]]:
    """1 to ``max_nodes`` Linux nodes (16 to ``max_memory_gb`` GiB of RAM, 2 reserved), each
    with 0 to 2 GPUs of 4 to ``max_gpu_gb`` GiB (0 to 2 reserved), and 1 to ``max_roles``
    llama.cpp or ollama roles of 1 to ``max_role_gb`` GiB, interactive or not, sticky or
    not, each excluding up to two others."""
    nodes = []
    for i in range(draw(st.integers(1, max_nodes))):
        devices = tuple(
            DeviceSpec(
                f"CUDA{j}", draw(st.integers(4, max_gpu_gb)) * GB, draw(st.integers(0, 2)) * GB
            )
            for j in range(draw(st.integers(0, 2)))
        )
        nodes.append(
            Node(
                name=f"n{i}",
                memory_bytes=draw(st.integers(16, max_memory_gb)) * GB,
                reserved_bytes=2 * GB,
                platform=Platform.LINUX_X86_64,
                flavors=FLAVORS,
                devices=devices,
            )
        )
    count = draw(st.integers(1, max_roles))
    roles = []
    for k in range(count):
        others = [f"r{m}" for m in range(count) if m != k]
        roles.append(
            spec(
                f"r{k}",
                draw(st.integers(1, max_role_gb)),
                interactive=draw(st.booleans()),
                sticky=draw(st.booleans()),
                excludes=draw(st.lists(st.sampled_from(others), max_size=2)) if others else (),
                flavor=draw(st.sampled_from([InferFlavor.LLAMACPP, InferFlavor.OLLAMA])),
            )
        )
    return Fleet(nodes=tuple(nodes)), roles
