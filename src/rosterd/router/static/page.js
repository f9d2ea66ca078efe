// rosterd's live page: draws /status snapshots and scheduler events from one
// server-sent events stream (GET /rosterd/events/stream), read with fetch so that
// the API key goes in an Authorization header (EventSource cannot send one).
// No framework, no build step: every value is put in the page with textContent.
// charts.js (uPlot) and playground.js share this script's helpers and state.
"use strict";

const GIB = 2 ** 30;
const KEY_STORE = "rosterd.api-key";
const MAX_EVENTS = 200;
const MAX_LOG_CHARS = 400000;
const BUSY = new Set(["loading", "ready", "restarting", "stopping"]);

const state = {
  key: sessionStorage.getItem(KEY_STORE) || "",
  status: null,
  events: [],
  failures: {},     // role -> the last failure seen in the event log
  pending: {},      // role -> "load" | "unload" while its POST runs
  loads: {},        // role -> its load under way: {elapsed_s, expected_s} (event: loads)
  retryMs: 2000,
  log: null,        // {role, abort}
};

// ---- small helpers ---------------------------------------------------------------

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name === "style") Object.assign(node.style, value); // CSSOM: allowed by the CSP
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function gib(bytes) {
  if (typeof bytes !== "number") return "–";
  const value = bytes / GIB;
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

function age(seconds) {
  if (typeof seconds !== "number") return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function clock(at) {
  const d = new Date(at * 1000);
  return d.toLocaleTimeString([], { hour12: false });
}

function headers(extra) {
  const out = Object.assign({}, extra || {});
  if (state.key) out.Authorization = `Bearer ${state.key}`;
  return out;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return `HTTP ${response.status}`;
}

function notice(text, kind) {
  $("notice-text").textContent = text;
  $("notice").dataset.kind = kind || "error";
  $("notice").hidden = false;
}

function setConn(stateName, text) {
  const conn = $("conn");
  conn.dataset.state = stateName;
  conn.textContent = text || stateName;
}

// ---- the API key -----------------------------------------------------------------

function askKey(refused) {
  $("key-error").hidden = !refused;
  $("key-button").hidden = false;
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}

function keySubmitted(event) {
  event.preventDefault();
  state.key = $("key-input").value.trim();
  sessionStorage.setItem(KEY_STORE, state.key);
  $("key-dialog").close();
  connect();
}

// ---- the event stream ------------------------------------------------------------

let connection = null;

async function connect() {
  if (connection) connection.abort();
  const abort = new AbortController();
  connection = abort;
  setConn("connecting", "connecting");
  let response;
  try {
    response = await fetch("/rosterd/events/stream", {
      headers: headers({ Accept: "text/event-stream" }),
      cache: "no-store",
      signal: abort.signal,
    });
  } catch (_) {
    return reconnect(abort);
  }
  if (response.status === 401) {
    setConn("locked", "API key needed");
    askKey(Boolean(state.key));
    return;
  }
  if (!response.ok) {
    notice(`event stream: ${await errorMessage(response)}`);
    return reconnect(abort);
  }
  setConn("live", "live");
  loadHistory(); // the charts' past; the stream's `sample` events add to it
  startUsage(); // usage.js: the usage table, for a key that may read it
  try {
    await readEventBlocks(response, dispatch);
  } catch (_) { /* cut: reconnect below */ }
  reconnect(abort);
}

// Read an event-stream body to its end, calling onBlock with each event's lines (the text
// between two blank lines); the event stream and the playground's chat stream share it.
async function readEventBlocks(response, onBlock) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      onBlock(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
    }
  }
}

function reconnect(abort) {
  if (connection !== abort || abort.signal.aborted) return;
  setConn("down", "reconnecting");
  setTimeout(() => { if (connection === abort) connect(); }, state.retryMs);
}

function dispatch(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
    else if (field === "retry" && /^\d+$/.test(value)) state.retryMs = Number(value);
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join("\n"));
  if (name === "snapshot") {
    state.status = payload;
    render();
  } else if (name === "history") {
    state.events = payload.events.slice(-MAX_EVENTS);
    state.failures = {};
    state.events.forEach(noteFailure);
    renderEvents();
  } else if (name === "loads") {
    // The loads under way (rosterd.router.load_progress.loads_now): each role's progress bar.
    state.loads = Object.fromEntries(payload.loads.map((load) => [load.role, load]));
    for (const row of document.querySelectorAll("tr[data-role]")) showLoad(row, row.dataset.role);
  } else if (name === "sample") {
    appendSample(payload);
  } else if (name === "scheduler") {
    state.events.push(payload);
    if (state.events.length > MAX_EVENTS) state.events.shift();
    noteFailure(payload);
    renderEvents();
  }
}

const FAILURES = new Set(["load_failed", "restart_failed", "refused", "crashed"]);

function noteFailure(event) {
  if (FAILURES.has(event.kind)) state.failures[event.role] = event;
  else if (event.kind === "loaded" || event.kind === "restarted") delete state.failures[event.role];
}

// ---- drawing ----------------------------------------------------------------------

function roleNote(role, info) {
  if (info.unavailable_reason) return { text: info.unavailable_reason, kind: "error" };
  if (info.last_error) return { text: info.last_error, kind: "error" };
  if (info.waiting_reason) return { text: `waiting: ${info.waiting_reason}`, kind: "wait" };
  if (info.restart_pending) {
    return { text: "restarts once idle: a reload changed what it launches", kind: "wait" };
  }
  const failure = state.failures[role];
  if (failure) return { text: `${failure.kind.replace("_", " ")}: ${failure.cause}`, kind: "error" };
  // A role with replicas: this row is one copy; say where the others are.
  if (info.copies && info.copies.length > 1) {
    return { text: `one of ${info.copies.length} copies, on ${info.copies.join(", ")}`, kind: "" };
  }
  return { text: "", kind: "" };
}

function render() {
  const status = state.status;
  if (!status) return;
  const nodes = status.nodes || {};
  let roles = 0;
  let ready = 0;
  for (const node of Object.values(nodes)) {
    for (const info of Object.values(node.roles || {})) {
      roles += 1;
      if (info.phase === "ready") ready += 1;
    }
  }
  const up = typeof status.uptime_s === "number" ? ` · up ${age(status.uptime_s)}` : "";
  $("summary").textContent =
    `${Object.keys(nodes).length} node(s) · ${roles} role(s) · ${ready} ready${up}`;
  renderConfig(status.config);
  renderNodes(nodes);
  renderUnplaced(status.unplaced || [], status.remote_nodes || []);
  playgroundRoles(status);
}

function renderConfig(config) {
  // The files this rosterd serves and its last reload, as /status's `config` says them.
  const section = $("config");
  if (!config || typeof config !== "object") { section.hidden = true; return; }
  const list = $("config-list");
  list.replaceChildren();
  const row = (name, text, cls) => list.append(el("dt", { text: name }), el("dd", { class: cls, text }));
  const files = config.files || {};
  for (const kind of ["roster", "overlay", "fleet"]) {
    if (files[kind]) row(kind, files[kind]);
  }
  row("watch", config.watch ? "yes: reloads when the files change" : "no (rosterd reload, SIGHUP)");
  const at = config.last_reload_at;
  row("last reload", typeof at === "number" ? `${age(Date.now() / 1000 - at)} ago, at ${clock(at)}` : "none yet");
  if (config.last_change) row("what it changed", describeChange(config.last_change));
  const error = config.last_error;
  if (error) {
    const where = [error.file, error.line, error.column].filter((x) => x !== null && x !== undefined);
    const refused = typeof error.at === "number" ? ` (${age(Date.now() / 1000 - error.at)} ago)` : "";
    row("refused reload", `${where.length ? where.join(":") + ": " : ""}${error.message}${refused}`, "error");
  }
  section.hidden = false;
}

function describeChange(change) {
  // PlanChange.as_json: per node the roles added, retired, restarted, updated; nodes added/drained.
  if (!change.changed) return "nothing";
  const parts = [];
  for (const [node, what] of Object.entries(change.nodes || {})) {
    const said = ["added", "retired", "restarted", "updated"]
      .filter((k) => Array.isArray(what[k]) && what[k].length)
      .map((k) => `${k} ${what[k].join(", ")}`);
    if (Array.isArray(what.capacity_bytes)) said.push(`capacity ${gib(what.capacity_bytes[1])} GiB`);
    if (said.length) parts.push(`${node}: ${said.join("; ")}`);
  }
  for (const key of ["added_nodes", "drained_nodes"]) {
    if (Array.isArray(change[key]) && change[key].length) {
      parts.push(`${key.replace("_", " ")}: ${change[key].join(", ")}`);
    }
  }
  return parts.join(" · ") || "nothing";
}

function renderNodes(nodes) {
  const main = $("nodes");
  const seen = new Set();
  for (const [name, node] of Object.entries(nodes)) {
    seen.add(name);
    let card = main.querySelector(`section.node[data-node="${CSS.escape(name)}"]`);
    if (!card) {
      card = nodeCard(name);
      main.append(card);
    }
    updateNode(card, name, node);
  }
  for (const card of main.querySelectorAll("section.node")) {
    if (!seen.has(card.dataset.node)) card.remove();
  }
}

function nodeCard(name) {
  const head = el("tr", {},
    ...["role", "phase", "class", "sticky", "running", "queued", "idle", "counted GiB",
      "RSS GiB", "KV kept", "notes", ""].map((t, i) => el("th", { class: i >= 4 && i <= 8 ? "num" : "", text: t })));
  return el("section", { class: "panel node", "data-node": name },
    el("div", { class: "node-head" },
      el("h2", { text: `node ${name}` }),
      el("span", { class: "node-figures muted" })),
    el("div", { class: "bar", role: "img" }),
    el("div", { class: "bar-legend muted" }),
    el("div", { class: "pools", hidden: "" }),
    el("table", { class: "roles" }, el("thead", {}, head), el("tbody", {})));
}

function counted(info) {
  return typeof info.counted_bytes === "number" ? info.counted_bytes : info.resident_bytes;
}

function updateNode(card, name, node) {
  const capacity = node.capacity_bytes || 0;
  const roles = node.roles || {};
  let loading = 0;
  let held = 0;
  const bar = card.querySelector(".bar");
  bar.replaceChildren();
  for (const [role, info] of Object.entries(roles)) {
    if (!BUSY.has(info.phase)) continue;
    const bytes = counted(info) || 0;
    if (info.phase === "loading") loading += bytes; else held += bytes;
    const width = capacity > 0 ? Math.max(0.5, (100 * bytes) / capacity) : 0;
    bar.append(el("div", {
      class: `seg phase-${info.phase}`,
      style: { width: `${Math.min(100, width)}%` },
      title: `${role}: ${gib(bytes)} GiB counted (${info.phase})`,
    }, el("span", { text: role })));
  }
  const free = Math.max(0, capacity - held - loading);
  bar.setAttribute("aria-label",
    `${gib(held)} GiB resident and ${gib(loading)} GiB loading of ${gib(capacity)} GiB`);
  card.querySelector(".node-figures").textContent =
    `${gib(node.resident_bytes)} of ${gib(capacity)} GiB held` +
    (node.transition ? ` · ${node.transition}` : "");
  const legend = card.querySelector(".bar-legend");
  legend.replaceChildren(
    el("span", { class: "key key-ready" }), ` resident ${gib(held)} GiB`,
    el("span", { class: "key key-loading" }), ` loading ${gib(loading)} GiB`,
    el("span", { class: "key key-free" }), ` free ${gib(free)} GiB`,
    ` · capacity ${gib(capacity)} GiB`);
  showPools(card.querySelector(".pools"), node.pools || {});

  const body = card.querySelector("tbody");
  const seen = new Set();
  for (const [role, info] of Object.entries(roles)) {
    seen.add(role);
    let row = body.querySelector(`tr[data-role="${CSS.escape(role)}"]`);
    if (!row) {
      row = roleRow(role);
      body.append(row);
    }
    updateRow(row, role, info);
  }
  for (const row of body.querySelectorAll("tr[data-role]")) {
    if (!seen.has(row.dataset.role)) row.remove();
  }
}

function showPools(box, pools) {
  // A node's memory pools (status_view: `host` and each device, bytes): one bar per pool,
  // resident of capacity, where the node has a device; a node with host RAM alone shows
  // its one bar above, as before pools were counted.
  const devices = Object.keys(pools).filter((name) => name !== "host");
  box.hidden = devices.length === 0;
  if (box.hidden) { box.replaceChildren(); return; }
  box.replaceChildren(...["host", ...devices].filter((name) => pools[name]).map((name) => {
    const pool = pools[name];
    const capacity = pool.capacity_bytes || 0;
    const resident = pool.resident_bytes || 0;
    const width = capacity > 0 ? Math.min(100, (100 * resident) / capacity) : 0;
    const origin = [];
    if (typeof pool.declared_bytes === "number") origin.push(`declared ${gib(pool.declared_bytes)} GiB`);
    if (typeof pool.probed_total_bytes === "number") origin.push(`probed ${gib(pool.probed_total_bytes)} GiB`);
    else if (pool.source === "default") origin.push("Metal's default share");
    else if (name !== "host") origin.push("no probe sees it");
    const roles = Object.entries(pool.roles || {}).map(([role, bytes]) => `${role} ${gib(bytes)} GiB`);
    const figures = `${gib(resident)} of ${gib(capacity)} GiB resident`;
    return el("div", { class: "pool", "data-pool": name },
      el("span", { class: "pool-name", text: name === "host" ? "host RAM" : name }),
      el("div", { class: "pool-bar", role: "img", "aria-label": `${name}: ${figures}`,
        title: roles.length ? `placed here: ${roles.join(", ")}` : "no role placed here" },
        el("div", { class: "pool-fill", style: { width: `${width}%` } })),
      el("span", { class: "pool-figures muted",
        text: origin.length ? `${figures} (${origin.join("; ")})` : figures }));
  }));
}

function roleRow(role) {
  const load = el("button", { type: "button", class: "small", "data-action": "load", text: "Load" });
  const unload = el("button", { type: "button", class: "small ghost", "data-action": "unload", text: "Unload" });
  const log = el("button", { type: "button", class: "small ghost", "data-action": "log", text: "log" });
  load.addEventListener("click", () => act("load", role));
  unload.addEventListener("click", () => act("unload", role));
  log.addEventListener("click", () => followLog(role));
  return el("tr", { "data-role": role },
    el("td", { class: "name" }, el("span", { text: role })),
    el("td", {}, el("span", { class: "phase" }),
      el("progress", { class: "load-progress", hidden: "" })),
    el("td", { class: "class" }),
    el("td", { class: "sticky" }),
    el("td", { class: "num running" }),
    el("td", { class: "num queued" }),
    el("td", { class: "num idle" }),
    el("td", { class: "num counted" }),
    el("td", { class: "num rss" }),
    el("td", { class: "kv" }),
    el("td", { class: "note" }),
    el("td", { class: "actions" }, load, unload, log));
}

function showLoad(row, role) {
  // A loading role's bar: seconds elapsed of the expected total (its last load on the node,
  // else its recent loads there in earlier runs, else its weights' size at a disk rate), as
  // the `loads` event says.
  const bar = row.querySelector(".load-progress");
  const load = state.loads[role];
  if (!bar) return;
  bar.hidden = !load || row.dataset.phase !== "loading";
  if (bar.hidden) return;
  const expected = Math.max(load.expected_s, load.elapsed_s, 0.001);
  bar.max = expected;
  bar.value = load.elapsed_s;
  bar.title = `${load.elapsed_s.toFixed(0)} s of ~${load.expected_s.toFixed(0)} s`;
}

function updateRow(row, role, info) {
  const phase = row.querySelector(".phase");
  phase.textContent = info.phase;
  phase.className = `phase phase-${info.phase}`;
  row.dataset.phase = info.phase;
  showLoad(row, role);
  row.querySelector(".class").textContent = info.latency_class;
  row.querySelector(".sticky").textContent = info.sticky ? "sticky" : "–";
  row.querySelector(".running").textContent = String(info.running);
  row.querySelector(".queued").textContent = String(info.queued);
  row.querySelector(".idle").textContent = age(info.idle_s);
  const memory = info.memory || {};
  const guessed = memory.declared_unmeasured && memory.counted_from === "roster";
  row.querySelector(".counted").textContent = (guessed ? "~" : "") + gib(counted(info));
  row.querySelector(".rss").textContent = gib(info.measured_rss_bytes);
  // The KV cache kept across swaps and the last restore's result (rosterd.router.restore_check).
  const kv = row.querySelector(".kv");
  kv.textContent = info.kv_summary || "—";
  kv.title =
    (info.kv &&
      (info.kv.not_kept || info.kv.last_restore_check_detail || info.kv.last_restore_detail)) ||
    "";
  kv.dataset.kind = info.kv && info.kv.last_restore_check === "not reused" ? "error" : "";
  const note = roleNote(role, info);
  const cell = row.querySelector(".note");
  cell.textContent = note.text;
  cell.title = note.text;
  cell.dataset.kind = note.kind;
  const pending = state.pending[role];
  const load = row.querySelector('[data-action="load"]');
  const unload = row.querySelector('[data-action="unload"]');
  load.disabled = Boolean(pending) || info.phase !== "stopped";
  unload.disabled = Boolean(pending) || !BUSY.has(info.phase) || info.phase === "stopping";
  load.textContent = pending === "load" ? "Loading…" : "Load";
  unload.textContent = pending === "unload" ? "Unloading…" : "Unload";
}

function renderUnplaced(unplaced, remote) {
  const list = $("unplaced-list");
  list.replaceChildren();
  for (const [role, reason] of unplaced) {
    list.append(el("li", {}, el("strong", { text: role }), ` not placed: ${reason}`));
  }
  for (const node of remote) {
    list.append(el("li", {}, el("strong", { text: `node ${node.node}` }),
      ` at ${node.address}: planned, not run by this process`));
  }
  $("unplaced").hidden = !list.children.length;
  $("unplaced-count").textContent = `(${list.children.length})`;
}

const KIND_CLASS = {
  loaded: "ok", restarted: "ok", loading: "info", stopping: "muted", stopped: "muted",
  load_failed: "bad", restart_failed: "bad", refused: "bad", crashed: "warn",
};

function renderEvents() {
  const list = $("events");
  list.replaceChildren();
  for (const event of state.events.slice().reverse()) {
    const took = typeof event.duration_s === "number" ? ` in ${event.duration_s.toFixed(2)} s` : "";
    list.append(el("li", {},
      el("time", { text: clock(event.at) }),
      el("span", { class: `kind ${KIND_CLASS[event.kind] || ""}`, text: event.kind.replace("_", " ") }),
      el("strong", { text: event.role }),
      el("span", { class: "cause", text: `${event.cause}${took}` }),
      el("span", { class: "muted where", text: `${event.node} · ${gib(event.resident_bytes)} GiB held` })));
  }
  $("events-count").textContent = state.events.length ? `(${state.events.length})` : "";
  if (state.status) renderNodes(state.status.nodes || {}); // failures show in the notes
}

// ---- actions ----------------------------------------------------------------------

async function act(action, role) {
  state.pending[role] = action;
  render();
  try {
    const response = await fetch(`/rosterd/${action}/${encodeURIComponent(role)}`, {
      method: "POST",
      headers: headers({ Accept: "application/json" }),
    });
    if (response.status === 401) askKey(true);
    else if (!response.ok) notice(`${action} ${role}: ${await errorMessage(response)}`);
  } catch (err) {
    notice(`${action} ${role}: ${err}`);
  } finally {
    delete state.pending[role];
    render();
  }
}

async function followLog(role) {
  if (state.log) state.log.abort.abort();
  const abort = new AbortController();
  state.log = { role, abort };
  const pre = $("log");
  pre.textContent = "";
  $("log-role").textContent = role;
  $("log-close").hidden = false;
  let response;
  try {
    response = await fetch(`/rosterd/logs/${encodeURIComponent(role)}?lines=300&follow=1`, {
      headers: headers({ Accept: "text/plain" }),
      signal: abort.signal,
    });
  } catch (_) { return; }
  if (response.status === 401) { askKey(true); return; }
  if (!response.ok) { pre.textContent = await errorMessage(response); return; }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
      let text = pre.textContent + value;
      if (text.length > MAX_LOG_CHARS) text = text.slice(text.indexOf("\n", text.length - MAX_LOG_CHARS) + 1);
      pre.textContent = text;
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
  } catch (_) { /* stopped following */ }
  if (!pre.textContent) pre.textContent = `(${role} has written nothing yet)`;
}

function stopLog() {
  if (state.log) state.log.abort.abort();
  state.log = null;
  $("log-close").hidden = true;
}

// ---- start --------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", keySubmitted);
  $("key-button").addEventListener("click", () => askKey(false));
  $("notice-close").addEventListener("click", () => { $("notice").hidden = true; });
  $("log-close").addEventListener("click", stopLog);
  $("play-form").addEventListener("submit", playSend);
  $("play-role").addEventListener("change", playRoleChanged);
  $("play-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("play-form").requestSubmit(); }
  });
  connect();
});
