"""The residency policy: table-driven cases for every rule, then properties over
random request sequences (never over capacity, never two excluded roles resident)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.residency import (
    AlreadyResident,
    Decision,
    Load,
    NodeState,
    Refuse,
    Wait,
    decide,
    fit_to_capacity,
)
from rosterd.spec import InferenceSpec
from rosterd.tokens import GB
from support.specs import spec


def state(
    capacity_gb: float,
    specs: Iterable[InferenceSpec],
    resident: Iterable[str] = (),
    *,
    busy: Iterable[str] = (),
    recency: Iterable[str] | None = None,
    recent: Iterable[str] = (),
) -> NodeState:
    resident_t = tuple(resident)
    return NodeState(
        capacity_bytes=int(capacity_gb * GB),
        specs={s.role: s for s in specs},
        resident=frozenset(resident_t),
        in_flight=dict.fromkeys(busy, 1),
        recency=tuple(recency) if recency is not None else resident_t,
        recently_loaded=frozenset(recent),
    )


def apply(st_: NodeState, decision: Decision) -> NodeState:
    """What the scheduler does with a decision: evict, then load (now most recent)."""
    if not isinstance(decision, Load):
        return st_
    resident = (st_.resident - set(decision.evict)) | {decision.role}
    recency = tuple(r for r in st_.recency if r in resident and r != decision.role)
    return dataclasses.replace(st_, resident=frozenset(resident), recency=(*recency, decision.role))


# ---------------------------------------------------------------------------
# Table: (description, state, role, expected type, expected evict/blocking, reason words)

A = spec("a", 4)
B = spec("b", 4)
C = spec("c", 4)
VOICE = spec("voice", 4, interactive=True)
LOOSE = spec("loose", 4, sticky=False)
HUGE = spec("huge", 20)

CASES: list[tuple[str, NodeState, str, type, tuple[str, ...], tuple[str, ...]]] = [
    ("resident already", state(10, [A], ["a"]), "a", AlreadyResident, (), ()),
    ("not placed here", state(10, [A]), "zzz", Refuse, (), ("not placed",)),
    ("fits in free memory", state(10, [A, B], ["a"]), "b", Load, (), ("free",)),
    (
        "bigger than capacity is refused with numbers",
        state(10, [HUGE]),
        "huge",
        Refuse,
        (),
        ("20.00 GiB", "10.00 GiB", str(20 * GB), "never"),
    ),
    (
        "LRU evicted first",
        state(10, [A, B, C], ["a", "b"], recency=["b", "a"]),
        "c",
        Load,
        ("b",),
        (),
    ),
    (
        "non-sticky before sticky, even if more recently used",
        state(10, [A, LOOSE, C], ["a", "loose"], recency=["a", "loose"]),
        "c",
        Load,
        ("loose",),
        (),
    ),
    (
        "busy role never evicted: next idle one instead",
        state(10, [A, B, C], ["a", "b"], busy=["a"], recency=["a", "b"]),
        "c",
        Load,
        ("b",),
        (),
    ),
    (
        "only busy roles could make room: wait naming them",
        state(10, [A, B, C], ["a", "b"], busy=["a", "b"]),
        "c",
        Wait,
        ("a", "b"),
        ("in flight",),
    ),
    (
        "interactive never evicted for a batch role: refuse with numbers",
        state(10, [VOICE, spec("big", 8)], ["voice"]),
        "big",
        Refuse,
        (),
        ("voice", "8.00 GiB", "6.00 GiB", "never evicted"),
    ),
    (
        "interactive role may evict a batch role",
        state(10, [VOICE, A, B], ["a", "b"]),
        "voice",
        Load,
        ("a",),
        (),
    ),
    (
        "interactive R evicts batch before interactive",
        state(10, [spec("v2", 4, interactive=True), A, VOICE], ["v2", "a"], recency=["v2", "a"]),
        "voice",
        Load,
        ("a",),
        (),
    ),
    (
        "batch load does not evict a recently loaded role: wait",
        state(10, [A, B, C], ["a", "b"], recent=["a", "b"]),
        "c",
        Wait,
        ("a", "b"),
        ("recently",),
    ),
    (
        "interactive load may evict a recently loaded role",
        state(10, [A, B, VOICE], ["a", "b"], recent=["a", "b"]),
        "voice",
        Load,
        ("a",),
        (),
    ),
    (
        "unnecessary eviction dropped: the bigger one alone makes room",
        state(
            10,
            [spec("s", 1, sticky=False), spec("m", 6), spec("n", 6)],
            ["s", "m"],
            recency=["s", "m"],
        ),
        "n",
        Load,
        ("m",),
        (),
    ),
    (
        "exclusion: the role declaring it evicts the idle other",
        state(10, [spec("x", 1, excludes=["y"]), spec("y", 1)], ["y"]),
        "x",
        Load,
        ("y",),
        ("excluded",),
    ),
    (
        "exclusion is symmetric: the other side cannot join (x takes precedence)",
        state(10, [spec("x", 1, excludes=["y"]), spec("y", 1)], ["x"]),
        "y",
        Refuse,
        (),
        ("x", "exclude each other", "precedence", "smaller role id"),
    ),
    (
        "exclusion with a busy lower-precedence role: wait",
        state(10, [spec("x", 1, excludes=["y"]), spec("y", 1)], ["y"], busy=["y"]),
        "x",
        Wait,
        ("y",),
        ("in flight",),
    ),
    (
        "exclusion with a recently loaded lower-precedence role: a batch role waits",
        state(10, [spec("x", 1, excludes=["y"]), spec("y", 1)], ["y"], recent=["y"]),
        "x",
        Wait,
        ("y",),
        ("recently",),
    ),
    (
        "exclusion with a recently loaded role: an interactive role evicts it",
        state(
            10, [spec("x", 1, interactive=True, excludes=["y"]), spec("y", 1)], ["y"], recent=["y"]
        ),
        "x",
        Load,
        ("y",),
        (),
    ),
    (
        "batch excluded by a resident interactive role is refused",
        state(10, [spec("v", 1, interactive=True, excludes=["b"]), spec("b", 1)], ["v"]),
        "b",
        Refuse,
        (),
        ("interactive",),
    ),
    (
        "interactive evicts an excluded batch role",
        state(10, [spec("v", 1, interactive=True), spec("b", 1, excludes=["v"])], ["b"]),
        "v",
        Load,
        ("b",),
        (),
    ),
    (
        "sticky beats non-sticky in an exclusion pair",
        state(10, [spec("a1", 1, sticky=False, excludes=["z9"]), spec("z9", 1)], ["a1"]),
        "z9",
        Load,
        ("a1",),
        (),
    ),
    (
        "excluded role's memory counts as freed",
        state(2, [spec("x", 1.5, excludes=["y"]), spec("y", 1.5)], ["y"]),
        "x",
        Load,
        ("y",),
        (),
    ),
    (
        "role: prefix in excludes",
        state(10, [spec("x", 1, excludes=["role:y"]), spec("y", 1)], ["y"]),
        "x",
        Load,
        ("y",),
        (),
    ),
]


@pytest.mark.parametrize(
    ("st_", "role", "kind", "names", "words"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_decide_table(
    st_: NodeState, role: str, kind: type, names: tuple[str, ...], words: tuple[str, ...]
) -> None:
    decision = decide(st_, role)
    assert isinstance(decision, kind), decision
    if isinstance(decision, Load):
        assert decision.evict == names
    if isinstance(decision, Wait):
        assert decision.blocking == names
    reason = getattr(decision, "reason", "")
    for word in words:
        assert word in reason, (word, reason)


def test_resident_role_without_spec_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="ghost"):
        decide(NodeState(10 * GB, {"a": A}, frozenset({"ghost"}), {}, ()), "a")


@pytest.mark.parametrize(
    "pair",
    [
        (spec("x", 1, excludes=["y"]), spec("y", 1)),  # both batch, sticky: id order
        (spec("x", 1, sticky=False, excludes=["y"]), spec("y", 1)),  # sticky y wins
        (spec("x", 1, excludes=["y"]), spec("y", 1, interactive=True)),  # interactive y wins
        (spec("x", 1, sticky=False), spec("y", 1, sticky=False, excludes=["x"])),
    ],
    ids=["id-order", "sticky-wins", "interactive-wins", "declared-on-y"],
)
@pytest.mark.parametrize("others", [False, True], ids=["alone", "with-others"])
def test_order_of_requests_does_not_change_the_final_resident_set(
    pair: tuple[InferenceSpec, InferenceSpec], others: bool
) -> None:
    """The order-dependence trap: X excludes Y; requests X then Y and Y then X (each
    served and finished before the next) end with the same resident set."""
    extra = [spec("z", 1)] if others else []
    start = state(3, [*pair, *extra], ["z"] if others else [])
    finals = []
    for order in (("x", "y"), ("y", "x")):
        current = start
        for role in order:
            current = apply(current, decide(current, role))
            assert not {"x", "y"} <= current.resident
        finals.append(current.resident)
    assert finals[0] == finals[1]


# ---------------------------------------------------------------------------
# Properties over random nodes and request sequences.


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[NodeState, list[tuple[str, str]]]:
    n = draw(st.integers(2, 6))
    names = [f"r{i}" for i in range(n)]
    specs = []
    for name in names:
        others = [o for o in names if o != name]
        specs.append(
            spec(
                name,
                draw(st.integers(1, 8)),
                interactive=draw(st.booleans()),
                sticky=draw(st.booleans()),
                excludes=draw(st.lists(st.sampled_from(others), max_size=2, unique=True)),
            )
        )
    capacity = draw(st.integers(1, 16))
    ops = draw(
        st.lists(
            st.tuples(st.sampled_from(["req", "done", "settle"]), st.sampled_from(names)),
            max_size=25,
        )
    )
    return state(capacity, specs), ops


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_no_decision_sequence_exceeds_capacity_or_colocates_exclusions(
    scenario: tuple[NodeState, list[tuple[str, str]]],
) -> None:
    current, ops = scenario
    for op, role in ops:
        if op == "req":
            decision = decide(current, role)
            if isinstance(decision, Load):
                busy = [r for r in decision.evict if current.in_flight.get(r, 0)]
                assert not busy, "evicted a role with requests in flight"
                if not current.specs[role].interactive:
                    assert not any(current.specs[r].interactive for r in decision.evict)
                    assert not set(decision.evict) & current.recently_loaded
            current = apply(current, decision)
            if isinstance(decision, Load | AlreadyResident):
                flights = dict(current.in_flight)
                flights[role] = flights.get(role, 0) + 1
                current = dataclasses.replace(
                    current, in_flight=flights, recently_loaded=current.recently_loaded | {role}
                )
        elif op == "done":
            flights = {k: v for k, v in current.in_flight.items() if k != role}
            current = dataclasses.replace(current, in_flight=flights)
        else:  # time passes: nothing is recent any more
            current = dataclasses.replace(current, recently_loaded=frozenset())
        used = sum(current.specs[r].memory.resident_bytes for r in current.resident)
        assert used <= current.capacity_bytes
        for a in current.resident:
            for b in current.resident:
                assert b not in current.specs[a].excluded_roles()


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.data())
def test_decisions_are_deterministic_and_refusals_explain(
    scenario: tuple[NodeState, list[tuple[str, str]]], data: st.DataObject
) -> None:
    current, _ = scenario
    role = data.draw(st.sampled_from(sorted(current.specs)))
    first = decide(current, role)
    assert decide(current, role) == first
    if isinstance(first, Refuse | Wait):
        assert role in first.reason


# --------------------------------------------------------------------------- fit to capacity


def test_fit_to_capacity_evicts_idle_roles_first_in_eviction_order() -> None:
    voice = spec("voice", 2, interactive=True)
    loose = spec("loose", 2, sticky=False)
    old = spec("old", 2)
    new = spec("new", 2)
    fit = fit_to_capacity(
        state(4, [voice, loose, old, new], ["voice", "loose", "old", "new"], recency=["old", "new"])
    )
    assert fit.evict == ("loose", "old")  # non-sticky batch, then least recently used
    assert fit.blocking == ()
    assert "over the capacity" in fit.reason


def test_fit_to_capacity_names_busy_roles_only_when_idle_ones_are_not_enough() -> None:
    a, b, c = spec("a", 2), spec("b", 2), spec("c", 2)
    fit = fit_to_capacity(state(2, [a, b, c], ["a", "b", "c"], busy=["a", "b"]))
    assert fit.evict == ("c",)
    assert fit.blocking == ("a",)
    assert fit_to_capacity(state(6, [a, b, c], ["a", "b", "c"])).evict == ()


def test_fit_to_capacity_drops_evictions_a_bigger_one_made_unneeded() -> None:
    small, big = spec("small", 1, sticky=False), spec("big", 4)
    fit = fit_to_capacity(state(1.5, [small, big], ["small", "big"]))
    assert fit.evict == ("big",)
