"""Which memory figure counts: the largest of the roster's ram_gb, the estimate and the measured
peak; the "~N" unmeasured marker; the once-per-role warning past 20 %."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rosterd.memory.count import (
    FigureSource,
    count_memory,
    counted_memory_spec,
    memory_warning,
    show_declared,
)
from rosterd.memory.estimate import MemoryEstimate
from rosterd.roster.importer import is_unmeasured_ram_gb, ram_bytes
from rosterd.tokens import GB


def test_largest_figure_wins_and_says_which() -> None:
    assert count_memory(8 * GB, 10 * GB, 9 * GB).source is FigureSource.ESTIMATE
    counted = count_memory(8 * GB, 10 * GB, 11 * GB)
    assert (counted.counted_bytes, counted.source) == (11 * GB, FigureSource.MEASURED)
    roster = count_memory(12 * GB, 10 * GB, None)
    assert (roster.counted_bytes, roster.source) == (12 * GB, FigureSource.ROSTER)
    assert count_memory(None, None, None).counted_bytes == 0


def test_ties_go_to_the_more_direct_evidence() -> None:
    assert count_memory(GB, GB, GB).source is FigureSource.MEASURED
    assert count_memory(GB, GB, None).source is FigureSource.ESTIMATE


@given(
    st.one_of(st.none(), st.integers(0, 1 << 45)),
    st.one_of(st.none(), st.integers(0, 1 << 45)),
    st.one_of(st.none(), st.integers(0, 1 << 45)),
)
def test_counted_is_never_below_any_figure(
    declared: int | None, estimated: int | None, measured: int | None
) -> None:
    counted = count_memory(declared, estimated, measured)
    given_figures = [f for f in (declared, estimated, measured) if f is not None]
    assert counted.counted_bytes == max(given_figures, default=0)


def test_unmeasured_marker_follows_the_roster_text() -> None:
    assert is_unmeasured_ram_gb("~10")
    assert is_unmeasured_ram_gb("  ~10 ")
    assert not is_unmeasured_ram_gb("10")
    assert not is_unmeasured_ram_gb(10)
    assert ram_bytes("~10") == 10 * GB  # the import reads the same number
    assert show_declared(10 * GB, True) == "~10.00 GiB (unmeasured)"
    assert show_declared(10 * GB, False) == "10.00 GiB"


def test_warning_past_twenty_percent_names_both_numbers() -> None:
    near = count_memory(10 * GB, 11 * GB + GB // 2, None)  # 15 % more: quiet
    assert memory_warning("chat", near) is None
    far = count_memory(8 * GB, 12 * GB, None, declared_unmeasured=True)
    text = memory_warning("chat", far)
    assert text == (
        "role chat: counts 12.00 GiB (estimate) where the roster's ram_gb says "
        "~8.00 GiB (unmeasured), 50 % more; placement and residency use 12.00 GiB"
    )
    measured = memory_warning("voice", count_memory(GB, None, 2 * GB))
    assert measured is not None
    assert "2.00 GiB (measured)" in measured
    assert "1.00 GiB" in measured
    assert memory_warning("x", count_memory(None, 5 * GB, None)) is None


def test_counted_memory_spec_keeps_the_estimate_parts() -> None:
    estimate = MemoryEstimate(
        weights_bytes=6 * GB,
        kv_bytes=2 * GB,
        overhead_bytes=GB,
        weights_note="w",
        kv_note="k",
        overhead_note="o",
    )
    counted = count_memory(8 * GB, estimate.total_bytes, 10 * GB)
    spec = counted_memory_spec(counted, estimate)
    assert spec.resident_bytes == 10 * GB
    assert (spec.kv_bytes, spec.overhead_bytes) == (2 * GB, GB)
    plain = counted_memory_spec(count_memory(8 * GB, None, None), None)
    assert (plain.weights_bytes, plain.kv_bytes, plain.overhead_bytes) == (8 * GB, 0, 0)
