"""The proxy (DESIGN.md layer 7): one raw ASGI app per OpenAI path, forwarding to a backend.

One request, top to bottom, is :class:`Proxy`, each step a method below its caller:

1. ``__call__``: read the body, resolve the role, answer errors in the path's envelope,
   count the request;
2. ``_serve``: cut the request's task at once when the client leaves or the lease is
   revoked (``RequestCut``); send it where its role is now when its node was lost before
   any byte (retry 4 of :mod:`~rosterd.router.retries`);
3. ``_serve_leased``: take a lease; a backend that could not be reached: another ready
   copy, or its restart (retries 2 and 3);
4. ``_forward_unless_revoked``: under the deadlines (:mod:`~rosterd.router.deadlines`,
   504 on a stall) and the progress check (:mod:`~rosterd.router.progress`);
5. ``_forward``: send (:func:`~rosterd.router.backend_requests.send_upstream`, once more
   on a fresh connection when the backend closed the pooled one unanswered: retry 1) and
   answer by kind: translated (``_forward_translated``), the backend's failure or refusal
   (``_backend_failed``, ``_backend_refused``), a plain answer whole
   (``_send_whole_answer``), or passed through chunk by chunk (``_pass_through``).

What goes to the client is :mod:`~rosterd.router.client_side`'s; the ``X-Rosterd-*``
headers :mod:`~rosterd.router.wait_report`'s; what a stream gets while its role loads
:mod:`~rosterd.router.load_progress`'s (a hook around step 3's lease, and step 5's head);
the first answer after a KV restore is judged by :mod:`~rosterd.router.restore_check`. The
upstream client is :class:`~rosterd.router.upstream.Upstream` (keep-alive HTTP/1.1 on
httptools).

A raw ASGI app rather than a Starlette endpoint, because it watches the client's
``http.disconnect`` while it serves: a client that leaves cancels the request at once,
which closes the upstream connection (llama-server stops generating and frees its slot)
and gives the lease back. Both cuts cancel the request's own task rather than racing it
against a second task with ``asyncio.wait``: one helper task per request and no extra
scheduling round keep the router's added latency a fraction of a millisecond. Errors are
:class:`RouterError` values, mapped in ``openai_errors`` at the ``with`` blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from rosterd.errors import ClientGoneError, RouterError, StalledError
from rosterd.metrics import RosterdMetrics
from rosterd.replica_choice import prefix_key
from rosterd.router.backend_requests import prompt_tokens, send_upstream
from rosterd.router.body import parse_json_object, read_body, requested_model
from rosterd.router.client_side import (
    ANSWER_TAIL_BYTES,
    END_OF_BODY,
    ClientAnswer,
    CutReason,
    RequestCut,
    pass_body,
    send_whole,
    wait_disconnect,
)
from rosterd.router.deadlines import (
    Deadlines,
    first_byte_deadline_s,
    forward_within_deadlines,
    stalled_error,
)
from rosterd.router.dialects.envelope import STREAM_ENDS, envelope_for
from rosterd.router.dialects.paths import check_dialect, forward_in_dialect
from rosterd.router.history import History, generated_tokens
from rosterd.router.key_turns import Turns
from rosterd.router.load_progress import LoadProgress, continue_stream, wants_progress
from rosterd.router.model_echo import ModelEcho
from rosterd.router.openai_errors import (
    revoked_error,
    scheduler_errors,
    upstream_errors,
    upstream_status_error,
)
from rosterd.router.progress import Vouch, watched
from rosterd.router.request_counts import RequestCounts
from rosterd.router.restore_check import RestoreChecks
from rosterd.router.retries import RETRIES, backend_unreachable, may_resend
from rosterd.router.routing import (
    DIALECT_PATHS,
    NODE_SCOPE,
    PROXIED_PATHS,
    ROLE_SCOPE,
    ModelNames,
    RoleRoute,
    RouterConfig,
)
from rosterd.router.speeds import RoleSpeeds
from rosterd.router.stream_repair import StreamRepair
from rosterd.router.upstream import Upstream, UpstreamResponse
from rosterd.router.usage_hook import KeyUsage
from rosterd.router.validation import check_request, refusal_text
from rosterd.router.wait_report import wait_headers
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.values import Revocation

log = logging.getLogger("rosterd.router")

#: nginx's "client closed request": the status counted in metrics for a client that left.
CLIENT_CLOSED_STATUS = 499

#: A plain (not event-stream) answer up to this size that declares its ``Content-Length`` is
#: read whole and sent in one message with that length, bytes; a bigger one, or one
#: without a length, is passed through chunk by chunk.
WHOLE_ANSWER_MAX_BYTES = 8 * 2**20

#: The headers rosterd adds to an answer (``wait_report``), as ASGI pairs.
Told = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class ProxyContext:
    """What every proxied path shares: the scheduler that grants leases, the routes and
    names, the limits, the metrics, the upstream client, the charts' history, the
    checks of restored KV caches (``restore_check``: the first answer after each) and
    each role's measured speeds (``speeds``: what first-byte deadlines follow from)."""

    scheduler: NodeDirectory
    routes: Mapping[str, RoleRoute]
    names: ModelNames
    config: RouterConfig
    metrics: RosterdMetrics
    upstream: Upstream
    history: History
    restores: RestoreChecks = field(default_factory=RestoreChecks)
    usage: KeyUsage | None = None
    turns: Turns = field(default_factory=Turns)
    speeds: RoleSpeeds = field(default_factory=RoleSpeeds)


class Proxy:
    """The raw ASGI app behind one proxied path: the body goes to the backend's ``path``.

    Counts every request in ``rosterd_requests_total`` (by role, endpoint and
    status; 499 for a client that left) and its duration. ``label`` is the
    metrics' ``endpoint`` (default: the path's in ``PROXIED_PATHS``; another
    dialect's routes, such as Ollama's, give their own and may name a backend
    path of their own).
    """

    def __init__(self, ctx: ProxyContext, path: str, *, label: str | None = None) -> None:
        self.ctx = ctx
        self.path = path
        self.label = label if label is not None else PROXIED_PATHS[path]
        # What a backend's 501 is about, for its hint (an Ollama embed is embeddings).
        self.served_label = PROXIED_PATHS.get(path, self.label)
        self.dialect = DIALECT_PATHS.get(path)
        self.envelope = envelope_for(path)
        self.stream_ends = STREAM_ENDS.get(path, (b"data: [DONE]",))
        # count_tokens answers a prompt's length (input_tokens) but serves nothing: no
        # tokens used.
        self.counted = RequestCounts(
            ctx.metrics, ctx.history, ctx.usage, self.label, says_usage=self.label != "count_tokens"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        role = "-"
        answer = ClientAnswer(send)
        try:
            config = self.ctx.config
            body = await read_body(
                scope, receive, config.max_body_bytes, timeout_s=config.request_read_timeout_s
            )
            payload = parse_json_object(body)
            role = self.ctx.names.resolve(requested_model(payload))
            route = self.ctx.routes[role]
            # The access log's role and node for an answer refused before a lease (its
            # copies' nodes: which one would have served it is not chosen yet).
            scope[ROLE_SCOPE], scope[NODE_SCOPE] = role, self.ctx.scheduler.node_names(role)
            if self.dialect is not None:
                # Before any load: a request the role's backend cannot take fails at once.
                check_dialect(self.path, route, payload)
            # What the dialect's own API refuses never reaches the backend (validation).
            check_request(self.path, payload, ctx_size=route.ctx_size)
            await self._serve(role, payload, receive, answer)
        except ClientGoneError:
            answer.status = CLIENT_CLOSED_STATUS
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when the drain time at
            # shutdown is over. End the response so the client can tell it was cut
            # (a 503, or an SSE error event if a stream had started); not re-raised,
            # since the response is then complete and uvicorn has nothing left to do.
            with contextlib.suppress(Exception):
                if answer.status == 0:
                    err = RouterError("shutting_down", "rosterd is shutting down")
                    await self.envelope.response(err)(scope, receive, answer.send)
                elif answer.sse_open:
                    err = RouterError(
                        "shutting_down",
                        f"the stream from role {role!r} was cut: rosterd is shutting down "
                        "and the drain time is over",
                    )
                    await answer.send(self.envelope.sse_event(err))
        except RouterError as err:
            if answer.sse_open:  # the head went with load progress: the error ends the stream
                await answer.send(self.envelope.sse_event(err))
            else:
                await self.envelope.response(err)(scope, receive, answer.send)
        except Exception as exc:
            log.exception("unhandled error on %s", self.path)
            if answer.status:
                raise  # the answer started: uvicorn closes the connection
            internal = RouterError("internal_error", f"internal error: {exc}")
            await self.envelope.response(internal)(scope, receive, answer.send)
        finally:
            self.counted.done(role, answer, time.perf_counter() - started)

    async def _serve(
        self, role: str, payload: dict[str, Any], receive: Receive, answer: ClientAnswer
    ) -> None:
        """Serve the request (:meth:`_serve_leased`); cut it at once if the client leaves
        (:class:`ClientGoneError`) or the scheduler revokes its lease (:meth:`_after_cut`)."""
        task = asyncio.current_task()
        assert task is not None
        cut = RequestCut(task, answer)
        watcher = asyncio.get_running_loop().create_task(wait_disconnect(receive))
        watcher.add_done_callback(cut.client_left)
        try:
            for resends in itertools.count():
                try:
                    await self._serve_leased(role, payload, answer, cut)
                    return
                except asyncio.CancelledError:
                    if cut.why is None:
                        raise  # not ours: uvicorn's, at the end of the drain time
                    task.uncancel()
                    why = cut.why
                    if may_resend(why, answer.status) and resends < RETRIES.resends:
                        # Its backend vanished with its node before answering a byte: the
                        # request ran nowhere to its end; send it where the role is now.
                        log.info("resending a %s request to %s: %s", self.label, role, why)
                        cut.why = None
                        continue
                    await self._after_cut(role, why, answer)
                    return
        finally:
            cut.armed = False
            watcher.remove_done_callback(cut.client_left)
            watcher.cancel()

    async def _serve_leased(
        self, role: str, payload: dict[str, Any], answer: ClientAnswer, cut: RequestCut
    ) -> None:
        """Take a lease, forward, give the lease back; when the backend could not be reached
        and nothing was sent yet, send the request to another ready copy of the role
        (replicas, ``RETRIES.other_copy`` times), else wait for its restart (a lease of a
        newer generation) and forward again, ``RETRIES.restart_waits`` times.

        The copy is chosen by the request's prefix (``rosterd.replica_choice``), so the
        turns of one conversation find their KV cache."""
        scheduler = self.ctx.scheduler
        prefix = prefix_key(payload) if len(scheduler.copy_keys(role)) > 1 else None
        asked_at = time.time()
        with scheduler_errors():
            async with self._load_progress(role, payload, answer):  # bytes while it loads
                lease = await self.ctx.turns.acquire(  # a batch key's after interactive work
                    role,
                    self.ctx.turns.class_of(scheduler.node_of(role).specs[role].latency_class),
                    lambda: scheduler.acquire(role, prefix=prefix),
                    scheduler.release,
                )
        self.ctx.history.request_granted(role, lease.waited_s)
        answer.waited_s = lease.waited_s
        self.ctx.metrics.copy_requests.labels(node=lease.copy_key, role=role).inc()
        waits = other_copies = 0
        failover = False
        while True:
            try:
                await self._forward_unless_revoked(lease, payload, answer, cut, asked_at)
                return
            except RouterError as err:
                if waits >= RETRIES.restart_waits or not backend_unreachable(err):
                    raise
                # Nothing was sent to the client and the backend never answered: wait for
                # the supervisor's restart (a newer generation) rather than a dead port.
                waits += 1
                failover = other_copies < RETRIES.other_copy and scheduler.other_copy_ready(
                    role, lease.copy_key
                )
                then = "sent to another copy" if failover else "waiting for its restart"
                log.info("backend of %s on %s unreachable (%s); %s", role, lease.node, err, then)
            finally:
                scheduler.release(lease)
            if failover:
                other_copies += 1  # then a dead copy again means waiting for a restart
                with scheduler_errors():
                    lease = await scheduler.acquire(role, prefix=prefix, avoid={lease.copy_key})
                self.ctx.metrics.copy_requests.labels(node=lease.copy_key, role=role).inc()
                continue
            with scheduler_errors():
                lease = await scheduler.acquire(
                    role, newer_than=lease.generation, on_node=lease.copy_key
                )

    def _load_progress(
        self, role: str, payload: dict[str, Any], answer: ClientAnswer
    ) -> contextlib.AbstractAsyncContextManager[object]:
        """The load progress of a streamed request (:mod:`~rosterd.router.load_progress`);
        nothing for other requests, or on another dialect's routes (Ollama's give a
        ``label``, and their NDJSON has no line a client would skip)."""
        mode = self.ctx.routes[role].load_progress or self.ctx.config.load_progress
        if self.label != PROXIED_PATHS.get(self.path) or not wants_progress(
            self.path, payload, mode
        ):
            return contextlib.nullcontext()
        model = str(payload.get("model", role))
        return LoadProgress(self.ctx.scheduler, role, answer, self.path, mode, model)

    async def _forward_unless_revoked(
        self,
        lease: Lease,
        payload: dict[str, Any],
        answer: ClientAnswer,
        cut: RequestCut,
        asked_at: float,
    ) -> None:
        """Forward under the deadlines, cut at once if the scheduler revokes the lease.

        The scheduler revokes the leases of a role it stops with requests still in
        flight (evicted after ``--drain``, unloaded, shutdown, found unhealthy):
        ``cut`` cancels the request's task, which closes the upstream request
        (llama-server keeps an open stream going through SIGTERM), and the client
        gets the reason (:meth:`_after_cut`). A backend that stalls is reported
        to the scheduler (``NodeDirectory.suspect``), which probes the role, and the
        request ends with 504 ``backend_timeout`` (or an SSE error event); a request
        that stalls while the progress check sees its backend move stalled alone: it
        ends with 504 and its role is left serving the others.
        """
        revoked = lease.revoked
        if revoked is not None:
            revoked.add_done_callback(cut.revoked)
        config, route = self.ctx.config, self.ctx.routes[lease.role]
        resident = route.info.get("resident_bytes")
        speeds = self.ctx.speeds.of(lease.role, resident if isinstance(resident, int) else 0)
        cap_s = config.first_byte_timeout_s
        first_byte_s = first_byte_deadline_s(payload, speeds, config.first_byte_rule, cap_s)
        deadlines = Deadlines(first_byte_s, config.chunk_timeout_s, cap_s)
        # A backend whose progress the check reads may take up to the cap (it is watched).
        can_tell = route.progress is not None and math.isfinite(config.progress_check.after_s)
        vouch = Vouch() if can_tell else Vouch.never()
        node = self.ctx.scheduler.nodes.get(lease.node)
        told = wait_headers(
            lease,
            asked_at,
            node.events if node is not None else (),
            node.specs if node is not None else {},
        )
        try:
            took_s = await forward_within_deadlines(
                watched(  # the progress check, for a backend that can tell (else as given)
                    lambda out: self._forward(lease, payload, out, answer, told),
                    probe=route.progress,
                    base_url=lease.endpoint.base_url,
                    check=config.progress_check,
                    on_wedged=lambda why: self.ctx.scheduler.suspect(lease, why, wedged=True),
                    vouch=vouch,
                ),
                answer.send,
                deadlines,
                lease.role,
                vouched=vouch,
            )
            if answer.status == 200:
                streamed = bool(payload.get("stream"))
                self.ctx.speeds.answered(lease.role, answer.tail, took_s, streamed)
        except StalledError as stall:
            log.warning("ended a %s request to %s: %s", self.label, lease.role, stall)
            # The progress check read the backend's counters long enough to judge it and
            # found it moving: this request stalled alone; the others on it keep going.
            judged_s = config.progress_check.after_s + config.progress_check.window_s
            alone = vouch() and stall.waited_s >= judged_s
            if not alone:
                self.ctx.scheduler.suspect(lease, str(stall))
            await answer.end_with(stalled_error(stall, alone=alone), self.envelope.sse_event)
        finally:
            if revoked is not None:
                revoked.remove_done_callback(cut.revoked)

    async def _after_cut(self, role: str, why: CutReason, answer: ClientAnswer) -> None:
        if not isinstance(why, Revocation):
            log.info("client left a %s request to %s; upstream closed", self.label, role)
            raise ClientGoneError(f"the client left its {self.label} request to {role}")
        err = revoked_error(why)
        log.info("ended a %s request to %s: %s", self.label, role, err.message)
        await answer.end_with(err, self.envelope.sse_event)

    async def _forward(
        self,
        lease: Lease,
        payload: dict[str, Any],
        send: Send,
        answer: ClientAnswer,
        told: Told,
    ) -> None:
        """Send the request to ``lease``'s backend and pass its answer through to ``send``
        with the ``told`` headers added (``wait_report``) and the ``model`` asked for
        (``model_echo``), by kind of answer (step 5); ``answer.tokens``: what it generated.
        Raises :class:`RouterError` 502 ``backend_error`` while nothing was
        sent to the client yet; once the answer started, a failure or a stream
        that ends without ``data: [DONE]`` ends it with an SSE error event.
        """
        role, route = lease.role, self.ctx.routes[lease.role]
        if answer.status:  # only load progress is sent before the backend answers
            send = continue_stream(send, self.envelope)
        send = ModelEcho.wrap(send, self.path, payload, lease.endpoint.served_model)
        if self.dialect is not None and self.dialect not in route.native:
            answer.tail = await self._forward_translated(lease, payload, send, told)
            answer.tokens = generated_tokens(answer.tail)
            return
        served, base_url = lease.endpoint.served_model, lease.endpoint.base_url
        body = json.dumps(
            route.rewrite(payload, served),
            ensure_ascii=False,
            separators=(",", ":"),
            allow_nan=False,
        ).encode()
        # llama-server may leave out a stream's opening events: put back, for the SDKs.
        count = functools.partial(prompt_tokens, self.ctx.upstream, base_url, body, role)
        send = StreamRepair.wrap(send, self.path, payload, served, count)
        accept = "text/event-stream" if payload.get("stream") else "application/json"
        with upstream_errors(role):
            upstream = await send_upstream(
                self.ctx.upstream, base_url, self.path, body, accept, role
            )
        try:
            stream = _content_type(upstream).startswith("text/event-stream")
            length = upstream.content_length
            if upstream.status >= 500:
                await self._backend_failed(role, upstream)
            elif upstream.status >= 400 and not stream:
                await self._backend_refused(role, upstream, send, told)
            elif not stream and length is not None and length <= WHOLE_ANSWER_MAX_BYTES:
                await self._send_whole_answer(lease, upstream, send, answer, told)
            else:
                await self._pass_through(lease, upstream, send, answer, told)
                if isinstance(send, StreamRepair):  # the usage reads the prompt there
                    answer.head = send.rebuilt_start + answer.head
        finally:
            # Back to the pool when the answer was read to its end; on a cut (the client
            # left, the lease was revoked) or a failure the connection is closed.
            upstream.close()

    async def _forward_translated(
        self, lease: Lease, payload: dict[str, Any], send: Send, told: Told
    ) -> bytes:
        """A request in a dialect the role's backend does not speak: translated to its chat
        route and back (``rosterd.router.dialects``), with rosterd's ``told`` headers;
        returns the chat answer's last bytes (where its usage is)."""
        role = lease.role
        base_url = lease.endpoint.base_url

        async def post(path: str, body: bytes, accept: str) -> UpstreamResponse:
            return await send_upstream(self.ctx.upstream, base_url, path, body, accept, role)

        async def send_told(message: Message) -> None:
            # The translated answer carries rosterd's headers (role, node, wait) too.
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *told]}
            await send(message)

        route, model = self.ctx.routes[role], lease.endpoint.served_model
        return await forward_in_dialect(
            self.path, route, payload, model, post, send_told, self.label
        )

    async def _backend_failed(self, role: str, upstream: UpstreamResponse) -> None:
        """The backend answered 5xx: its text, as the path's 502 (or the 5xx it maps to).

        Raises:
            RouterError: always (``upstream_status_error``).
        """
        with upstream_errors(role):
            text = (await upstream.read()).decode(errors="replace")
        raise upstream_status_error(role, upstream.status, text, endpoint=self.served_label)

    async def _backend_refused(
        self, role: str, upstream: UpstreamResponse, send: Send, told: Told
    ) -> None:
        """The backend's own refusal (4xx, not a stream; llama-server's envelope has an
        integer code and no param), in the shape the path's clients read, its status kept."""
        with upstream_errors(role):
            raw = await upstream.read()
        # A prompt longer than the context also says which setting to raise.
        text = refusal_text(role, self.ctx.routes[role].ctx_size, raw)
        whole = self.envelope.status_body(upstream.status, text)
        await send_whole(send, upstream.status, "application/json", whole, told)

    async def _send_whole_answer(
        self, lease: Lease, upstream: UpstreamResponse, send: Send, answer: ClientAnswer, told: Told
    ) -> None:
        """A plain answer that declares a length up to ``WHOLE_ANSWER_MAX_BYTES``: read
        whole, sent in one message; its end is judged after a KV restore."""
        with upstream_errors(lease.role):
            whole = await upstream.read()
        answer.tail = whole[-ANSWER_TAIL_BYTES:]
        answer.tokens = generated_tokens(answer.tail)
        self.ctx.restores.answered(lease, upstream.status, answer.tail)
        await send_whole(send, upstream.status, _content_type(upstream), whole, told)

    async def _pass_through(
        self, lease: Lease, upstream: UpstreamResponse, send: Send, answer: ClientAnswer, told: Told
    ) -> None:
        """An event stream, or a plain answer too big or without a length: passed on chunk
        by chunk. A failure once the headers are out, or a stream that ends without its
        final event, ends it with the path's SSE error event."""
        role = lease.role
        content_type = _content_type(upstream)
        stream = content_type.startswith("text/event-stream")
        headers_out = [(b"content-type", content_type.encode()), *told]
        if stream:
            headers_out += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        await send(
            {"type": "http.response.start", "status": upstream.status, "headers": headers_out}
        )
        try:
            with upstream_errors(role, mid_stream=True):
                finished, answer.head, tail = await pass_body(
                    upstream, send, self.stream_ends, on_end=answer.mark_ended
                )
                answer.tokens = generated_tokens(tail)
                answer.tail = tail
        except RouterError as err:
            # Headers are out: end the answer with an SSE error event the client can see.
            with contextlib.suppress(Exception):
                await send(self.envelope.sse_event(err))
            return
        if stream and not finished:
            # The backend closed the stream without its final event: it was
            # stopped (evicted after the drain time, or it died) mid-generation.
            cut = RouterError(
                "backend_error",
                f"the stream from role {role!r} ended before it finished: "
                "its backend stopped (evicted after the drain time, or it exited)",
            )
            await send(self.envelope.sse_event(cut))
            return
        self.ctx.restores.answered(lease, upstream.status, tail)
        await send(END_OF_BODY)


def _content_type(upstream: UpstreamResponse) -> str:
    """The answer's content type (a backend that names none answers JSON)."""
    return upstream.content_type or "application/json"
