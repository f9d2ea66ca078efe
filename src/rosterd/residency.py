"""The residency policy: per node, which role to load, which to evict, or why to wait
(layer 3: pure; no I/O, clock, logging or environment; ties broken by sorting).

:func:`decide` answers one question: "make role R resident on this node". It never
plans beyond that one step; the scheduler applies the decision (evictions first,
then the load) and asks again when something changes.

Rules, in the order they are checked:

1. R must be one of the node's roles (``state.specs``); if R is resident already the
   answer is :class:`AlreadyResident`.
2. R alone bigger than the capacity → :class:`Refuse` with the numbers.
3. **Exclusions** (symmetric: it does not matter which of the two roles declared
   it). Each resident role E that excludes R or that R excludes is settled by a
   fixed *precedence* between the two roles, not by the order the requests came
   in: interactive before batch, then sticky before non-sticky, then the smaller
   role id. If R takes precedence, E is evicted (or R waits while E has requests
   in flight, or, for a batch R, while E is in ``recently_loaded``). If E takes
   precedence, R is refused while E is resident: E stays until it is unloaded (by
   the operator or the scheduler, or evicted to make room for some other role),
   and then R may load.

   Why precedence rather than "the latest request wins": with X excluding Y,
   last-wins leaves {Y} after requests X, Y and {X} after Y, X, so the resident
   set would depend on request timing and two clients alternating would swap
   the pair forever. With precedence both orders end with the same resident set,
   the one the operator can predict from the overlay: if X takes precedence,
   X then Y ends {X} (Y refused, naming X), Y then X ends {X} (Y evicted). To
   choose which of a pair wins, set ``latency_class`` or ``sticky`` in the overlay.
   An interactive role that excludes a batch role always wins, as rule 4 needs
   (interactive roles are never evicted for batch roles). A refusal is the policy's
   answer for this state only: a scheduler may unload an idle winner to serve a
   waiting request (``rosterd.scheduler`` does so for batch winners), and then asks
   again.
4. **Memory**: the resident bytes after the load never exceed the capacity. If
   memory is short, idle resident roles are evicted in this order: (for an
   interactive R) batch roles before interactive ones, then non-sticky before
   sticky, then least recently used first (``recency``), then role id. Never
   evicted: roles with requests in flight, interactive roles when R is batch, and
   (when R is batch) roles in ``recently_loaded``, which stops two batch roles
   swapping each other out in a loop; an interactive R may evict them. Evictions
   that turn out unnecessary (a later, bigger one made room alone) are dropped.
5. If idle candidates are not enough but waiting for busy or recently loaded roles
   would be → :class:`Wait` naming them. If even evicting every role R may ever
   evict is not enough → :class:`Refuse` with bytes and GiB.

:func:`decide_by_pool` asks the same question of every pool the role uses (host RAM and
its device's memory, issue 29): each pool that lacks room chooses its own evictions.

:func:`fit_to_capacity` answers the other question, asked when a re-plan shrinks a
node's budget or grows a resident role: which resident roles must go for the rest to
fit, idle ones first, in rule 4's eviction order.

Memory per role is ``InferenceSpec.memory.resident_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rosterd.spec import InferenceSpec
from rosterd.tokens import GB


@dataclass(frozen=True)
class NodeState:
    """What :func:`decide` knows about one node.

    ``capacity_bytes``: the node's budget (memory - reserved). ``specs``: the roles
    placed on this node by id; every resident role must be among them.
    ``resident``: roles loaded or loading (both hold memory). ``in_flight``: requests
    being served per role (missing = 0). ``recency``: resident roles, least recently
    used first (a resident role missing from it counts as least recent).
    ``recently_loaded``: resident roles too new to evict for a batch role.
    """

    capacity_bytes: int
    specs: Mapping[str, InferenceSpec]
    resident: frozenset[str]
    in_flight: Mapping[str, int]
    recency: tuple[str, ...]
    recently_loaded: frozenset[str] = frozenset()


@dataclass(frozen=True)
class AlreadyResident:
    """``role`` is resident (or loading) already; nothing to do."""

    role: str


@dataclass(frozen=True)
class Load:
    """Evict ``evict`` (in this order, each one gone before the next step), then load
    ``role``. ``reason`` says why these evictions."""

    role: str
    evict: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Wait:
    """``role`` cannot load until ``blocking`` roles (busy, or too recently loaded)
    become evictable; ask again when one of them changes."""

    role: str
    blocking: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Refuse:
    """``role`` cannot be made resident on this node in its present state (or ever, if
    the reason says so); ``reason`` names the rule and the numbers."""

    role: str
    reason: str


Decision = AlreadyResident | Load | Wait | Refuse


def gib(n_bytes: int) -> str:
    """``n_bytes`` as ``"1.5 GiB (1610612736 bytes)"`` for reasons people read."""
    return f"{n_bytes / GB:.2f} GiB ({n_bytes} bytes)"


def precedence_key(spec: InferenceSpec) -> tuple[int, int, str]:
    """Sort key of exclusion precedence: smaller wins. Interactive before batch, sticky
    before non-sticky, then role id."""
    return (0 if spec.interactive else 1, 0 if spec.sticky else 1, spec.role)


def excludes_each_other(a: InferenceSpec, b: InferenceSpec) -> bool:
    """Whether ``a`` and ``b`` must never be resident together (either one's
    ``excludes`` names the other)."""
    return b.role in a.excluded_roles() or a.role in b.excluded_roles()


def _why_precedence(winner: InferenceSpec, loser: InferenceSpec) -> str:
    if winner.interactive != loser.interactive:
        return f"{winner.role} is interactive and {loser.role} is batch"
    if winner.sticky != loser.sticky:
        return f"{winner.role} is sticky and {loser.role} is not"
    return (
        f"both are {winner.latency_class.value} and "
        f"{'sticky' if winner.sticky else 'non-sticky'}, so the smaller role id wins"
    )


def _why_blocking(blocking: Sequence[str], busy: Callable[[str], bool]) -> str:
    """Why each of ``blocking`` cannot be evicted yet: requests in flight, else a batch
    role asks and it was loaded too recently (``; ``-separated)."""
    busy_names = [r for r in blocking if busy(r)]
    recent_names = [r for r in blocking if not busy(r)]
    parts = []
    if busy_names:
        has = "has" if len(busy_names) == 1 else "have"
        parts.append(f"{', '.join(busy_names)} {has} requests in flight")
    if recent_names:
        parts.append(f"{', '.join(recent_names)} loaded too recently to evict for a batch role")
    return "; ".join(parts)


def _eviction_key(state: NodeState) -> Callable[[str], tuple[int, int, int, str]]:
    """Sort key of eviction order, first evicted first: batch before interactive, then
    non-sticky before sticky, then least recently used (``recency``), then role id."""
    recency_pos = {name: i for i, name in enumerate(state.recency)}

    def key(name: str) -> tuple[int, int, int, str]:
        s = state.specs[name]
        return (1 if s.interactive else 0, 1 if s.sticky else 0, recency_pos.get(name, -1), name)

    return key


def _drop_unneeded(
    state: NodeState, chosen: list[str], free: int, freed: int, need: int
) -> tuple[list[str], int]:
    """``chosen`` without the evictions a later, bigger one made unnecessary (the
    cheaper-to-lose kept first), and the bytes the rest frees."""
    kept = list(chosen)
    for candidate in reversed(chosen):
        size = state.specs[candidate].memory.resident_bytes
        if free + freed - size >= need:
            kept.remove(candidate)
            freed -= size
    return kept, freed


@dataclass(frozen=True)
class Fit:
    """What must go for the resident roles to fit the node's capacity again.

    ``evict``: idle roles to evict now, in this order; ``blocking``: busy roles that
    must go too once their requests finished (the scheduler drains them, and cuts
    them after its drain time); ``reason``: the numbers. Both empty: it fits.
    """

    evict: tuple[str, ...]
    blocking: tuple[str, ...]
    reason: str


def fit_to_capacity(state: NodeState) -> Fit:
    """The evictions that bring the resident bytes within ``state.capacity_bytes`` (the
    node's budget shrank, or a resident role's memory grew, on a re-plan).

    Idle roles go before busy ones (``in_flight``), each group in eviction order
    (rule 4's order: batch before interactive, non-sticky before sticky, least
    recently used, role id); every resident role may go, interactive ones too,
    since the budget is a hard limit. Evictions a later, bigger one made
    unnecessary are dropped. Pure and deterministic.
    """
    used = sum(state.specs[r].memory.resident_bytes for r in state.resident)
    capacity = state.capacity_bytes
    if used <= capacity:
        return Fit((), (), f"{gib(used)} resident fits the capacity of {gib(capacity)}")
    order = sorted(state.resident, key=_eviction_key(state))
    idle = [r for r in order if state.in_flight.get(r, 0) <= 0]
    busy = [r for r in order if state.in_flight.get(r, 0) > 0]
    chosen: list[str] = []
    freed = 0
    for candidate in (*idle, *busy):
        if used - freed <= capacity:
            break
        chosen.append(candidate)
        freed += state.specs[candidate].memory.resident_bytes
    chosen, freed = _drop_unneeded(state, chosen, capacity - used, freed, 0)
    reason = (
        f"{gib(used)} resident is over the capacity of {gib(capacity)}; "
        f"evicting {', '.join(chosen)} frees {gib(freed)}"
    )
    return Fit(tuple(r for r in chosen if r in idle), tuple(r for r in chosen if r in busy), reason)


def decide(state: NodeState, role: str) -> Decision:
    """Decide how to make ``role`` resident on the node described by ``state``.

    Returns one of :class:`AlreadyResident`, :class:`Load` (with the evictions, in
    order), :class:`Wait` (naming the blocking roles) or :class:`Refuse` (with the
    rule and the numbers). See the module docstring for the rules. Deterministic:
    the same state always gives the same decision.

    Raises:
        ValueError: a resident role is not in ``state.specs`` (the caller's
            bookkeeping is broken; its memory cannot be counted).
    """
    unknown = sorted(state.resident - state.specs.keys())
    if unknown:
        raise ValueError(f"resident roles without a spec: {', '.join(unknown)}")
    spec = state.specs.get(role)
    if spec is None:
        return Refuse(role, f"{role} is not placed on this node")
    if role in state.resident:
        return AlreadyResident(role)
    need = spec.memory.resident_bytes
    capacity = state.capacity_bytes
    if need > capacity:
        return Refuse(
            role,
            f"{role} needs {gib(need)} but the node's capacity is {gib(capacity)}; "
            "it can never be resident here",
        )

    def busy(name: str) -> bool:
        return state.in_flight.get(name, 0) > 0

    # 3. Exclusions, settled by precedence (never by request order).
    conflict_evict: list[str] = []
    conflict_wait: list[str] = []
    for other in sorted(state.resident):
        other_spec = state.specs[other]
        if not excludes_each_other(spec, other_spec):
            continue
        if precedence_key(other_spec) < precedence_key(spec):
            return Refuse(
                role,
                f"{role} and {other} exclude each other and {other} is resident; "
                f"{other} takes precedence ({_why_precedence(other_spec, spec)}), so "
                f"{role} can load only after {other} is unloaded",
            )
        if busy(other) or (not spec.interactive and other in state.recently_loaded):
            conflict_wait.append(other)
        else:
            conflict_evict.append(other)
    if conflict_wait:
        names = ", ".join(conflict_wait)
        return Wait(
            role,
            tuple(conflict_wait),
            f"{role} and {names} exclude each other; {_why_blocking(conflict_wait, busy)}; "
            f"{role} loads once {'it is' if len(conflict_wait) == 1 else 'they are'} evictable",
        )

    # 4. Memory.
    remaining = sorted(state.resident - set(conflict_evict))
    used = sum(state.specs[r].memory.resident_bytes for r in remaining)
    free = capacity - used
    exclusion_note = (
        f"evicting {', '.join(conflict_evict)} (excluded by {role})" if conflict_evict else ""
    )
    if need <= free:
        reason = f"{role} needs {gib(need)}; {gib(free)} free"
        if exclusion_note:
            reason += f" after {exclusion_note}"
        return Load(role, tuple(conflict_evict), reason)

    allowed = [
        r
        for r in sorted(remaining, key=_eviction_key(state))
        if spec.interactive or not state.specs[r].interactive
    ]
    idle = [
        r for r in allowed if not busy(r) and (spec.interactive or r not in state.recently_loaded)
    ]
    chosen: list[str] = []
    freed = 0
    for candidate in idle:
        if free + freed >= need:
            break
        chosen.append(candidate)
        freed += state.specs[candidate].memory.resident_bytes
    if free + freed >= need:
        chosen, freed = _drop_unneeded(state, chosen, free, freed, need)
        reason = (
            f"{role} needs {gib(need)}; {gib(free)} free, "
            f"so evicting {', '.join(chosen)} frees {gib(freed)}"
        )
        if exclusion_note:
            reason += f" ({exclusion_note})"
        return Load(role, (*conflict_evict, *chosen), reason)

    allowed_bytes = sum(state.specs[r].memory.resident_bytes for r in allowed)
    if free + allowed_bytes >= need:
        blocking = tuple(r for r in allowed if r not in idle)
        return Wait(
            role,
            blocking,
            f"{role} needs {gib(need)}; {gib(free)} free and idle roles free only "
            f"{gib(freed)}; {_why_blocking(blocking, busy)}",
        )
    protected = [r for r in remaining if r not in allowed]
    protected_bytes = sum(state.specs[r].memory.resident_bytes for r in protected)
    return Refuse(
        role,
        f"{role} needs {gib(need)} but at most {gib(free + allowed_bytes)} can be freed "
        f"(capacity {gib(capacity)}; interactive roles {', '.join(protected) or 'none'} "
        f"hold {gib(protected_bytes)} and are never evicted for a batch role)",
    )


def decide_by_pool(host: NodeState, devices: Mapping[str, NodeState], role: str) -> Decision:
    """:func:`decide` held to every pool ``role`` uses: host RAM and, where the role runs on
    a device, that device's memory (issue 29: a GPU's memory is a budget of its own).

    ``host`` is the node as :func:`decide` knows it (every role, its whole counted
    memory); ``devices``: device id -> the same question for that device, whose ``specs``
    are the roles placed on it with ``memory`` set to what each holds there and whose
    ``resident`` are those of them resident. The host decides first (its exclusions and
    its evictions); then the role's device, with the roles the host evicts gone, picks its
    own evictions: each pool that lacks room chooses what leaves it, by rule 4's order.
    A refusal or a wait in either pool is the answer, its reason naming the pool; a load
    evicts what both pools chose (the host's first). A node without devices, or a role on
    none, gets :func:`decide`'s answer unchanged. Pure and deterministic.

    Raises:
        ValueError: as :func:`decide`, for either pool.
    """
    on_host = decide(host, role)
    device = next((d for d in sorted(devices) if role in devices[d].specs), None)
    if device is None or not isinstance(on_host, Load):
        return on_host
    pool = devices[device]
    gone = set(on_host.evict)
    remaining = frozenset(pool.resident - gone)
    on_device = decide(
        NodeState(
            capacity_bytes=pool.capacity_bytes,
            specs=pool.specs,
            resident=remaining,
            in_flight=pool.in_flight,
            recency=tuple(r for r in pool.recency if r in remaining),
            recently_loaded=pool.recently_loaded & remaining,
        ),
        role,
    )
    if isinstance(on_device, Refuse):
        return Refuse(role, f"on device {device}: {on_device.reason}")
    if isinstance(on_device, Wait):
        return Wait(role, on_device.blocking, f"on device {device}: {on_device.reason}")
    if isinstance(on_device, AlreadyResident):  # resident on the host is resident
        return on_host
    extra = tuple(r for r in on_device.evict if r not in gone)
    return Load(
        role,
        (*on_host.evict, *extra),
        f"host RAM: {on_host.reason}; device {device}: {on_device.reason}",
    )
