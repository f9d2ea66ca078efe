"""Properties of the choice among a role's copies (``rosterd.replica_choice``, pure): prefix
affinity with bounded loads (CHWBL), least loaded without a key, skipped copies."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.replica_choice import (
    PROMPT_PREFIX_BYTES,
    Copy,
    CopyState,
    choose_copy,
    load_bound,
    prefix_key,
)

NODES = [f"node-{i}" for i in range(6)]

copy_lists = st.lists(
    st.builds(
        Copy,
        node=st.sampled_from(NODES),
        state=st.sampled_from(list(CopyState)),
        requests=st.integers(min_value=0, max_value=40),
        slots=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
    ),
    max_size=6,
    unique_by=lambda c: c.node,
)
keys = st.one_of(st.none(), st.binary(min_size=1, max_size=32))


@given(copy_lists, keys, st.sets(st.sampled_from(NODES), max_size=3))
def test_only_a_ready_copy_not_tried_is_chosen_within_the_bound(
    copies: list[Copy], key: bytes | None, exclude: set[str]
) -> None:
    chosen = choose_copy(copies, key, exclude=exclude)
    candidates = [c for c in copies if c.state is CopyState.READY and c.node not in exclude]
    if not candidates:
        assert chosen is None
        return
    by_node = {c.node: c for c in candidates}
    assert chosen in by_node
    free = [c for c in candidates if not c.full]
    if free:  # a copy with a free slot is chosen while there is one
        assert not by_node[chosen].full
    if len(free) == len(candidates):
        assert by_node[chosen].requests + 1 <= load_bound(candidates)


@given(copy_lists)
def test_without_a_key_the_least_loaded_ready_copy_is_chosen(copies: list[Copy]) -> None:
    chosen = choose_copy(copies, None)
    ready = [c for c in copies if c.state is CopyState.READY]
    if not ready:
        assert chosen is None
        return
    pool = [c for c in ready if not c.full] or ready
    least = min(c.requests for c in pool)
    assert {c.node: c.requests for c in pool}[chosen or ""] == least


@given(copy_lists, keys, st.randoms(use_true_random=False))
def test_the_choice_does_not_depend_on_the_order_of_the_copies(
    copies: list[Copy], key: bytes | None, rnd: random.Random
) -> None:
    shuffled = list(copies)
    rnd.shuffle(shuffled)
    assert choose_copy(copies, key) == choose_copy(shuffled, key)


@given(
    st.lists(st.binary(min_size=1, max_size=16), min_size=1, max_size=60, unique=True),
    st.integers(min_value=2, max_value=6),
    st.data(),
)
def test_removing_a_copy_moves_only_the_keys_it_held(
    key_list: list[bytes], n: int, data: st.DataObject
) -> None:
    idle = [Copy(node, CopyState.READY) for node in NODES[:n]]
    gone = data.draw(st.sampled_from(NODES[:n]))
    left = [c for c in idle if c.node != gone]
    for key in key_list:
        before = choose_copy(idle, key)
        if before != gone:
            assert choose_copy(left, key) == before


@settings(max_examples=30)
@given(st.binary(min_size=1, max_size=16), st.integers(min_value=2, max_value=5))
def test_one_hot_prefix_spreads_past_the_bound(key: bytes, n: int) -> None:
    copies = {node: 0 for node in NODES[:n]}
    for _ in range(40 * n):  # requests that all stay in flight
        chosen = choose_copy([Copy(k, CopyState.READY, v) for k, v in copies.items()], key)
        assert chosen is not None
        copies[chosen] += 1
    most = 1.25 * 40 + 1  # the bound: 1.25 times the mean, rounded up
    assert max(copies.values()) <= most
    # so the hot prefix spills to as many copies as its load needs
    assert sum(1 for v in copies.values() if v) * most >= 40 * n


def test_a_prefix_sticks_to_its_copy_while_loads_are_even() -> None:
    copies = [Copy(node, CopyState.READY, 1) for node in NODES[:3]]
    key = prefix_key({"messages": [{"role": "user", "content": "hello"}]})
    first = choose_copy(copies, key)
    assert all(choose_copy(copies, key) == first for _ in range(10))
    skipped = [
        Copy(c.node, CopyState.LOADING if c.node == first else CopyState.READY, 1) for c in copies
    ]
    assert choose_copy(skipped, key) not in (first, None)
    assert choose_copy(copies, key, exclude={first or ""}) != first


def test_every_turn_of_a_conversation_has_the_key_of_its_start() -> None:
    start = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]
    turns: list[dict[str, object]] = [
        {"messages": start},
        {"messages": [*start, {"role": "assistant", "content": "Red."}]},
        {
            "messages": [
                *start,
                {"role": "assistant", "content": "Red."},
                {"role": "user", "content": "Another."},
            ],
            "max_tokens": 4,
        },
    ]
    assert len({prefix_key(t) for t in turns}) == 1
    other: dict[str, object] = {"messages": [{**start[0], "content": "You are verbose."}, start[1]]}
    assert prefix_key(other) != prefix_key(turns[0])


def test_a_prompt_is_keyed_by_its_first_bytes_and_nothing_else_has_a_key() -> None:
    long = "x" * PROMPT_PREFIX_BYTES
    assert prefix_key({"prompt": long + "a"}) == prefix_key({"prompt": [long + "b"]})
    assert prefix_key({"prompt": "a"}) != prefix_key({"prompt": "b"})
    assert prefix_key({}) is None
    assert prefix_key({"prompt": ""}) is None
    assert prefix_key({"prompt": [1, 2, 3]}) is None
    assert prefix_key({"messages": []}) is None
    assert prefix_key({"messages": ["not a message"]}) is None


def test_a_prefix_leaves_its_copy_while_its_one_slot_is_busy_and_another_is_idle() -> None:
    # Two one-slot copies (llama-server's default --parallel 1): a long request runs on the
    # conversation's copy; its next request goes to the idle copy rather than queue.
    key = prefix_key({"messages": [{"role": "user", "content": "Story 2"}]})
    own = choose_copy([Copy("a", CopyState.READY, 0, 1), Copy("b", CopyState.READY, 0, 1)], key)
    other = "b" if own == "a" else "a"
    busy = [Copy(own or "", CopyState.READY, 1, 1), Copy(other, CopyState.READY, 0, 1)]
    assert choose_copy(busy, key) == other
    # With no slot count known, the bound alone keeps it on its copy (what a copy's
    # slots prevent).
    unknown = [Copy(own or "", CopyState.READY, 1), Copy(other, CopyState.READY, 0)]
    assert choose_copy(unknown, key) == own
    # Both copies busy: no free slot anywhere, so the prefix's copy, within the bound.
    both = [Copy(own or "", CopyState.READY, 1, 1), Copy(other, CopyState.READY, 1, 1)]
    assert load_bound(both) == 2
    assert choose_copy(both, key) == own
    # ... until one more would be past the bound (ceil(1.25 * 6 / 2) = 4): then the other.
    over = [Copy(own or "", CopyState.READY, 4, 1), Copy(other, CopyState.READY, 1, 1)]
    assert choose_copy(over, key) == other
