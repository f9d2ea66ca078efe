"""The fleet file: what a valid file gives, and a located, explicit error for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.errors import FleetError
from rosterd.fleet import Fleet, Platform, default_reserved_bytes
from rosterd.fleet.local import local_fleet
from rosterd.fleet.reader import load_fleet, parse_fleet
from rosterd.spec import InferFlavor
from rosterd.tokens import GB

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The guide's page on the fleet file, whose annotated example is checked here.
FLEET_PAGE = EXAMPLES.parent / "docs" / "fleet-file.md"


def _readme_fleet_example() -> list[str]:
    """The guide's fleet file example (the YAML block that starts with ``nodes:``), by line."""
    text = FLEET_PAGE.read_text(encoding="utf-8")
    start = text.index("```yaml\nnodes:") + len("```yaml\n")
    return text[start : text.index("```", start)].splitlines()


def test_readme_fleet_example_marks_exactly_the_required_node_keys(tmp_path: Path) -> None:
    lines = _readme_fleet_example()
    fleet = parse_fleet("\n".join(lines), file="fleet.yaml", base_dir=tmp_path)
    assert fleet.nodes[0].name == "studio"
    assert set(fleet.models) == {"gemma-3-270m", "tiny-a", "chat", "ranker"}
    assert fleet.replicas_of("chat") == 2
    assert fleet.models["ranker"].reranking is True
    assert fleet.models["chat"].reranking is None  # the GGUF's pooling type decides
    node_keys = [
        (i, line.split(":")[0].strip(" -"))
        for i, line in enumerate(lines)
        if line.startswith("    ") or line.startswith("  - ")
    ]
    required = {key for i, key in node_keys if "# required" in lines[i]}
    assert required == {"name", "memory_gb", "platform"}
    for i, key in node_keys:
        without = [line for j, line in enumerate(lines) if j != i]
        if key == "name":  # the list item starts with it: start it with the next key
            without[i] = "  - " + without[i].lstrip()
        text = "\n".join(without)
        if key in required:
            with pytest.raises(FleetError, match=f"missing required key '{key}'"):
                parse_fleet(text, file="fleet.yaml", base_dir=tmp_path)
        else:
            parse_fleet(text, file="fleet.yaml", base_dir=tmp_path)


def test_documented_example_node(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        """\
nodes:
  - name: studio
    memory_gb: 192          # total RAM, GiB
    reserved_gb: 16
    platform: macos-arm64
    flavors: [mlx_lm, llamacpp, ollama]
    address: 127.0.0.1
    labels: {room: lab}
"""
    )
    fleet = load_fleet(path)
    (studio,) = fleet.nodes
    assert studio.name == "studio"
    assert studio.memory_bytes == 192 * GB
    assert studio.reserved_bytes == 16 * GB
    assert studio.capacity_bytes == 176 * GB
    assert studio.platform is Platform.MACOS_ARM64
    assert studio.flavors == frozenset(InferFlavor)
    assert studio.address == "127.0.0.1"
    assert studio.labels == {"room": "lab"}
    assert fleet.node("studio") is studio
    assert fleet.models == {}
    assert fleet.model_roots == (tmp_path.resolve(),)
    with pytest.raises(KeyError):
        fleet.node("nope")


def test_defaults_reserve_flavors_address() -> None:
    fleet = parse_fleet(
        """\
nodes:
  - {name: big, memory_gb: 128, platform: linux-x86_64}
  - {name: small, memory_gb: 8, platform: linux-arm64}
  - {name: tiny, memory_gb: 1.5, platform: macos-arm64}
"""
    )
    big, small, tiny = fleet.nodes
    assert big.reserved_bytes == 128 * GB // 10
    assert small.reserved_bytes == 2 * GB  # 10 % would be 0.8 GiB: the 2 GiB floor wins
    assert tiny.reserved_bytes == round(1.5 * GB) // 10  # under 2 GiB: 10 % alone
    assert big.flavors == {InferFlavor.LLAMACPP, InferFlavor.OLLAMA}
    assert tiny.flavors == frozenset(InferFlavor)
    assert big.address == "127.0.0.1"
    assert big.labels == {}


@pytest.mark.parametrize("memory_gb", [0.001, 0.5, 1.99, 2, 2.1, 3, 19.9, 20, 21, 1000])
def test_default_reserve_leaves_capacity(memory_gb: float) -> None:
    memory = round(memory_gb * GB)
    reserved = default_reserved_bytes(memory)
    assert 0 <= reserved < memory
    if memory >= 20 * GB:
        assert reserved == memory // 10
    elif memory >= 4 * GB:
        assert reserved == 2 * GB
    elif memory >= 2 * GB:
        assert reserved == memory // 2
    else:
        assert reserved == memory // 10


def test_fractional_gb_become_bytes() -> None:
    fleet = parse_fleet(
        "nodes:\n  - {name: a, memory_gb: 1.5, reserved_gb: 0.5, platform: linux-x86_64}\n"
    )
    assert fleet.nodes[0].memory_bytes == 3 * GB // 2
    assert fleet.nodes[0].capacity_bytes == GB


def test_models_and_roots_resolve_against_the_file(tmp_path: Path) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    path = sub / "fleet.yaml"
    path.write_text(
        """\
nodes:
  - {name: a, memory_gb: 8, platform: linux-x86_64}
models:
  gemma-3-270m: models/gemma.gguf
  qwen2.5:7b:
    path: /abs/qwen.gguf
    ctx_size: 4096
    parallel: 2
    extra_args: [--mlock, -fa]
model_roots: [weights, /srv/models]
"""
    )
    fleet = load_fleet(path)
    assert fleet.models["gemma-3-270m"].path == sub.resolve() / "models/gemma.gguf"
    qwen = fleet.models["qwen2.5:7b"]
    assert qwen.path == Path("/abs/qwen.gguf")
    assert (qwen.ctx_size, qwen.parallel, qwen.extra_args) == (4096, 2, ("--mlock", "-fa"))
    assert fleet.model_roots == (sub.resolve() / "weights", Path("/srv/models"))


def test_example_fleets_load() -> None:
    lab = load_fleet(EXAMPLES / "fleet-lab.yaml")
    assert [n.name for n in lab.nodes] == ["studio", "macbook", "linux-box"]
    assert lab.node("studio").capacity_bytes == 176 * GB
    assert InferFlavor.MLX_LM not in lab.node("linux-box").flavors
    assert lab.node("linux-box").reserved_bytes == 128 * GB // 10


def test_local_fleet_is_this_machine() -> None:
    fleet = local_fleet()
    assert isinstance(fleet, Fleet)
    (node,) = fleet.nodes
    assert node.name == "local"
    assert node.address == "127.0.0.1"
    assert 0 < node.capacity_bytes < node.memory_bytes
    assert node.flavors == node.platform.supported_flavors()


# Each bad file: (text, field path, line, column, words the message must contain).
BAD = [
    ("", None, None, None, ["empty", "nodes"]),
    ("- a\n", None, 1, 1, ["expected a mapping with `nodes:`", "a list"]),
    ("nodes: []\n", "nodes", 1, 8, ["at least one node"]),
    ("nodes: {a: 1}\n", "nodes", 1, 8, ["a list of nodes", "a mapping"]),
    ("nodez: []\n", "nodez", 1, 1, ["unknown key 'nodez'", "nodes, models, model_roots"]),
    ("models: {}\n", "nodes", 1, 1, ["missing `nodes:`"]),
    (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64, ram: 3}\n",
        "nodes[0].ram",
        2,
        53,
        ["unknown key 'ram'", "name, memory_gb, reserved_gb, platform, flavors, address, labels"],
    ),
    (
        "nodes:\n  - {memory_gb: 8, platform: linux-x86_64}\n",
        "nodes[0].name",
        2,
        5,
        ["missing required key 'name'"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 8}\n",
        "nodes[0].platform",
        2,
        5,
        [
            "missing required key 'platform'",
            "every node needs `name` (a plain token), `memory_gb` (total RAM, GiB) and "
            "`platform` (macos-arm64, linux-x86_64, linux-arm64)",
        ],
    ),
    (
        "nodes:\n  - {name: 'a b', memory_gb: 8, platform: linux-x86_64}\n",
        "nodes[0].name",
        2,
        12,
        ["plain token", "'a b'"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n"
        "  - {name: a, memory_gb: 8, platform: linux-x86_64}\n",
        "nodes[1].name",
        3,
        5,
        ["duplicate node name 'a'", "nodes[0]"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: -1\n    platform: linux-x86_64\n",
        "nodes[0].memory_gb",
        3,
        16,
        ["a number > 0", "-1"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: true\n    platform: linux-x86_64\n",
        "nodes[0].memory_gb",
        3,
        16,
        ["a number > 0", "True"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: '8'\n    platform: linux-x86_64\n",
        "nodes[0].memory_gb",
        3,
        16,
        ["a number > 0", "'8'"],
    ),
    (
        # YAML 1.1 reads an exponent without a dot and a sign as text: said how to write it
        "nodes:\n  - name: a\n    memory_gb: 1e3\n    platform: linux-x86_64\n",
        "nodes[0].memory_gb",
        3,
        16,
        ["a number > 0", "'1e3'", "write 1000, or 1.0e+3"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    reserved_gb: 8\n    platform: linux-x86_64\n",
        "nodes[0].reserved_gb",
        4,
        18,
        ["less than memory_gb (8)", "no capacity"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    platform: windows\n",
        "nodes[0].platform",
        4,
        15,
        ["macos-arm64, linux-x86_64, linux-arm64", "'windows'"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    platform: linux-x86_64\n"
        "    flavors: [mlx_lm]\n",
        "nodes[0].flavors[0]",
        5,
        15,
        ["linux-x86_64 cannot run 'mlx_lm'", "llamacpp, ollama"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    platform: linux-x86_64\n    flavors: [vllm]\n",
        "nodes[0].flavors[0]",
        5,
        15,
        ["mlx_lm, llamacpp, ollama", "'vllm'"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    platform: linux-x86_64\n    flavors: []\n",
        "nodes[0].flavors",
        5,
        14,
        ["at least one flavor"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    platform: linux-x86_64\n    address: 'a b'\n",
        "nodes[0].address",
        5,
        14,
        ["host name or IP address"],
    ),
    (
        "nodes:\n  - name: a\n    memory_gb: 8\n    platform: linux-x86_64\n    labels: {r: [1]}\n",
        "nodes[0].labels.r",
        5,
        17,
        ["text or a number", "a list"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n"
        "models:\n  m: {ctx_size: 4}\n",
        "models.m.path",
        4,
        6,
        ["missing required key 'path'"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n"
        "models:\n  m: {path: x, ctx_size: 0}\n",
        "models.m.ctx_size",
        4,
        26,
        ["whole number > 0", "0"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n"
        "models:\n  m: {path: x, gpu: 1}\n",
        "models.m.gpu",
        4,
        16,
        ["unknown key 'gpu'", "path, ctx_size, parallel, extra_args"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n"
        "models:\n  m: {path: x, load_progress: loud}\n",
        "models.m.load_progress",
        4,
        31,
        ["expected one of ping, text, off", "'loud'"],
    ),
    ("nodes:\n  - {name: a\n", None, 3, 1, ["not valid YAML"]),
    (
        "nodes:\n  - {name: !foo a, memory_gb: 8, platform: linux-x86_64}\n",
        "nodes[0].name",
        2,
        12,
        ["'a' tagged !foo"],
    ),
    (
        "nodes:\n  - {name: a, memory_gb: 2024-01-01, platform: linux-x86_64}\n",
        "nodes[0].memory_gb",
        2,
        26,
        ["a number > 0", "2024"],
    ),
    (
        "nodes:\n  - name: a\n    name: b\n    memory_gb: 8\n    platform: linux-x86_64\n",
        "nodes[0].name",
        3,
        5,
        ["duplicate key 'name'"],
    ),
]


@pytest.mark.parametrize(
    ("text", "path", "line", "column", "words"),
    BAD,
    ids=[f"bad{i}" for i in range(len(BAD))],
)
def test_bad_fleet_files_are_rejected_with_location(
    text: str, path: str | None, line: int | None, column: int | None, words: list[str]
) -> None:
    with pytest.raises(FleetError) as info:
        parse_fleet(text, file="fleet.yaml")
    err = info.value
    assert err.file == "fleet.yaml"
    assert err.path == path
    assert (err.line, err.column) == (line, column), str(err)
    for word in words:
        assert word in str(err), (word, str(err))


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("llama.cpp", "llamacpp"),  # the roster's own spelling of the backend
        ("llama-server", "llamacpp"),
        ("LLAMA.CPP", "llamacpp"),
        ("lama.cpp", "llamacpp"),  # a typo of one
        ("Ollama", "ollama"),
        ("mlx-lm", "mlx_lm"),
        ("vllm", None),  # no flavor: no guess
        ("mlx-vlm", None),  # a backend known to have no adapter: no guess either
    ],
)
def test_a_flavor_spelled_as_the_roster_spells_backends_says_which_id_is_meant(
    written: str, meant: str | None
) -> None:
    """The roster names backends by their own names (``backend: llama.cpp``), the fleet
    file names flavors by id: a fleet written with the roster's spelling is refused, with
    the id it means, as the roster import maps the spelling."""
    text = (
        "nodes:\n  - name: box\n    memory_gb: 16\n    platform: macos-arm64\n"
        f"    flavors: [{written!r}]\n"
    )
    with pytest.raises(FleetError) as info:
        parse_fleet(text, file="fleet.yaml")
    err = info.value
    assert (err.path, err.line, err.column) == ("nodes[0].flavors[0]", 5, 15)
    assert f"expected one of mlx_lm, llamacpp, ollama, found {written!r}" in str(err)
    if meant is None:
        assert "did you mean" not in str(err)
    else:
        assert str(err).endswith(f"; did you mean `{meant}`?")


def test_unreadable_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="cannot read the fleet file") as info:
        load_fleet(tmp_path / "missing.yaml")
    assert info.value.file == str(tmp_path / "missing.yaml")


def test_non_utf8_and_oversized_files(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"nodes:\n  - name: caf\xe9\n")
    with pytest.raises(FleetError, match="not UTF-8"):
        load_fleet(bad)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1_048_577))
    with pytest.raises(FleetError, match="larger than"):
        load_fleet(big)


VALID = """\
nodes:
  - name: studio
    memory_gb: 192
    reserved_gb: 16
    platform: macos-arm64
    flavors: [mlx_lm, llamacpp]
    labels: {room: lab}
models:
  m: {path: x.gguf, ctx_size: 8}
model_roots: [w]
"""


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.tuples(st.integers(0, len(VALID)), st.integers(0, 20), st.text(max_size=12)).map(
            lambda cut: VALID[: cut[0]] + cut[2] + VALID[cut[0] + cut[1] :]
        ),
    )
)
def test_any_text_gives_a_fleet_or_a_located_fleet_error(text: str) -> None:
    fleet: Fleet | FleetError
    try:
        fleet = parse_fleet(text, file="fleet.yaml")
    except FleetError as err:
        fleet = err
    if isinstance(fleet, FleetError):
        assert str(fleet).startswith("fleet.yaml")
        assert fleet.message
    else:
        assert fleet.nodes
        for node in fleet.nodes:
            assert 0 < node.capacity_bytes <= node.memory_bytes


def test_node_max_concurrency_is_read_and_checked() -> None:
    fleet = parse_fleet(
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64, max_concurrency: 4}\n"
        "  - {name: b, memory_gb: 8, platform: linux-x86_64}\n"
    )
    assert fleet.node("a").max_concurrency == 4
    assert fleet.node("b").max_concurrency is None  # the sum of its roles' slots
    with pytest.raises(FleetError, match=r"nodes\[0\]\.max_concurrency"):
        parse_fleet(
            "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64, max_concurrency: 0}\n"
        )


@pytest.mark.parametrize(
    ("key", "entry"),
    [
        ("models.m.path", "models:\n  m: {path: ~nosuchuserhere/m.gguf}\n"),
        ("models.m", "models:\n  m: ~nosuchuserhere/m.gguf\n"),
        ("model_roots[0]", "model_roots: [~nosuchuserhere/models]\n"),
    ],
)
def test_a_home_folder_of_no_user_is_a_fleet_error(tmp_path: Path, key: str, entry: str) -> None:
    """``~user`` with no such user: Path.expanduser raises RuntimeError, which the fuzzer
    found escaping the reader; it is a FleetError naming the field."""
    path = tmp_path / "fleet.yaml"
    path.write_text("nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n" + entry)
    with pytest.raises(FleetError) as raised:
        load_fleet(path)
    assert key in str(raised.value)
    assert "'~nosuchuserhere' names no user here" in str(raised.value)


def test_a_models_entry_may_say_what_a_stream_waiting_for_its_load_gets(tmp_path: Path) -> None:
    text = (
        "nodes:\n  - {name: a, memory_gb: 8, platform: linux-x86_64}\n"
        "models:\n  m: {path: x, load_progress: text}\n  n: y\n"
    )
    fleet = parse_fleet(text, file="fleet.yaml", base_dir=tmp_path)
    assert fleet.models["m"].load_progress == "text"
    assert fleet.models["n"].load_progress is None  # up's --load-progress
