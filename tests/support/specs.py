"""Inference specs for the policy, placement and scheduler tests: a role of a given size."""

from __future__ import annotations

from collections.abc import Iterable

from rosterd.spec import InferenceSpec, InferFlavor, LatencyClass, MemorySpec
from rosterd.tokens import GB


def spec(
    role: str,
    size: float,
    *,
    unit: int = GB,
    interactive: bool = False,
    sticky: bool = True,
    excludes: Iterable[str] = (),
    flavor: InferFlavor = InferFlavor.LLAMACPP,
    model: str | None = None,
) -> InferenceSpec:
    """A spec whose weights are ``size`` ``unit``s (GiB unless told), batch unless
    ``interactive``, sticky unless told otherwise."""
    return InferenceSpec(
        role=role,
        flavor=flavor,
        model=model,
        memory=MemorySpec(weights_bytes=int(size * unit)),
        sticky=sticky,
        latency_class=LatencyClass.INTERACTIVE if interactive else LatencyClass.BATCH,
        excludes=tuple(excludes),
    )


#: The example's ``chat-small`` on gemma-3-270m (its roster's 0.5 GiB), as the tests that
#: start a real llama-server on the example's gemma GGUF serve it.
GEMMA_CHAT_SMALL = InferenceSpec(
    role="chat-small",
    flavor=InferFlavor.LLAMACPP,
    model="gemma-3-270m",
    memory=MemorySpec(weights_bytes=GB // 2),
)
