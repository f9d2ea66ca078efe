"""The small things users expect: ``rosterd --version``, ``rosterd ps --json``,
``--cors-origin`` (preflight requests answered, off by default) and the JSON Schemas of
the roster, overlay and fleet files (``rosterd schema NAME``).

The schemas are checked with the ``jsonschema`` package against what the readers
accept: the examples, every reference roster case the import accepts (read as YAML
1.2 by ``ryaml``, serde_yaml's own reader, as the import reads it), and inputs the
readers refuse.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from ryaml._ryaml import InvalidYamlError, loads

from rosterd.cli.serve_cmd import check_cors_origins
from rosterd.errors import RosterdError
from rosterd.fleet.reader import parse_fleet
from rosterd.roster.importer import import_roster
from rosterd.roster.overlay import RosterOverlay
from rosterd.router import RouterConfig
from support.router import serve
from support.up import rosterd_argv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CASES = ROOT / "tests" / "data" / "roster-cases"


def rosterd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*rosterd_argv(), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_version_is_the_package_version() -> None:
    done = rosterd("--version")
    assert done.returncode == 0, done.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert done.stdout == f"rosterd {version}\n"


async def test_ps_json_prints_what_rosterd_up_answers(tmp_path: Path) -> None:
    async with serve(tmp_path) as up:
        done = await asyncio.to_thread(rosterd, "ps", "--json", "--url", up.url)
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        async with httpx.AsyncClient() as client:
            direct = (await client.get(f"{up.url}/rosterd/ps")).json()
    assert data["nodes"].keys() == direct["nodes"].keys() == {"n1"}
    assert data["nodes"]["n1"]["roles"]["chat"]["phase"] == "stopped"
    assert data["nodes"]["n1"]["roles"]["chat"]["kv_summary"] == "—"  # nothing kept
    assert data["nodes"]["n1"]["capacity_bytes"] == direct["nodes"]["n1"]["capacity_bytes"]


def test_ps_json_reports_a_missing_up_as_json() -> None:
    done = rosterd("ps", "--json", "--url", "http://127.0.0.1:9")
    assert done.returncode == 3
    assert "no rosterd up answers" in json.loads(done.stdout)["error"]


# ---- CORS --------------------------------------------------------------------------------

PREFLIGHT = {
    "Origin": "http://notebook.lab:8888",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def test_cors_is_off_by_default(tmp_path: Path) -> None:
    async with serve(tmp_path) as up, httpx.AsyncClient(base_url=up.url) as client:
        r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert r.status_code == 405
        assert "access-control-allow-origin" not in r.headers
        r = await client.get("/v1/models", headers={"Origin": PREFLIGHT["Origin"]})
        assert "access-control-allow-origin" not in r.headers


async def test_a_cors_origin_gets_preflight_answers_even_with_an_api_key(tmp_path: Path) -> None:
    config = RouterConfig(api_keys=("sesame",), cors_origins=("http://notebook.lab:8888",))
    async with serve(tmp_path, config=config) as up, httpx.AsyncClient(base_url=up.url) as client:
        r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert r.status_code == 200  # no key needed: a browser never sends one in a preflight
        assert r.headers["access-control-allow-origin"] == "http://notebook.lab:8888"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()

        r = await client.get(
            "/v1/models",
            headers={"Origin": "http://notebook.lab:8888", "Authorization": "Bearer sesame"},
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://notebook.lab:8888"
        # What a request waited for (rosterd.router.wait_report) is readable by that page.
        exposed = r.headers["access-control-expose-headers"].lower()
        for name in ("retry-after", "x-rosterd-queue-wait-s", "x-rosterd-load-s"):
            assert name in exposed
        # An error answer carries the header too, so the page can read why.
        r = await client.get("/v1/models", headers={"Origin": "http://notebook.lab:8888"})
        assert r.status_code == 401
        assert r.headers["access-control-allow-origin"] == "http://notebook.lab:8888"

        other = {**PREFLIGHT, "Origin": "http://elsewhere.example"}
        r = await client.options("/v1/chat/completions", headers=other)
        assert r.status_code == 400
        assert "access-control-allow-origin" not in r.headers


def test_cors_origins_are_checked() -> None:
    assert check_cors_origins(["http://a:1", "*", "http://a:1"]) == ("http://a:1", "*")
    for bad in ["notebook.lab", "http://a/path", "ftp://a", "http://a?x=1", " http://a", ""]:
        with pytest.raises(RosterdError, match="is not an origin"):
            check_cors_origins([bad])


def test_up_refuses_a_bad_cors_origin() -> None:
    done = rosterd("up", str(EXAMPLES / "roster.yaml"), "--cors-origin", "http://a/b")
    assert done.returncode == 2
    assert "--cors-origin 'http://a/b' is not an origin" in done.stderr


# ---- schemas -------------------------------------------------------------------------------


def schema(name: str) -> Any:
    done = rosterd("schema", name)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    jsonschema.Draft7Validator.check_schema(document)
    return document


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    return {name: schema(name) for name in ("roster", "overlay", "fleet")}


def errors(document: Any, data: Any) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(document).iter_errors(data)]


def test_schema_refuses_an_unknown_name() -> None:
    done = rosterd("schema", "plan")
    assert done.returncode == 2
    assert "roster, overlay, fleet" in done.stderr


def test_the_examples_are_valid(schemas: dict[str, Any]) -> None:
    assert errors(schemas["roster"], loads((EXAMPLES / "roster.yaml").read_text())) == []
    assert errors(schemas["overlay"], loads((EXAMPLES / "overlay.yaml").read_text())) == []
    for fleet in ("fleet.yaml", "fleet-lab.yaml"):
        assert errors(schemas["fleet"], yaml.safe_load((EXAMPLES / fleet).read_text())) == []


def _cases() -> list[dict[str, Any]]:
    lines = (CASES / "expected.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _yaml12(path: Path) -> Any:
    """The file as YAML 1.2 data, or a skip when it is not one YAML document (a key given
    twice, a tab): no JSON Schema can speak of that, the import refuses it itself."""
    try:
        return loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, InvalidYamlError) as err:
        pytest.skip(f"{path.name} is not one YAML document as data ({err})")


@pytest.mark.parametrize("case", _cases(), ids=lambda c: str(c["case"]) + f"+{c['overlay']}")
def test_every_roster_case_the_import_accepts_is_valid(
    case: dict[str, Any], schemas: dict[str, Any]
) -> None:
    if "error" in case["output"]:
        return  # the refused cases are below
    roster = _yaml12(CASES / "cases" / case["case"])
    assert errors(schemas["roster"], roster) == []
    if case["overlay"]:
        assert errors(schemas["overlay"], _yaml12(CASES / "cases" / case["overlay"])) == []


#: Reference cases the import refuses that the schema refuses too (the rest are beyond a
#: schema: a key given twice, bytes that are not UTF-8, a whole-number float as a port).
REFUSED_BY_SCHEMA = [
    "backend_list.yaml",
    "entries_257.yaml",
    "entry_is_string.yaml",
    "missing_id.yaml",
    "port_leading_zero.yaml",
    "port_negative.yaml",
    "port_quoted.yaml",
    "port_underscore.yaml",
    "roster_is_string.yaml",
    "top_level_list.yaml",
    "top_level_scalar.yaml",
]


@pytest.mark.parametrize("name", REFUSED_BY_SCHEMA)
def test_roster_cases_the_import_refuses_are_invalid(name: str, schemas: dict[str, Any]) -> None:
    path = CASES / "cases" / name
    with pytest.raises(RosterdError):
        import_roster(path.read_bytes(), file=name)
    assert errors(schemas["roster"], _yaml12(path)) != []


@pytest.mark.parametrize(
    "text",
    [
        "latency: {m1: interactive}\n",  # unknown key
        "latency_class: {m1: Interactive}\n",  # not lowercase
        "sticky: {m1: yes}\n",  # YAML 1.2: text, not a boolean
        "excludes: {m1: coder}\n",  # not a list
        "- sticky\n",
    ],
)
def test_overlays_the_reader_refuses_are_invalid(text: str, schemas: dict[str, Any]) -> None:
    with pytest.raises(RosterdError):
        RosterOverlay.from_yaml(text)
    assert errors(schemas["overlay"], loads(text)) != []


NODE = "{name: box, memory_gb: 8, platform: linux-x86_64}"


@pytest.mark.parametrize(
    "text",
    [
        "nodes: []\n",
        "nodes: [{name: box, memory_gb: 8}]\n",  # no platform
        "nodes: [{name: box, memory_gb: 0, platform: linux-x86_64}]\n",
        "nodes: [{name: 'a b', memory_gb: 8, platform: linux-x86_64}]\n",
        "nodes: [{name: box, memory_gb: 8, platform: windows}]\n",
        "nodes: [{name: box, memory_gb: 8, platform: linux-x86_64, gpu: 1}]\n",
        "nodes: [{name: box, memory_gb: 8, platform: linux-x86_64, flavors: [vllm]}]\n",
        "nodes: [{name: box, memory_gb: 8, platform: linux-x86_64, address: 'h/x'}]\n",
        f"nodes: [{NODE}]\nmodels: {{m: {{ctx_size: 512}}}}\n",  # no path
        f"nodes: [{NODE}]\nmodels: {{m: {{path: a.gguf, ctx: 512}}}}\n",
        f"nodes: [{NODE}]\nmodels: {{m: {{path: a.gguf, parallel: 0}}}}\n",
        f"nodes: [{NODE}]\nmodel_roots: models\n",
        f"nodes: [{NODE}]\nnode: x\n",
    ],
)
def test_fleets_the_reader_refuses_are_invalid(text: str, schemas: dict[str, Any]) -> None:
    with pytest.raises(RosterdError):
        parse_fleet(text)
    assert errors(schemas["fleet"], yaml.safe_load(text)) != []


def test_a_fleet_with_every_key_is_valid(schemas: dict[str, Any]) -> None:
    text = (
        "nodes:\n"
        "  - {name: studio, memory_gb: 192.5, reserved_gb: 16, platform: macos-arm64,\n"
        "     flavors: [mlx_lm, ollama], address: 10.0.0.10, labels: {room: lab, rack: 2}}\n"
        "models:\n"
        "  tiny: models/tiny.gguf\n"
        "  big: {path: models/big.gguf, ctx_size: 8192, parallel: 2, extra_args: [--mlock]}\n"
        "model_roots: [models]\n"
    )
    parse_fleet(text)
    assert errors(schemas["fleet"], yaml.safe_load(text)) == []


def test_ps_notes_say_why_a_role_is_unavailable_retiring_or_about_to_restart() -> None:
    from rosterd.cli.client_cmd import _role_notes

    notes = _role_notes(
        "chat",
        {"unavailable_reason": "models: chat: /m.gguf does not exist", "restart_pending": True},
    )
    assert notes == [
        "chat: unavailable: models: chat: /m.gguf does not exist",
        "chat: restarts once idle (or after --drain): a reload changed what it launches",
    ]
    assert _role_notes("old", {"retiring": True}) == [
        "old: retiring: a reload removed it here; it stops once idle"
    ]
    kv = {
        "last_restore": "restored",
        "last_restore_check": "not reused",
        "last_restore_check_detail": "role chat: the KV restore of 3,713 tokens did not serve",
    }
    assert _role_notes("chat", {"kv": kv}) == ["chat: the KV restore of 3,713 tokens did not serve"]
