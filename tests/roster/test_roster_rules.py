"""The reference's reading rules, one test per rule, on inputs beyond the sample cases.

Expected results are derived from the rules (the seed README and serde_yaml
0.9's behaviour): string fields keep literal text, ``ram_gb`` and ``port``
follow the YAML 1.2 core schema and Rust's number grammars, whole-file errors
reject, skips carry the reference's reason text.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from rosterd.errors import RosterError
from rosterd.roster import ImportedRoster
from rosterd.roster._serde_yaml import Number
from rosterd.roster.document import MAX_ROSTER_BYTES
from rosterd.roster.entries import MAX_ENTRIES
from rosterd.roster.importer import flavor_for_backend, import_roster, load_roster, ram_bytes
from rosterd.roster.overlay import RosterOverlay
from rosterd.spec import InferFlavor, LatencyClass
from rosterd.tokens import GB

DATA = Path(__file__).resolve().parents[1] / "data" / "roster-rules"


def entry(**fields: str) -> str:
    """One roster entry as YAML lines; values are written verbatim."""
    lines = []
    for i, (key, value) in enumerate(fields.items()):
        prefix = "  - " if i == 0 else "    "
        lines.append(f"{prefix}{key}: {value}" if value != "" else f"{prefix}{key}:")
    return "\n".join(lines) + "\n"


def roster(*entries: str) -> str:
    return "roster:\n" + "".join(entries)


def base(**override: str) -> str:
    fields = {"id": "m", "backend": "mlx_lm", "repo": "org/m", "ram_gb": "8", "port": "8100"}
    fields.update(override)
    return entry(**fields)


def one(text: str | bytes, overlay: RosterOverlay | None = None) -> ImportedRoster:
    return import_roster(text, overlay, file="roster.yaml")


def rejected(text: str | bytes) -> RosterError:
    with pytest.raises(RosterError) as info:
        import_roster(text, file="roster.yaml")
    return info.value


# --- string fields: literal text ------------------------------------------------


@pytest.mark.parametrize(
    ("written", "text"),
    [
        ("0x1F", "0x1F"),
        ("yes", "yes"),
        ("1.10", "1.10"),
        ("null", "null"),
        ("~", "~"),
        ("''", ""),
        ("010", "010"),
        ("1:30", "1:30"),
        ("!!int 12", "12"),
        ("'it''s'", "it's"),
        ('"tab\\there"', "tab\there"),
        ("true", "true"),
    ],
)
def test_string_fields_take_the_literal_text(written: str, text: str) -> None:
    result = one(roster(base(status=written, name=written, role=written)))
    assert result.specs[0].status == text
    assert result.specs[0].name == text


def test_empty_value_is_empty_text_and_yaml11_does_not_apply_under_a_directive() -> None:
    text = "%YAML 1.1\n---\n" + roster(base(id="on", status="", name="010"))
    result = one(text)
    assert result.specs[0].spec.role == "on"
    assert result.specs[0].status == ""
    assert result.specs[0].spec.model == "010"


def test_block_scalar_name_keeps_its_newline_and_is_no_model() -> None:
    text = roster(base(name="|\n      Qwen3\n"))
    imported = one(text).specs[0]
    assert imported.name == "Qwen3\n"
    assert imported.spec.model is None


def test_name_over_128_bytes_is_no_model_but_128_is() -> None:
    result = one(roster(base(id="a", name="x" * 128, port="1"), base(id="b", name="y" * 129)))
    assert result.specs[0].spec.model == "x" * 128
    assert result.specs[1].spec.model is None


# --- ram_gb -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "gb"),
    [
        ("0x1F", 31),
        ("0o17", 15),
        ("0b101", 5),
        ("1e3", 1000),
        ("+10", 10),
        (".5", 0.5),
        ("010", 10),  # a string in YAML 1.2, then read by Rust's f64 grammar
        ("'12'", 12),
        ("'~~~5'", 5),
        ('"\\t8 "', 8),
        ('"\\u00a08"', 8),  # NBSP is Unicode White_Space: trimmed as Rust does
        ("!!float 12", 12),
        ("!!str 12", 12),
        ("!!int '7'", 7),
        ("'4096'", 4096),
        ("1.", 1),
        ("'1.e1'", 10),
    ],
)
def test_ram_gb_values_that_read(written: str, gb: float) -> None:
    result = one(roster(base(ram_gb=written)))
    assert result.specs[0].spec.memory.weights_bytes == int(gb * GB)


@pytest.mark.parametrize(
    "written",
    [
        "true",
        "'~ 10'",
        "1_0",
        "'10 GB'",
        "inf",
        "'-inf'",
        ".nan",
        "'NaN'",
        "-1",
        "-0x10",
        "4096.5",
        "'0x10'",
        '"\\x1c8"',  # U+001C is not Unicode White_Space: Rust does not trim it
        "'\uff11\uff10'",  # fullwidth digits
        "[8]",
        "{gb: 8}",
        "!custom 8",
        "! 8",
        "1e40",
        "1" + "0" * 45,  # beyond 128 bits: a float for serde_yaml, out of range
        "''",
        "~",
        "",
    ],
)
def test_ram_gb_values_that_skip(written: str) -> None:
    result = one(roster(base(ram_gb=written)))
    assert result.skipped == (("m", "ram_gb is missing or not a number"),)


@pytest.mark.parametrize("written", ["0", "-0.0", "1e-10", "'0'", "0x0"])
def test_ram_gb_zero_is_read_then_fails_validation(written: str) -> None:
    result = one(roster(base(ram_gb=written)))
    assert result.skipped == (("m", "not a valid inference spec: memory.weights_bytes is zero"),)


@pytest.mark.parametrize(
    "written",
    [
        "99999999999999999999",  # beyond 64 bits, within 128: serde_yaml fails the file
        "-9223372036854775809",
        "0xFFFFFFFFFFFFFFFFFF",
        "!!int abc",
        "!!float abc",
        "!!bool 3",
        "!!null 3",
        "{a: 1, a: 2}",  # a Value mapping with a duplicate key
        "[{a: 1, 'a': 2}]",
    ],
)
def test_ram_gb_values_that_fail_the_whole_file(written: str) -> None:
    err = rejected(roster(base(ram_gb=written)))
    assert err.path == "roster[0].ram_gb"
    assert err.line == 5


def test_ram_gb_nesting_limit_is_serde_yamls() -> None:
    def nested(depth: int) -> str:
        return roster(base(ram_gb="[" * depth + "]" * depth))

    assert one(nested(125)).skipped[0][1] == "ram_gb is missing or not a number"
    assert rejected(nested(126)).path == "roster[0].ram_gb"


def test_ram_bytes_truncates_like_rust() -> None:
    assert ram_bytes(Number("float", 18.5)) == 19864223744
    assert ram_bytes(Number("float", 0.000000001)) == 1
    assert ram_bytes(Number("int", 4096)) == 4096 * GB
    assert ram_bytes(Number("int", 4097)) is None
    assert ram_bytes("~3") == 3 * GB
    assert ram_bytes(True) is None
    assert ram_bytes(None) is None


# --- port ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "port"),
    [
        ("8080", 8080),
        ("+8080", 8080),
        ("0x1F90", 8080),
        ("0o17620", 8080),
        ("0b1", 1),
        ("65535", 65535),
        ("null", None),
        ("~", None),
        ("", None),
        ("!!null ~", None),
        ("!!str 8080", 8080),  # serde_yaml reads any plain scalar as an integer here
    ],
)
def test_ports_that_read(written: str, port: int | None) -> None:
    result = one(roster(base(port=written)))
    assert result.specs[0].spec.serve.port == port


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        ("'8080'", "write the port without quotes"),
        ('"8080"', "write the port without quotes"),
        ("08080", "leading zeros"),
        ("8_080", "without `_`"),
        ("8080.0", "whole number"),
        ("65536", "65535"),
        ("-1", "negative"),
        ("-0", "negative"),
        ("true", ""),
        ("[8080]", ""),
        ("{p: 1}", ""),
        ("0X1F90", ""),
        ("!!int |\n      8080", ""),
        ("!!null 8080", ""),
        ("'0x1F90'", "quotes"),
        ("99999999999999999999999", ""),
    ],
)
def test_ports_that_fail_the_whole_file(written: str, hint: str) -> None:
    err = rejected(roster(base(port=written)))
    assert err.path == "roster[0].port"
    assert err.file == "roster.yaml"
    assert err.line == 6
    assert err.column == 11
    assert "expected a port number" in err.message
    assert hint in err.message
    assert "roster.yaml:6:11: roster[0].port:" in str(err)


def test_quoted_port_error_names_everything() -> None:
    err = rejected(roster(base(port="'8080'")))
    assert str(err) == (
        "roster.yaml:6:11: roster[0].port: found the quoted text '8080'; expected a port "
        "number 1..65535 (or nothing) (write the port without quotes)"
    )


def test_port_zero_is_read_then_skipped() -> None:
    result = one(roster(base(port="0")))
    assert result.skipped == (("m", "not a valid inference spec: port 0 is not a usable port"),)


# --- whole-file errors ----------------------------------------------------------

WHOLE_FILE_ERRORS = {
    "missing id": roster(entry(backend="mlx_lm", ram_gb="8")),
    "field twice": roster(base(port="1") + "    port: 2\n"),
    "roster twice": roster(base()) + "roster: []\n",
    "wrong type for backend": roster(base(backend="{a: b}")),
    "wrong type for id": roster(base(id="[a]")),
    "roster is a mapping": "roster: {a: 1}\n",
    "roster is a string": "roster: planner\n",
    "roster is null": "roster: ~\n",
    "roster is quoted empty": "roster: ''\n",
    "top-level list": "- id: a\n",
    "top-level scalar": "hello\n",
    "document is ~": "~\n",
    "document is null": "null\n",
    "bare dash entry": "roster:\n  -\n",
    "entry is a list": "roster:\n  - [id, a]\n",
    "complex key in entry": "roster:\n  - id: a\n    ? [x]\n    : 1\n",
    "mapping as field name": "roster:\n  - id: a\n    {x: 1}: 2\n",
    "several documents": roster(base()) + "---\nroster: []\n",
    "garbage after document end": roster(base()) + "...\n]\n",
    "tab indentation": "roster:\n\t- id: a\n",
    "raw control character": roster(base(name="a\x01b")),
    "raw DEL is fine but NUL is not": roster(base(name="a\x00b")),
    "undefined alias": roster(base(repo="*nowhere")),
    "unclosed flow": "roster: [\n",
    "bad %YAML version": "%YAML 2.0\n---\nroster: []\n",
    "alias to a mapping as id": "x: &m {a: 1}\n" + roster(base(id="*m")),
}


@pytest.mark.parametrize("name", list(WHOLE_FILE_ERRORS))
def test_whole_file_errors(name: str) -> None:
    err = rejected(WHOLE_FILE_ERRORS[name])
    assert err.file == "roster.yaml"
    assert err.line is not None or name in ("roster twice",)


def test_invalid_utf8_anywhere_is_rejected_with_its_position() -> None:
    err = rejected(b"roster: []\n# caf\xe9\n")
    assert (err.line, err.column) == (2, 6)
    assert "UTF-8" in err.message


def test_size_limit_counts_bytes_not_characters() -> None:
    body = roster(base()).encode()
    filler_line = "# " + "é" * 100 + "\n"  # 202 bytes, 103 characters
    filler = filler_line.encode()
    count = (MAX_ROSTER_BYTES - len(body)) // len(filler)
    exact = body + filler * count
    exact += b"#" * (MAX_ROSTER_BYTES - len(exact) - 1) + b"\n"
    assert len(exact) == MAX_ROSTER_BYTES
    assert len(exact.decode()) < MAX_ROSTER_BYTES
    assert one(exact.decode()).specs[0].spec.role == "m"
    err = rejected(exact + b"\n")
    assert "1048576 bytes" in err.message


def test_entry_limit() -> None:
    entries = [base(id=f"e{i}", port=str(1000 + i)) for i in range(MAX_ENTRIES)]
    assert len(one(roster(*entries)).specs) == MAX_ENTRIES
    err = rejected(roster(*entries, base(id="extra", port="9")))
    assert "257 entries" in err.message


def test_entry_limit_counts_alias_entries_too() -> None:
    text = "roster:\n  - &e {id: a, backend: mlx_lm, ram_gb: 1}\n" + "  - *e\n" * MAX_ENTRIES
    assert "257 entries" in rejected(text).message


# --- accepted files -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment\n",
        "roster:\n",
        "roster: []\n",
        "other: 1\n",
        "---\n",
        "---\n...\n",
        "\ufeffroster: []\n",
    ],
)
def test_accepted_files_with_nothing_to_import(text: str) -> None:
    result = one(text)
    assert result.specs == ()
    assert result.skipped == ()
    assert len(result.warnings) == 1  # never silent: no entries, or no `roster:` key


@pytest.mark.parametrize("text", ["", "# only a comment\n", "roster:\n", "roster: []\n", "{}\n"])
def test_a_roster_without_entries_warns(text: str) -> None:
    assert one(text).warnings == ("the roster lists no entries; nothing is imported",)


def test_a_misspelt_roster_key_is_accepted_empty_with_a_warning_naming_the_keys() -> None:
    text = "version: 2\nrooster:\n" + base()
    result = one(text)
    assert (result.specs, result.skipped) == ((), ())  # the reference's result
    [warning] = result.warnings
    assert '"version", "rooster"' in warning
    assert "line 1" in warning
    assert "a roster is a mapping with a `roster:` list" in warning
    assert '"rooster" looks like a misspelt `roster`' in warning


def test_a_roster_with_entries_has_no_emptiness_warning() -> None:
    assert one("other: 1\n" + roster(base())).warnings == ()


def test_bom_crlf_and_tab_after_colon_are_accepted() -> None:
    text = "\ufeff" + roster(base(ram_gb="\t8")).replace("\n", "\r\n")
    result = one(text.encode())
    assert result.specs[0].spec.memory.weights_bytes == 8 * GB


def test_deeply_nested_unknown_fields_are_accepted() -> None:
    depth = 5000
    text = roster(base(extra="[" * depth + "]" * depth, more="{a: {b: {c: [1, {d: e}]}}}"))
    assert one(text).specs[0].spec.role == "m"


def test_unknown_fields_given_twice_are_fine() -> None:
    text = roster(base(notes="a") + "    notes: b\n")
    assert one(text).specs[0].spec.role == "m"


def test_anchors_and_aliases_are_followed_for_known_fields() -> None:
    text = (
        "defaults:\n  repo: &repo org/shared\n  ram: &ram '~12'\n"
        + roster(base(id="a", repo="*repo", ram_gb="*ram", port="1"))
        + "  - &whole {id: b, backend: ollama, repo: *repo, ram_gb: 2, port: 2}\n"
    )
    result = one(text)
    assert [s.spec.role for s in result.specs] == ["a", "b"]
    assert result.specs[0].repo == "org/shared"
    assert result.specs[0].spec.memory.weights_bytes == 12 * GB


def test_anchor_redefined_later_names_the_latest_node() -> None:
    text = "a: &x org/one\nb: &x org/two\n" + roster(base(repo="*x"))
    assert one(text).specs[0].repo == "org/two"


# --- merge keys -----------------------------------------------------------------------


def test_merge_key_is_not_applied_and_warns_with_entry_and_line() -> None:
    text = (
        "roster:\n"
        "  - &base {id: base, backend: mlx_lm, repo: org/a, ram_gb: 8, port: 1}\n"
        "  - <<: *base\n"
        "    id: derived\n"
    )
    result = one(text)
    assert result.skipped == (("derived", 'backend "" has no inference adapter'),)
    assert len(result.warnings) == 1
    assert "roster[1]" in result.warnings[0]
    assert '"derived"' in result.warnings[0]
    assert "line 3" in result.warnings[0]
    assert "<<" in result.warnings[0]


# --- aliases of earlier entries ---------------------------------------------------------


def test_alias_key_is_flavor_port_and_repo() -> None:
    text = roster(
        base(id="a", backend="mlx-lm"),
        base(id="b", backend="MLX_LM extra words"),
        base(id="c", backend="ollama"),
        base(id="d", repo="org/other"),
    )
    result = one(text)
    assert [s.spec.role for s in result.specs] == ["a", "c", "d"]
    assert result.skipped == (("b", "alias of a (same server, port and weights)"),)
    assert result.aliases == {"b": "a"}


def test_missing_port_and_repo_count_as_none_and_empty() -> None:
    text = roster(
        entry(id="a", backend="ollama", ram_gb="1"),
        entry(id="b", backend="ollama", ram_gb="2", repo="''", port="~"),
    )
    assert one(text).skipped == (("b", "alias of a (same server, port and weights)"),)


def test_only_imported_entries_can_be_aliased() -> None:
    text = roster(
        base(id="bad id"),
        base(id="zero", ram_gb="0"),
        base(id="good"),
        base(id="twin"),
    )
    result = one(text)
    assert [s.spec.role for s in result.specs] == ["good"]
    assert result.skipped[-1] == ("twin", "alias of good (same server, port and weights)")


def test_same_id_with_different_ports_imports_both() -> None:
    result = one(roster(base(port="1"), base(port="2")))
    assert [s.spec.serve.port for s in result.specs] == [1, 2]
    assert result.get("m") is result.specs[0]
    assert result.get("absent") is None


def test_alias_check_comes_before_ram_gb() -> None:
    result = one(roster(base(id="a"), base(id="b", ram_gb="'unknown'")))
    assert result.skipped == (("b", "alias of a (same server, port and weights)"),)


def test_alias_with_another_name_is_still_skipped_but_warns() -> None:
    text = roster(
        entry(id="alpha", name="model-alpha", backend="llama-server", ram_gb="1"),
        entry(id="beta", name="model-beta", backend="llama.cpp", ram_gb="2"),
    )
    result = one(text)
    assert [s.spec.role for s in result.specs] == ["alpha"]
    assert result.skipped == (("beta", "alias of alpha (same server, port and weights)"),)
    assert result.aliases == {"beta": "alpha"}
    assert len(result.warnings) == 1
    warning = result.warnings[0]
    for part in ('roster[1] (id "beta", line 6)', '"alpha" (line 2)', '"model-beta"'):
        assert part in warning
    assert '"model-alpha"' in warning
    assert "its own `port` or `repo`" in warning


def test_alias_with_the_same_name_does_not_warn() -> None:
    result = one(roster(base(id="a", name="same"), base(id="b", name="same")))
    assert result.skipped == (("b", "alias of a (same server, port and weights)"),)
    assert result.warnings == ()


def test_an_id_imported_twice_warns_and_both_entries_stay_as_the_reference_has_them() -> None:
    result = one(roster(base(id="dup", port="8301"), base(id="dup", port="8302")))
    assert [s.spec.role for s in result.specs] == ["dup", "dup"]  # as roster.rs
    (warning,) = result.warnings
    assert 'roster[1] (id "dup", line 7): id "dup" is imported again (first at line 2)' in warning
    assert "serves the first entry only" in warning


def test_a_key_close_to_a_missing_field_warns_did_you_mean_and_changes_nothing() -> None:
    text = roster(
        base(id="a", ram_gb="1"),
        entry(id="big", backend="llama.cpp", ramgb="4", port="8302"),
        entry(id="caps", backend="ollama", RAM_GB="3", ram_gb="3", notes="x", model="m"),
    )
    result = one(text)
    assert [s.spec.role for s in result.specs] == ["a", "caps"]
    assert result.skipped == (("big", "ram_gb is missing or not a number"),)
    # The file, the key's line, the entry (index, id, its line) and the key.
    assert result.warnings == (
        'roster.yaml:9: roster[1] (id "big", line 7): unknown key "ramgb" is ignored; '
        "did you mean `ram_gb`?",
    )  # "RAM_GB" sits beside a given `ram_gb`; `notes` and `model` are close to nothing
    plain = one(text.replace("ramgb", "ram_gb").replace("RAM_GB", "notes2"))
    assert plain.warnings == ()


def test_a_backend_close_to_a_known_name_warns_did_you_mean() -> None:
    text = roster(
        entry(id="chat", backend="lama.cpp", ram_gb="1", port="8301"),
        entry(id="vision", backend="mlx-vlm", ram_gb="2"),  # no adapter on purpose: no hint
        entry(id="talk", backend="Olama (local)", ram_gb="2"),
    )
    result = one(text)
    assert result.specs == ()
    assert [role for role, _ in result.skipped] == ["chat", "vision", "talk"]
    assert result.warnings == (
        'roster.yaml:3: roster[0] (id "chat", line 2): backend "lama.cpp" names no inference '
        "adapter, so the entry is skipped; did you mean `llama.cpp`?",
        'roster.yaml:10: roster[2] (id "talk", line 9): backend "Olama (local)" names no '
        "inference adapter, so the entry is skipped; did you mean `ollama`?",
    )
    unnamed = import_roster(text)  # no file name: the entry alone
    assert unnamed.warnings[0].startswith('roster[0] (id "chat", line 2): backend "lama.cpp"')


# --- reasons, flavors, latency -------------------------------------------------------------


def test_backend_reason_uses_rust_debug_quoting() -> None:
    text = roster(base(backend='"mlx\\"vlm\\\\x\\u0301\\u200b\\u00e9"'))
    assert one(text).skipped[0][1] == (
        'backend "mlx\\"vlm\\\\x\\u{301}\\u{200b}é" has no inference adapter'
    )


def test_id_reasons_keep_the_id_as_written() -> None:
    result = one(roster(base(id="'-lead'"), base(id="'a/b'"), base(id="'x' ")))
    assert [r for _, r in result.skipped] == ["id is not a plain token"] * 2
    assert result.specs[0].spec.role == "x"


@pytest.mark.parametrize(
    ("backend", "flavor"),
    [
        ("mlx_lm", InferFlavor.MLX_LM),
        ("MLX-LM", InferFlavor.MLX_LM),
        ("llama.cpp (llama-server)", InferFlavor.LLAMACPP),
        ("LLAMA-SERVER", InferFlavor.LLAMACPP),
        ("llamacpp", InferFlavor.LLAMACPP),
        ("\u3000ollama\u00a0or something", InferFlavor.OLLAMA),
        ("ollama\x1f", None),
        ("mlx-vlm", None),
        ("mlx-audio", None),
        ("", None),
        ("   ", None),
        ("OLLAMA", InferFlavor.OLLAMA),
        ("ollam\u0430", None),  # Cyrillic a
    ],
)
def test_flavor_for_backend(backend: str, flavor: InferFlavor | None) -> None:
    assert flavor_for_backend(backend) is flavor


@pytest.mark.parametrize(
    ("role_id", "role", "latency"),
    [
        ("voice", "chat", LatencyClass.INTERACTIVE),
        ("VoiceBot", "chat", LatencyClass.INTERACTIVE),
        ("m", "Realtime assistant", LatencyClass.INTERACTIVE),
        ("m", "chat", LatencyClass.BATCH),
        ("m", "v o i c e", LatencyClass.BATCH),
    ],
)
def test_latency_class_from_the_roles_text(role_id: str, role: str, latency: LatencyClass) -> None:
    result = one(roster(base(id=role_id, role=f"'{role}'")))
    assert result.specs[0].spec.latency_class is latency


# --- overlay ------------------------------------------------------------------------------


def overlay(text: str) -> RosterOverlay:
    return RosterOverlay.from_yaml(text, file="overlay.yaml")


def test_overlay_fields_apply() -> None:
    ov = overlay(
        "excludes:\n  m: [other, 'role:third']\nlatency_class:\n  m: interactive\n"
        "sticky:\n  m: False\n"
    )
    spec = one(roster(base()), ov).specs[0].spec
    assert spec.excludes == ("other", "role:third")
    assert spec.latency_class is LatencyClass.INTERACTIVE
    assert spec.sticky is False


def test_overlay_excludes_entry_that_is_not_a_role_is_skipped_with_rust_quoting() -> None:
    ov = overlay("excludes:\n  m: ['role:', 'a b\\t']\n")
    result = one(roster(base()), ov)
    assert result.skipped == (
        ("m", 'not a valid inference spec: excludes entry "role:" is not a role'),
    )


@pytest.mark.parametrize(
    "text",
    [
        "sticky:\n  m: no\n",
        "sticky:\n  m: 'true'\n",
        "sticky:\n  m: yes\n",
        "latency_class:\n  m: Interactive\n",
        "latency_class:\n  m: {interactive: ~}\n",
        "excludes:\n  m: other\n",
        "excludes:\n  m: ~\n",
        "excludes:\n  m: [[a]]\n",
        "unknown: {}\n",
        "sticky: {}\nsticky: {}\n",
        "sticky: ~\n",
        "- sticky\n",
        "~\n",
        "sticky:\n  [m]: true\n",
    ],
)
def test_overlay_errors(text: str) -> None:
    with pytest.raises(RosterError) as info:
        overlay(text)
    assert info.value.file == "overlay.yaml"
    assert info.value.line is not None


def test_overlay_error_names_the_role_path() -> None:
    with pytest.raises(RosterError) as info:
        overlay("sticky:\n  coder: no\n")
    assert info.value.path == "sticky.coder"
    assert (info.value.line, info.value.column) == (2, 10)
    assert "true or false" in info.value.message


@pytest.mark.parametrize(
    ("text", "sticky"),
    [
        ("", {}),
        ("# nothing\n", {}),
        ("sticky:\n", {}),
        ("sticky:\n  42: false\n", {"42": False}),
        ("sticky:\n  m: true\n  m: false\n", {"m": False}),
        ("sticky: {a: TRUE, b: False}\n", {"a": True, "b": False}),
    ],
)
def test_overlay_accepts(text: str, sticky: dict[str, bool]) -> None:
    assert dict(overlay(text).sticky) == sticky


TWO_ENTRIES = roster(base(id="coder", port="1"), base(id="vision", backend="mlx-vlm", port="2"))


def test_overlay_keys_naming_no_roster_entry_warn_with_section_key_and_line() -> None:
    ov = overlay(
        "excludes:\n  codr: [vision]\n"  # line 2
        "latency_class:\n  coder: interactive\n  cdoer: batch\n"  # line 5
        "sticky:\n  vision: false\n  Coder: false\n"  # line 8
    )
    result = one(TWO_ENTRIES, ov)
    assert result.warnings == (
        'overlay excludes.codr (line 2): no roster entry has the id "codr"; '
        'this setting applies to nothing (did you mean "coder"?)',
        'overlay latency_class.cdoer (line 5): no roster entry has the id "cdoer"; '
        'this setting applies to nothing (did you mean "coder"?)',
        'overlay sticky.Coder (line 8): no roster entry has the id "Coder"; '
        'this setting applies to nothing (did you mean "coder"?)',
    )
    # The warnings change nothing: the same specs and skips as without the typos.
    plain = one(TWO_ENTRIES, overlay("latency_class:\n  coder: interactive\n"))
    assert (result.specs, result.skipped) == (plain.specs, plain.skipped)


def test_overlay_excludes_items_naming_no_roster_entry_warn_with_their_line() -> None:
    ov = overlay("excludes:\n  coder:\n    - vision\n    - role:visoin\n    - 'role:coder2'\n")
    result = one(TWO_ENTRIES, ov)
    assert result.warnings == (
        'overlay excludes.coder (line 4): "role:visoin" names no roster entry; '
        'this exclusion applies to nothing (did you mean "vision"?)',
        'overlay excludes.coder (line 5): "role:coder2" names no roster entry; '
        "this exclusion applies to nothing",  # never suggests the role itself
    )
    assert result.specs[0].spec.excludes == ("vision", "role:visoin", "role:coder2")


def test_overlay_role_given_twice_keeps_the_last_and_warns_with_both_lines() -> None:
    ov = overlay("sticky:\n  coder: true\n  vision: true\n  coder: false\n")
    assert dict(ov.sticky) == {"coder": False, "vision": True}
    result = one(TWO_ENTRIES, ov)
    assert result.specs[0].spec.sticky is False
    assert result.warnings == (
        'overlay sticky.coder (lines 2 and 4): "coder" is given twice in `sticky`; '
        "the last (line 4) is used",
    )


def test_overlay_naming_every_entry_has_no_warning() -> None:
    ov = overlay("excludes:\n  coder: ['role:vision']\nsticky: {coder: false, vision: true}\n")
    assert one(TWO_ENTRIES, ov).warnings == ()


def test_overlay_warnings_are_bounded() -> None:
    keys = "".join(f"  k{i}: true\n" for i in range(200))
    warnings = one(TWO_ENTRIES, overlay("sticky:\n" + keys)).warnings
    assert len(warnings) == 51
    assert warnings[-1] == "overlay: 150 more settings name no roster entry"


def test_overlay_built_in_code_warns_without_a_line() -> None:
    result = one(TWO_ENTRIES, RosterOverlay(sticky={"nope": True}))
    assert result.warnings == (
        'overlay sticky.nope: no roster entry has the id "nope"; this setting applies to nothing',
    )


def test_overlay_latency_by_local_tag_and_empty_exclude_list() -> None:
    ov = overlay("latency_class:\n  a: !batch\n  b: 'interactive'\nexcludes:\n  a:\n")
    assert dict(ov.latency_class) == {"a": LatencyClass.BATCH, "b": LatencyClass.INTERACTIVE}
    assert dict(ov.excludes) == {"a": ()}


# --- alias bombs, read-only --------------------------------------------------------------------


def alias_bomb(use: str) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 16):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n" + roster(base(**{use: "*a15"}))


@pytest.mark.parametrize("field", ["ram_gb", "notes"])
def test_alias_bomb_is_cheap(field: str) -> None:
    text = alias_bomb(field)
    assert len(text) < 4096
    tracemalloc.start()
    started = time.perf_counter()
    try:
        if field == "ram_gb":
            # 10^15 nodes if expanded: the reference's repetition limit rejects it.
            assert "alias" in rejected(text).message
        else:
            # An unknown field is never expanded: the entry imports.
            assert one(text).specs[0].spec.role == "m"
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5
    assert peak < 20_000_000


def test_small_alias_reuse_stays_within_the_repetition_limit() -> None:
    text = "n: &n [1, 2, 3]\nw: &w [*n, *n, *n]\n" + roster(base(ram_gb="*w"))
    assert one(text).skipped == (("m", "ram_gb is missing or not a number"),)


def test_self_referencing_alias_in_ram_gb_fails_by_the_nesting_limit() -> None:
    text = roster(base(ram_gb="&loop [*loop]"))
    assert rejected(text).path == "roster[0].ram_gb"


def test_roster_file_is_opened_read_only_and_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "roster.yaml"
    path.write_text(roster(base()), encoding="utf-8")
    path.chmod(0o444)
    before_bytes = path.read_bytes()
    before = path.stat()
    time.sleep(0.01)
    result = load_roster(path)
    after = path.stat()
    assert result.specs[0].spec.role == "m"
    assert path.read_bytes() == before_bytes
    assert after.st_mtime_ns == before.st_mtime_ns
    assert after.st_size == before.st_size
    assert after.st_mode == before.st_mode


def test_load_roster_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(RosterError) as info:
        load_roster(tmp_path / "absent.yaml")
    assert str(tmp_path / "absent.yaml") in str(info.value)
    with pytest.raises(RosterError) as info:
        load_roster(tmp_path)
    assert str(tmp_path) in str(info.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text(roster(base(port="'1'")), encoding="utf-8")
    with pytest.raises(RosterError) as info:
        load_roster(bad)
    assert str(info.value).startswith(f"{bad}:6:11: roster[0].port:")


def test_rule_files_in_test_data() -> None:
    """Byte-level rule files: each name says accepted or rejected."""
    files = sorted(DATA.glob("*.yaml"))
    assert files
    for path in files:
        if path.name.startswith("reject_"):
            with pytest.raises(RosterError):
                import_roster(path.read_bytes(), file=path.name)
        else:
            import_roster(path.read_bytes(), file=path.name)


def test_python_tags_never_construct_objects(tmp_path: Path) -> None:
    marker = tmp_path / "constructed"
    payload = f'!!python/object/apply:os.system ["touch {marker}"]'
    text = roster(base(name=f"'{payload}'", notes=payload, ram_gb=payload))
    result = one(text)
    assert result.skipped == (("m", "ram_gb is missing or not a number"),)
    assert not marker.exists()
    text = roster(base(ram_gb="!!python/name:os.system 8", status=f"!!python/str {marker}"))
    imported = one(text).specs[0]
    assert imported.spec.memory.weights_bytes == 8 * GB  # an unknown core tag: plain text
    assert imported.status == str(marker)
    with pytest.raises(RosterError):
        one(roster(base(status=payload)))  # a flow sequence where text is expected
    assert not marker.exists()


def test_imported_spec_keeps_display_name_and_line() -> None:
    text = "# lab roster\n" + roster(base(id="a", name="'Qwen 3'", port="1"), base(id="b"))
    result = one(text)
    assert [(s.name, s.spec.model, s.line) for s in result.specs] == [
        ("Qwen 3", None, 3),
        ("", None, 9),
    ]


def test_nesting_beyond_rosterds_bound_is_a_clear_error() -> None:
    depth = 10_001
    err = rejected(roster(base(extra="[" * depth + "]" * depth)))
    assert "nested deeper than 10000 levels" in err.message
    assert err.line == 7
