"""Coverage-guided fuzz targets (atheris, libFuzzer's engine) for rosterd's readers of untrusted
input: the roster, the overlay, the fleet file and the router's request body.

    python tests/support/fuzz_targets.py TARGET [CORPUS_DIR ...] [-runs=N] [-max_total_time=S] ...

``TARGET`` is one of ``roster``, ``overlay``, ``fleet``, ``body``; the other
arguments are libFuzzer's. Each input must either be accepted or raise one of
rosterd's own errors (a ``rosterd.errors.RosterdError`` subclass): anything else
escapes, and libFuzzer reports it as a crash (exit code non-zero, the input saved
under ``-artifact_prefix``). tests/reliability/test_reliability_fuzz.py runs each target for a
bounded number of inputs; ``--long-reliability`` runs more.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["rosterd"]):
    from rosterd.errors import RosterdError
    from rosterd.fleet.reader import parse_fleet
    from rosterd.roster.importer import import_roster
    from rosterd.roster.overlay import RosterOverlay
    from rosterd.router.body import parse_json_object, read_body, requested_model


def fuzz_roster(data: bytes) -> None:
    """The roster import, as ``rosterd up`` and ``rosterd roster import`` read a file."""
    with contextlib.suppress(RosterdError):
        import_roster(data, file="roster.yaml")


def fuzz_overlay(data: bytes) -> None:
    """The overlay reader."""
    with contextlib.suppress(RosterdError):
        RosterOverlay.from_yaml(data, file="overlay.yaml")


def fuzz_fleet(data: bytes) -> None:
    """The fleet reader (relative paths anchored at a folder that need not exist)."""
    with contextlib.suppress(RosterdError):
        parse_fleet(data, file="fleet.yaml", base_dir=Path("/nonexistent-fleet-base"))


def fuzz_body(data: bytes) -> None:
    """The router's body reading and parsing: a declared Content-Length, the body in
    chunks (or a disconnect), then the strict JSON object and its ``model``."""
    provider = atheris.FuzzedDataProvider(data)
    limit_bytes = provider.ConsumeIntInRange(0, 4096)
    headers: list[tuple[bytes, bytes]] = []
    if provider.ConsumeBool():
        headers.append((b"content-length", provider.ConsumeBytes(provider.ConsumeIntInRange(0, 8))))
    chunks = [provider.ConsumeBytes(provider.ConsumeIntInRange(0, 512)) for _ in range(3)]
    disconnect = provider.ConsumeBool()
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    if disconnect:
        messages[-1] = {"type": "http.disconnect"}

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    body = b"".join(chunks)
    try:
        # The fake receive never suspends, so the coroutine ends on its first step.
        coro = read_body({"type": "http", "headers": headers}, receive, limit_bytes)
        try:
            coro.send(None)
        except StopIteration as done:
            body = done.value
        else:
            raise AssertionError("read_body suspended on a receive that never waits")
    except RosterdError:  # incl. ClientGoneError, the disconnect
        pass
    with contextlib.suppress(RosterdError):
        requested_model(parse_json_object(body))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "roster": fuzz_roster,
    "overlay": fuzz_overlay,
    "fleet": fuzz_fleet,
    "body": fuzz_body,
}


def main(argv: list[str]) -> None:
    """Run ``argv[1]``'s target under libFuzzer with the rest of ``argv`` as its flags."""
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
