"""``rosterd up``: serve the roster (layer 8). The command parses its options into an
:class:`~rosterd.up.runtime.UpOptions` and runs :func:`~rosterd.up.runtime.run_up`.

``rosterd up ROSTER [--overlay F] [--fleet F] [--host H] [--port P]`` imports
the roster, plans it on the fleet (printing the plan), starts the supervisor on
this machine, loads the interactive and sticky roles that fit without evicting
anything (showing each load as it happens), and serves the router (every role on one
port, in the OpenAI, Anthropic, Responses and Ollama dialects) until Ctrl-C or SIGTERM;
then it lets in-flight requests finish (up to ``--drain``) and stops every backend it
started. SIGHUP, ``rosterd reload`` and, with ``--watch``, a change of the roster,
overlay, fleet or keys file reload them without a restart (:mod:`rosterd.up.files`).
Without Ray, nodes of the fleet whose address is not this machine are planned but not
started here (it says so). With ``--ray-address HOST:PORT`` (or ``RAY_ADDRESS``) it
joins that Ray cluster and runs every fleet node a live Ray node matches by address
(:mod:`rosterd.ray_match`) through that node's agent
(:mod:`rosterd.up.fleet_effects`); a node with none is reported not connected and its
roles are planned on the others.

Exit status (decided by :mod:`rosterd.cli.edge`): 0 after a clean stop (Ctrl-C or
SIGTERM at any moment once the plan is made; a second one while stopping only says
so), 130 after a Ctrl-C before the plan was made (nothing started), 2 on bad
input (roster, overlay, fleet, an empty API key, port in use, a locked state
folder). The runtime (uvicorn, the scheduler, the solver) is imported only when
``up`` runs, so that the other commands start at once.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

import typer

from rosterd.cli import app, make_console
from rosterd.cli.edge import show_tracebacks
from rosterd.errors import OptionError
from rosterd.up.defaults import DEFAULT_HOST, DEFAULT_PORT


def check_api_keys(given: Iterable[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The API keys to require, from ``--api-key`` values (``given``) or ``ROSTERD_API_KEY``.

    Raises:
        OptionError: a key is empty or blank, given as an option or as
            ``ROSTERD_API_KEY`` (an empty key must not silently turn auth off).
    """
    keys = tuple(given)
    if any(not k.strip() for k in keys):
        raise OptionError(
            "--api-key is empty; an empty key would leave the server open to anyone. "
            "Give a non-empty key, or leave --api-key out to serve without keys"
        )
    env = environ.get("ROSTERD_API_KEY")
    if not keys and env is not None and not env.strip():
        raise OptionError(
            "ROSTERD_API_KEY is set but empty; an empty key would leave the server open to "
            "anyone. Set it to a non-empty key, or unset it to serve without keys"
        )
    return keys


def check_cors_origins(given: Iterable[str]) -> tuple[str, ...]:
    """The ``--cors-origin`` values, each ``*`` or ``scheme://host[:port]`` as a browser
    sends it in ``Origin``.

    Raises:
        OptionError: a value is not an origin (a path, a query, no scheme, blank).
    """
    import urllib.parse

    origins: list[str] = []
    for origin in given:
        if origin != "*":
            parts = urllib.parse.urlsplit(origin)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path
                or parts.query
                or parts.fragment
                or parts.username is not None
                or origin != origin.strip()
            ):
                raise OptionError(
                    f"--cors-origin {origin!r} is not an origin; give it as a browser sends it, "
                    "such as https://notebook.lab:8888 (scheme, host, port; no path), or *"
                )
        origins.append(origin)
    return tuple(dict.fromkeys(origins))


def _configure_logging(verbose: bool) -> None:
    """Plain timestamped lines on stderr: rosterd's own at INFO (``-v``: DEBUG), others WARNING.

    The scheduler logs every load and eviction with its cause at INFO, so an
    operator sees them without ``-v``; plain lines (not Rich) stay readable
    when redirected to a file.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("rosterd").setLevel(logging.DEBUG if verbose else logging.INFO)


@app.command("up")
def up_cmd(
    ctx: typer.Context,
    roster_path: Annotated[Path, typer.Argument(metavar="ROSTER", help="The roster YAML file.")],
    overlay: Annotated[Path | None, typer.Option(help="Overlay YAML (excludes, …).")] = None,
    fleet_path: Annotated[
        Path | None, typer.Option("--fleet", help="Fleet YAML (default: this machine).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            envvar="ROSTERD_API_KEY",
            help="Require KEY, as 'Authorization: Bearer KEY' or 'x-api-key: KEY' (repeat for "
            "several keys).",
        ),
    ] = None,
    keys_path: Annotated[
        Path | None,
        typer.Option(
            "--keys",
            metavar="FILE",
            help="Keys file: each key's scopes, models, priority and limits "
            "(`rosterd keys add`; reloaded as the other files are).",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="Backend logs and pid records (default: XDG state dir).")
    ] = None,
    idle_ttl: Annotated[
        float,
        typer.Option(
            min=0, help="Unload idle non-sticky batch roles after this many seconds (0: never)."
        ),
    ] = 600.0,
    min_busy_residency: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds a just-loaded role that has work is safe from the batch role it "
            "evicted (an idle one yields at once).",
        ),
    ] = 10.0,
    min_residency: Annotated[
        float | None,
        typer.Option(min=0, help="Deprecated name of --min-busy-residency."),
    ] = None,
    max_wait: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Seconds a request may wait for its turn while a role it cannot be "
            "resident with serves its queue.",
        ),
    ] = 30.0,
    drain: Annotated[
        float, typer.Option(min=0, help="Seconds to let in-flight requests finish before evicting.")
    ] = 30.0,
    queue_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a request may wait for its role (then 503).")
    ] = 300.0,
    max_queue: Annotated[
        int, typer.Option(min=1, help="Waiting requests per role (then 429).")
    ] = 64,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Requests per role at once.")] = 4,
    grace: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds between SIGTERM and SIGKILL (a fleet models: entry's grace_s wins).",
        ),
    ] = 10.0,
    probe_interval: Annotated[
        float,
        typer.Option(
            min=0, help="Probe an idle role's generation after this many seconds (0: never)."
        ),
    ] = 30.0,
    kv_disk_gb: Annotated[
        float,
        typer.Option(
            min=0,
            help="GiB of disk the kept KV caches of llama.cpp roles may take on each "
            "machine (with a Ray fleet, on every node agent's too; the least recently "
            "used go first).",
        ),
    ] = 10.0,
    probe_timeout: Annotated[
        float,
        typer.Option(min=0.001, help="Seconds a generation probe may take (then: unhealthy)."),
    ] = 20.0,
    first_byte_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="The longest a request may wait for its first byte, seconds; its own deadline "
            "follows from its prompt's size and its role's measured speed, at least 20 s "
            "(then 504 and a probe).",
        ),
    ] = 300.0,
    progress_check_after: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds without a byte before a llama-server role is asked its /slots "
            "(no answer within 5 s, or no progress: unhealthy, restarted; 0: never).",
        ),
    ] = 15.0,
    progress_window: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Seconds of unchanged /slots counters that mean no progress, for a quiet "
            "request and for a generation probe that got no answer "
            "(wider than one batch of prompt processing).",
        ),
    ] = 45.0,
    chunk_timeout: Annotated[
        float,
        typer.Option(
            min=0.001, help="Seconds a stream may wait between chunks (then an error and a probe)."
        ),
    ] = 120.0,
    request_read_timeout: Annotated[
        float,
        typer.Option(min=0.001, help="Seconds a client may take to send headers and body."),
    ] = 30.0,
    max_body: Annotated[
        int, typer.Option(min=1, help="Largest request body in bytes (then 413).")
    ] = 8 * 2**20,
    auto_backend_ports: Annotated[
        bool, typer.Option(help="Let the OS choose backend ports instead of the roster's.")
    ] = False,
    warm_up: Annotated[
        bool, typer.Option(help="Load interactive and sticky roles that fit at start.")
    ] = True,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            metavar="ORIGIN",
            help="Let pages from ORIGIN call the API (CORS; repeatable; * for any). Default: none.",
        ),
    ] = None,
    history_interval: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="Seconds between two points of the page's charts (360 are kept: 1 h at 10 s).",
        ),
    ] = 10.0,
    load_progress: Annotated[
        str,
        typer.Option(
            "--load-progress",
            metavar="ping|text|off",
            help="What a streamed request waiting for its role's load gets at once and every "
            "3 s: ping (SSE comments; Anthropic's ping events), text (also the progress as "
            "reasoning text in chat completions, as chat UIs show thinking) or off.",
        ),
    ] = "ping",
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Reload when the roster, overlay, fleet or keys file changes (SIGHUP too).",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="Run the fleet's nodes on the Ray cluster at HOST:PORT (default: $RAY_ADDRESS; "
            "neither: this machine only). Needs the ray extra: pip install '.[ray]' in "
            "rosterd's checkout.",
        ),
    ] = None,
    ray_join_timeout: Annotated[
        float,
        typer.Option(
            min=0.001, help="Seconds joining the Ray cluster may take (then exit 2 saying so)."
        ),
    ] = 30.0,
    access_log_format: Annotated[
        str,
        typer.Option(
            "--access-log-format",
            metavar="plain|json",
            help="The access log's form, one line per request on this output and in "
            "<state-dir>/logs/access.log: key=value pairs, or one JSON object.",
        ),
    ] = "plain",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Plan the roster on the fleet, start what must be resident, serve every role on one port.

    One port speaks every dialect: OpenAI (chat, completions, embeddings, Responses),
    Anthropic Messages, Ollama's /api/* and rerank, with the live page at /.
    """
    if verbose:
        show_tracebacks(ctx)
    _configure_logging(verbose)
    # Imported here: the router (Starlette) loads only when up runs.
    from rosterd.cli.access_setup import ACCESS_LOG_FORMATS, install_access_log
    from rosterd.supervisor.run_records import default_state_dir

    if access_log_format not in ACCESS_LOG_FORMATS:
        raise OptionError(f"--access-log-format {access_log_format!r}: expected plain or json")
    access_path = (state_dir or default_state_dir()) / "logs" / "access.log"
    install_access_log(access_log_format, access_path, sys.stderr)
    if not 1 <= port <= 65535:
        raise OptionError(f"--port {port} is not a usable port (1..65535)")
    from rosterd.router.routing import LoadProgressMode

    try:
        progress_mode = LoadProgressMode(load_progress)
    except ValueError:
        raise OptionError(
            f"--load-progress {load_progress!r}: expected ping, text or off"
        ) from None
    keys = check_api_keys(api_key or [], os.environ)
    if min_residency is not None:
        # The old name said "residency" though it holds only a role with work (issue 22).
        make_console(stderr=True).print(
            "warning: --min-residency is deprecated; use --min-busy-residency", style="yellow"
        )
        min_busy_residency = min_residency
    origins = check_cors_origins(cors_origin or [])
    # The runtime (uvicorn, the scheduler, OR-Tools) only now: other commands never load it.
    from rosterd.ray_cluster import ray_address as ray_address_of  # imports no Ray
    from rosterd.router.progress import ProgressCheck  # imports httpx: only when up runs
    from rosterd.scheduler.values import SchedulerLimits
    from rosterd.up.runtime import UpOptions, run_up

    options = UpOptions(
        roster_path=roster_path,
        overlay_path=overlay,
        fleet_path=fleet_path,
        host=host,
        port=port,
        api_keys=keys,
        keys_path=keys_path,
        state_dir=state_dir,
        limits=SchedulerLimits(
            max_concurrency=max_concurrency,
            max_queue=max_queue,
            queue_timeout_s=queue_timeout,
            drain_s=drain,
            idle_ttl_s=idle_ttl if idle_ttl > 0 else float("inf"),
            min_busy_residency_s=min_busy_residency,
            max_wait_s=max_wait,
            probe_interval_s=probe_interval if probe_interval > 0 else float("inf"),
            probe_timeout_s=probe_timeout,
            probe_busy_window_s=progress_window,
        ),
        grace_s=grace,
        first_byte_timeout_s=first_byte_timeout,
        progress_check=ProgressCheck(
            after_s=progress_check_after if progress_check_after > 0 else float("inf"),
            window_s=progress_window,
        ),
        chunk_timeout_s=chunk_timeout,
        request_read_timeout_s=request_read_timeout,
        kv_disk_bytes=int(kv_disk_gb * 2**30),
        max_body_bytes=max_body,
        auto_backend_ports=auto_backend_ports,
        warm_up=warm_up,
        cors_origins=origins,
        history_interval_s=history_interval,
        load_progress=progress_mode,
        watch=watch,
        ray_address=ray_address_of(ray_address, os.environ),
        ray_join_timeout_s=ray_join_timeout,
    )
    from rosterd.cli.up_report import ConsoleReporter

    run_up(options, ConsoleReporter(make_console(), make_console(stderr=True)))
