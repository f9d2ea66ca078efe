"""The keys file: what it may say, how a key is stored (its hash, never the key), what a key
may reach, and the errors a broken file gets (file, field, line, column; never a key).

Pure: the reader, the values and the ``rosterd keys`` commands on a temporary file."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.errors import InputError
from rosterd.keys import (
    ALL_SCOPES,
    ApiKey,
    KeyLimits,
    KeyRing,
    Scope,
    key_digest,
    load_keys,
    new_token,
    parse_keys,
    render_keys,
)
from rosterd.keys.values import MASTER_NAME
from rosterd.schemas import schema_text
from rosterd.spec import LatencyClass

_register()
runner = CliRunner()

DIGEST = key_digest("rk-alice")

FULL = f"""\
keys:
  - name: alice
    hash: {DIGEST}
    scopes: [use, watch]
    models: [chat, "qwen-*"]
    priority: batch
    limits:
      in_flight: 2
      requests_per_minute: 60
      tokens_per_day: 100000
  - name: ops
    hash: {key_digest("rk-ops")}
    scopes: [operate]
"""


def test_a_full_file_reads_every_field() -> None:
    alice, ops = parse_keys(FULL, file="keys.yaml")
    assert alice == ApiKey(
        "alice",
        DIGEST,
        frozenset({Scope.USE, Scope.WATCH}),
        ("chat", "qwen-*"),
        LatencyClass.BATCH,
        KeyLimits(2, 60, 100000),
    )
    assert ops.scopes == {Scope.OPERATE}
    assert ops.models == ("*",)
    assert ops.priority is None
    assert not ops.limits.any()


def test_defaults_are_use_every_model_no_limits() -> None:
    (key,) = parse_keys(f"keys:\n  - name: k\n    hash: {DIGEST}\n")
    assert key.scopes == {Scope.USE}
    assert key.all_models
    assert not key.limits.any()


@pytest.mark.parametrize("text", ["", "keys:", "keys: []", "# nothing\n"])
def test_an_empty_file_is_no_key(text: str) -> None:
    assert parse_keys(text) == ()


def test_the_file_written_reads_back_the_same_keys() -> None:
    keys = parse_keys(FULL)
    assert parse_keys(render_keys(keys)) == keys
    assert parse_keys(render_keys(())) == ()


@pytest.mark.parametrize(
    ("text", "where", "said"),
    [
        ("keys:\n  - name: a\n", (2, 5, "keys[0].hash"), "missing required key 'hash'"),
        (
            f"keys:\n  - name: a\n    hash: {DIGEST}\n    scopes: [use, admin]\n",
            (4, 19, "keys[0].scopes[1]"),
            "expected one of use, watch, operate, found 'admin'",
        ),
        (
            f"keys:\n  - name: a\n    hash: {DIGEST}\n    colour: red\n",
            (4, 5, "keys[0]"),
            "unknown key 'colour'",
        ),
        (
            f"keys:\n  - name: a\n    hash: {DIGEST}\n  - name: a\n    hash: {key_digest('b')}\n",
            (4, 5, "keys[1].name"),
            "duplicate name 'a' (first at keys[0])",
        ),
        (
            f"keys:\n  - name: a\n    hash: {DIGEST}\n  - name: b\n    hash: {DIGEST}\n",
            (4, 5, "keys[1].hash"),
            "one key cannot have two names",
        ),
        (
            f"keys:\n  - name: a\n    hash: {DIGEST}\n    limits: {{in_flight: 0}}\n",
            (4, 25, "keys[0].limits.in_flight"),
            "expected a whole number > 0, found 0",
        ),
        (
            f"keys:\n  - name: a\n    hash: {DIGEST}\n    priority: urgent\n",
            (4, 15, "keys[0].priority"),
            "expected one of interactive, batch",
        ),
        ("keys:\n  - name: [a\n", (3, 1, None), "not valid YAML"),
    ],
)
def test_a_broken_file_is_refused_at_its_place(
    text: str, where: tuple[int, int, str | None], said: str
) -> None:
    with pytest.raises(InputError) as caught:
        parse_keys(text, file="keys.yaml")
    err = caught.value
    assert (err.line, err.column, err.path) == where, str(err)
    assert err.file == "keys.yaml"
    assert said in str(err)


def test_a_key_pasted_where_a_hash_or_name_goes_is_never_shown() -> None:
    token = new_token()
    for text in (
        f"keys:\n  - name: a\n    hash: {token}\n",
        f"keys:\n  - name: {token}\n    hash: {DIGEST}\n",
        f"keys:\n  - name: a\n    hash: {DIGEST}\n    scopes: [{token}]\n",
        f"keys:\n  - name: a\n    hash: {DIGEST}\n    {token}: 1\n",
    ):
        with pytest.raises(InputError) as caught:
            parse_keys(text, file="keys.yaml")
        assert token not in str(caught.value)
        assert token[3:20] not in str(caught.value)


def test_a_key_is_256_random_bits_stored_as_its_sha256() -> None:
    token = new_token()
    assert token.startswith("rk-")
    assert len(token) == 46
    assert new_token() != token
    digest = key_digest(token)
    assert digest.startswith("sha256:")
    assert len(digest) == 7 + 64
    assert token not in digest


def test_the_ring_finds_a_key_by_its_token_only() -> None:
    ring = KeyRing.of(parse_keys(FULL), ["master"])
    alice = ring.find(b"rk-alice")
    assert alice is not None
    assert alice.name == "alice"
    assert ring.find(b"rk-alic") is None
    assert ring.find(b"") is None
    assert ring.find(DIGEST.encode()) is None  # the hash is not the key
    master = ring.find(b"master")
    assert master is not None
    assert master.name == MASTER_NAME
    assert master.scopes == ALL_SCOPES
    assert master.all_models
    assert ring.required
    assert not KeyRing().required


def test_models_match_ids_names_aliases_and_patterns() -> None:
    (alice, _) = parse_keys(FULL)
    assert alice.may_use(["chat"])
    assert alice.may_use(["role-x", "qwen-7b"])  # by its model name
    assert not alice.may_use(["chat2", "qwen"])
    assert not alice.may_use(["Chat"])  # case counts, as role ids do


def test_the_schema_accepts_what_the_reader_accepts_and_refuses_the_rest() -> None:
    schema = json.loads(schema_text("keys"))
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    assert not list(validator.iter_errors(yaml.safe_load(FULL)))
    assert not list(validator.iter_errors(yaml.safe_load(render_keys(parse_keys(FULL)))))
    bad = yaml.safe_load(FULL)
    bad["keys"][0]["scopes"] = ["admin"]
    assert list(validator.iter_errors(bad))
    bad = yaml.safe_load(FULL)
    bad["keys"][0]["hash"] = "rk-secret"
    assert list(validator.iter_errors(bad))


# ---- rosterd keys ----------------------------------------------------------------------------


def test_keys_add_prints_the_key_once_last_and_writes_only_its_hash(tmp_path: Path) -> None:
    file = tmp_path / "keys.yaml"
    done = runner.invoke(
        app,
        [
            "keys",
            "add",
            "alice",
            "--keys",
            str(file),
            "--scope",
            "use",
            "--scope",
            "watch",
            "--models",
            "chat",
            "--models",
            "qwen-*",
            "--priority",
            "batch",
            "--requests-per-minute",
            "30",
        ],
    )
    assert done.exit_code == 0, done.output
    token = done.output.split()[-1]
    assert token.startswith("rk-")
    text = file.read_text()
    assert token not in text
    assert key_digest(token) in text
    (key,) = parse_keys(text)
    assert key.name == "alice"
    assert key.scopes == {Scope.USE, Scope.WATCH}
    assert key.models == ("chat", "qwen-*")
    assert key.priority is LatencyClass.BATCH
    assert key.limits == KeyLimits(requests_per_minute=30)
    assert KeyRing(parse_keys(text)).find(token.encode()) == key

    again = runner.invoke(app, ["keys", "add", "alice", "--keys", str(file)])
    assert again.exit_code == 2
    assert "already" in again.output
    second = runner.invoke(app, ["keys", "add", "bob", "--keys", str(file)])
    assert second.exit_code == 0, second.output
    listed = runner.invoke(app, ["keys", "list", "--keys", str(file), "--json"])
    assert listed.exit_code == 0, listed.output
    shown = json.loads(listed.output)["keys"]
    assert [k["name"] for k in shown] == ["alice", "bob"]
    assert shown[1]["scopes"] == ["use"]
    assert shown[1]["models"] == ["*"]
    assert "sha256" not in listed.output
    table = runner.invoke(app, ["keys", "list", "--keys", str(file)])
    assert table.exit_code == 0
    assert "alice" in table.output
    assert "qwen-*" in table.output

    # The hint names the keys file: run as printed, it removes the key.
    (hint,) = _hints(again.output, "rosterd keys remove")
    assert hint == f"rosterd keys remove alice --keys {shlex.quote(str(file))}"
    removed = runner.invoke(app, shlex.split(hint)[1:])
    assert removed.exit_code == 0, removed.output
    assert [k.name for k in parse_keys(file.read_text())] == ["bob"]
    assert _hints(removed.output, "rosterd up") == [f"rosterd up --keys {shlex.quote(str(file))}"]
    missing = runner.invoke(app, ["keys", "remove", "alice", "--keys", str(file)])
    assert missing.exit_code == 2
    assert "no key named 'alice'" in missing.output
    (listing,) = _hints(missing.output, "rosterd keys list")
    assert runner.invoke(app, shlex.split(listing)[1:]).exit_code == 0
    # The file says how to add a key to it, and so does its error for a key without a hash.
    assert f"rosterd keys add NAME --keys {shlex.quote(str(file))}" in file.read_text()
    with pytest.raises(InputError) as no_hash:
        load_keys(_written(file, "keys:\n  - name: carol\n"))
    assert f"`rosterd keys add NAME --keys {shlex.quote(str(file))}`" in str(no_hash.value)


def _hints(output: str, command: str) -> list[str]:
    """The commands starting with ``command`` in backquotes in ``output`` (lines joined)."""
    said = " ".join(output.split())
    return [h for h in re.findall(r"`([^`]+)`", said) if h.startswith(command)]


def _written(file: Path, text: str) -> Path:
    file.write_text(text)
    return file


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--scope", "admin"], "--scope 'admin' is not one of use, watch, operate"),
        (["--priority", "urgent"], "--priority 'urgent' is not one of interactive, batch"),
        (["--models", "a b"], "--models expected"),
    ],
)
def test_keys_add_refuses_a_bad_option_and_writes_nothing(
    tmp_path: Path, args: list[str], said: str
) -> None:
    file = tmp_path / "keys.yaml"
    done = runner.invoke(app, ["keys", "add", "k", "--keys", str(file), *args])
    assert done.exit_code == 2, done.output
    assert said in " ".join(done.output.split())
    assert not file.exists()


def test_keys_add_refuses_a_name_that_is_not_a_token(tmp_path: Path) -> None:
    done = runner.invoke(app, ["keys", "add", "../x", "--keys", str(tmp_path / "k.yaml")])
    assert done.exit_code == 2
    assert "plain token" in done.output


# ---- fuzzing ---------------------------------------------------------------------------------

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOKEN = "rk-" + "Q" * 43  # stands for a key someone pasted; it must never come back out

BITS = st.sampled_from(
    [
        "keys:",
        "\n",
        "  ",
        "- ",
        "name: ",
        "hash: ",
        "scopes: ",
        "models: ",
        "priority: ",
        "limits: ",
        "in_flight: ",
        "requests_per_minute: ",
        "tokens_per_day: ",
        "use",
        "watch",
        "operate",
        "batch",
        "interactive",
        DIGEST,
        TOKEN,
        "[",
        "]",
        "{",
        "}",
        ", ",
        ": ",
        "&a ",
        "*a",
        "!x ",
        "!!int ",
        "!!binary ",
        "'",
        '"',
        "#",
        "~",
        "0",
        "-1",
        "1e3",
        ".inf",
        "99999999999999999999",
        "\t",
        "---\n",
        "%YAML 1.1\n",
        "é",
        "\ufeff",
        "\r\n",
        "*",
    ]
)


def _read_or_error(text: str | bytes) -> None:
    keys: tuple[ApiKey, ...] | InputError
    try:
        keys = parse_keys(text, file="keys.yaml")
    except InputError as err:
        keys = err
    if isinstance(keys, InputError):
        assert keys.file == "keys.yaml"
        assert keys.message
        assert TOKEN not in str(keys)
        assert TOKEN[3:20] not in str(keys)
    else:
        assert parse_keys(render_keys(keys)) == keys


@SETTINGS
@given(st.lists(BITS, max_size=60))
def test_yaml_shaped_noise_gives_keys_or_a_clear_error_never_a_key(bits: list[str]) -> None:
    _read_or_error("".join(bits))


@SETTINGS
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_any_input_gives_keys_or_a_clear_error(data: str | bytes) -> None:
    _read_or_error(data)
