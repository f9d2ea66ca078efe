"""Property tests: whatever the input, the import gives a result or a RosterError.

Bytes of any kind, YAML-shaped noise and generated rosters all end in an
``ImportedRoster`` or a ``RosterError`` with a location, never in another
exception; every generated entry is either imported or skipped with one of the
reference's reasons, in roster order; string fields come back as written.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rosterd.errors import RosterError
from rosterd.roster import ImportedRoster
from rosterd.roster.importer import flavor_for_backend, import_roster
from rosterd.roster.overlay import RosterOverlay
from rosterd.rust_debug import rust_debug_str
from rosterd.tokens import GB, valid_token

NO_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

REASONS = re.compile(
    r"id is not a plain token"
    r"|backend \".*\" has no inference adapter"
    r"|alias of [A-Za-z0-9][A-Za-z0-9._-]* \(same server, port and weights\)"
    r"|ram_gb is missing or not a number"
    r"|not a valid inference spec: .+",
    re.DOTALL,
)


def import_or_error(data: bytes | str) -> ImportedRoster | RosterError:
    error: RosterError | None = None
    try:
        return import_roster(data, file="gen.yaml")
    except RosterError as err:
        error = err
    assert error.file == "gen.yaml"
    assert error.message
    return error


@SETTINGS
@given(st.binary(max_size=400))
def test_any_bytes_give_a_result_or_a_roster_error(data: bytes) -> None:
    import_or_error(data)


YAML_BITS = st.sampled_from(
    [
        "roster:",
        "\n",
        "  ",
        "- ",
        "id: ",
        "port: ",
        "ram_gb: ",
        "backend: ",
        "name: ",
        "repo: ",
        "status: ",
        "role: ",
        "<<: ",
        "&a ",
        "*a",
        "!x ",
        "!!int ",
        "!!str ",
        "!!null ",
        "!!float ",
        "'",
        '"',
        "[",
        "]",
        "{",
        "}",
        ", ",
        ": ",
        "? ",
        "#",
        "~",
        "0x1F",
        "0o17",
        "8080",
        "-1",
        "1e3",
        ".inf",
        "true",
        "yes",
        "mlx_lm",
        "ollama",
        "llama.cpp",
        "\t",
        "---\n",
        "...\n",
        "%YAML 1.1\n",
        "|\n",
        ">\n",
        "é",
        "\u0301",
        "\ufeff",
        "\r\n",
        "99999999999999999999",
    ]
)


@SETTINGS
@given(st.lists(YAML_BITS, max_size=60))
def test_yaml_shaped_noise_gives_a_result_or_a_roster_error(bits: list[str]) -> None:
    import_or_error("".join(bits))


@SETTINGS
@given(st.lists(YAML_BITS, max_size=40))
def test_overlay_noise_gives_an_overlay_or_a_roster_error(bits: list[str]) -> None:
    error: RosterError | None = None
    try:
        RosterOverlay.from_yaml("".join(bits), file="ov.yaml")
    except RosterError as err:
        error = err
    assert error is None or error.file == "ov.yaml"


SCALARS = st.one_of(
    st.sampled_from(
        [
            "8",
            "0",
            "~",
            "null",
            "''",
            "'~12'",
            "0x10",
            "true",
            "[1]",
            "{a: 1}",
            "-1",
            "4096",
            "4097",
            "1e-12",
            "'8 GB'",
            "8080",
            "+80",
            "0o17",
            ".5",
            "!custom 3",
            "mlx_lm",
            "MLX-LM",
            "ollama x",
            "llama-server",
            "mlx-vlm",
            "org/x",
            "voice",
            "realtime",
            "a b",
            "-lead",
            "x.y_z",
        ]
    ),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_categories=NO_SURROGATES), max_size=12
    ).map(lambda s: json.dumps(s)),
)
FIELDS = ("id", "role", "name", "repo", "ram_gb", "backend", "port", "status", "notes")


@st.composite
def rosters(draw: st.DrawFn) -> tuple[str, int]:
    count = draw(st.integers(min_value=0, max_value=8))
    lines = ["roster:"]
    for _ in range(count):
        fields = draw(st.lists(st.sampled_from(FIELDS[1:]), unique=True, max_size=8))
        lines.append(f"  - id: {draw(SCALARS)}")
        lines.extend(f"    {name}: {draw(SCALARS)}" for name in fields)
    return "\n".join(lines) + "\n", count


@SETTINGS
@given(rosters())
def test_generated_rosters_import_or_skip_every_entry(generated: tuple[str, int]) -> None:
    text, count = generated
    result = import_or_error(text)
    if isinstance(result, RosterError):
        assert result.line is not None
        assert result.path is None or result.path.startswith("roster")
        return
    assert len(result.specs) + len(result.skipped) == count
    for role, reason in result.skipped:
        assert REASONS.fullmatch(reason), (role, reason)
    seen_keys = set()
    for imported in result.specs:
        spec = imported.spec
        assert valid_token(spec.role, 64)
        assert spec.serve.port != 0
        assert 0 < spec.memory.weights_bytes <= 4096 * GB
        assert spec.model is None or valid_token(spec.model, 128)
        key = (spec.flavor, spec.serve.port, imported.repo)
        assert key not in seen_keys
        seen_keys.add(key)
    for alias, first in result.aliases.items():
        assert result.get(first) is not None
        assert (alias, f"alias of {first} (same server, port and weights)") in result.skipped


TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=NO_SURROGATES, max_codepoint=0xFFFF),
    max_size=30,
)


@SETTINGS
@given(TEXT, TEXT)
def test_double_quoted_text_reads_back_exactly(name: str, backend: str) -> None:
    text = (
        "roster:\n  - id: m\n"
        f"    name: {json.dumps(name)}\n    backend: {json.dumps(backend)}\n"
        "    repo: org/m\n    ram_gb: 1\n"
    )
    result = import_roster(text)
    if flavor_for_backend(backend) is None:
        assert result.skipped == (
            ("m", f"backend {rust_debug_str(backend)} has no inference adapter"),
        )
    else:
        assert result.specs[0].name == name


@SETTINGS
@given(st.floats(min_value=0.0, max_value=4096.0, allow_nan=False))
def test_ram_gb_floats_become_truncated_bytes(gb: float) -> None:
    text = f"roster:\n  - id: m\n    backend: ollama\n    ram_gb: {gb!r}\n"
    result = import_roster(text)
    expected = int(gb * GB)
    if expected == 0:
        assert result.skipped[0][1].endswith("memory.weights_bytes is zero")
    else:
        assert result.specs[0].spec.memory.weights_bytes == expected


@SETTINGS
@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_ports_are_strict_u16(port: int) -> None:
    text = f"roster:\n  - id: m\n    backend: ollama\n    ram_gb: 1\n    port: {port}\n"
    outcome = import_or_error(text)
    if 1 <= port <= 65535:
        assert isinstance(outcome, ImportedRoster)
        assert outcome.specs[0].spec.serve.port == port
    elif port == 0:
        assert isinstance(outcome, ImportedRoster)
        assert outcome.skipped[0][1].endswith("port 0 is not a usable port")
    else:
        assert isinstance(outcome, RosterError)
        assert outcome.path == "roster[0].port"
