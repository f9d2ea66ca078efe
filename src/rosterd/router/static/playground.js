// rosterd's playground: chat with a served role through the same API, key and queue as
// any client (POST /v1/chat/completions, streamed), and see what the request cost: time
// to first token, tokens per second, and whether it had to load or swap the role (the
// router's X-Rosterd-* headers say so, and how long that took).
"use strict";

const play = {
  role: "",
  messages: [],   // the conversation with `role` so far (reset when another is chosen)
  abort: null,
};

function playgroundRoles(status) {
  // Every role a node serves (not those that cannot be served), in name order.
  const roles = new Set();
  for (const node of Object.values(status.nodes || {})) {
    for (const [role, info] of Object.entries(node.roles || {})) {
      if (info.phase !== "unavailable" && !info.retiring) roles.add(role);
    }
  }
  const names = [...roles].sort();
  const select = $("play-role");
  const shown = [...select.options].map((o) => o.value);
  if (shown.join("\n") === names.join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(...names.map((name) => el("option", { value: name, text: name })));
  if (names.includes(chosen)) select.value = chosen;
  $("play-send").disabled = !names.length;
}

function playRoleChanged() {
  if (play.abort) play.abort.abort();
  play.messages = [];
  $("play-log").replaceChildren();
  $("play-stats").textContent = "";
}

function bubble(who, text) {
  const item = el("div", { class: `bubble ${who}` }, el("span", { class: "who muted", text: who }),
    el("span", { class: "text", text }));
  $("play-log").append(item);
  return item.querySelector(".text");
}

function seconds(ms) { return `${(ms / 1000).toFixed(2)} s`; }

function waitWords(response, role, readyAfter) {
  // What the router says the request waited for (see rosterd.router.wait_report). A stream
  // whose head went while its role loaded (rosterd.router.load_progress) has no wait headers:
  // its last progress comment said how long it waited.
  if (readyAfter !== null) return `had to load ${role}: ready after ${readyAfter.toFixed(2)} s`;
  const load = response.headers.get("X-Rosterd-Load-S");
  const evicted = response.headers.get("X-Rosterd-Evicted");
  const wait = Number(response.headers.get("X-Rosterd-Queue-Wait-S") || "0");
  if (load !== null) {
    const swap = evicted ? `swapped in (stopped ${evicted.replaceAll("=", ": ").replaceAll(",", ", ")}); ` : "";
    return `${swap}had to load ${role}: ${Number(load).toFixed(2)} s (waited ${wait.toFixed(2)} s in all)`;
  }
  if (wait >= 0.005) return `waited ${wait.toFixed(2)} s in the queue; no load`;
  return `${role} was resident: no load, no wait`;
}

async function playSend(event) {
  event.preventDefault();
  const role = $("play-role").value;
  const input = $("play-input");
  const text = input.value.trim();
  if (!role || !text) return;
  if (role !== play.role) { playRoleChanged(); play.role = role; }
  if (play.abort) play.abort.abort();
  const abort = new AbortController();
  play.abort = abort;
  input.value = "";
  play.messages.push({ role: "user", content: text });
  bubble("you", text);
  const out = bubble(role, "");
  const stats = $("play-stats");
  stats.dataset.state = "sending";
  stats.textContent = "sent; waiting for the first token…";
  $("play-send").disabled = true;
  const started = performance.now();
  let first = null;
  let chunks = 0;
  let usage = null;
  let timings = null;
  let failure = null;
  let readyAfter = null;
  let response;
  try {
    response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify({
        model: role,
        messages: play.messages,
        max_tokens: Math.max(1, Number($("play-max").value) || 256),
        stream: true,
        stream_options: { include_usage: true },
      }),
      signal: abort.signal,
    });
    if (response.status === 401) { askKey(true); failure = "the API key was refused"; }
    else if (!response.ok) failure = await errorMessage(response);
    else {
      await readEventBlocks(response, (block) => {
        for (const line of block.split("\n")) {
          if (line.startsWith(": ")) {
            // Load progress while the role loads: shown until the first token.
            const ready = / is ready after ([0-9.]+) s$/.exec(line);
            if (ready) readyAfter = Number(ready[1]);
            else if (first === null) stats.textContent = `${line.slice(2)}…`;
            continue;
          }
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (!data || data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) { failure = chunk.error.message || "the stream ended with an error"; continue; }
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            if (first === null) first = performance.now();
            chunks += 1;
            out.textContent += delta.content;
          }
          if (chunk.usage) usage = chunk.usage;
          if (chunk.timings) timings = chunk.timings;
        }
      });
    }
  } catch (err) {
    if (!abort.signal.aborted) failure = String(err);
  }
  const ended = performance.now();
  $("play-send").disabled = false;
  if (abort.signal.aborted) return;
  if (failure) {
    out.parentElement.classList.add("failed");
    if (!out.textContent) out.textContent = failure;
    stats.dataset.state = "failed";
    stats.textContent = `failed: ${failure}`;
    play.messages.pop();
    return;
  }
  play.messages.push({ role: "assistant", content: out.textContent });
  // The backend's own count when it gives one, else one token per streamed piece.
  const tokens = (usage && usage.completion_tokens) || (timings && timings.predicted_n) || chunks;
  const generating = first === null ? 0 : ended - first;
  const rate = generating > 0 ? ` · ${(tokens / (generating / 1000)).toFixed(1)} tokens/s` : "";
  stats.dataset.state = "done";
  stats.textContent = [
    `time to first token ${first === null ? "–" : seconds(first - started)}`,
    `${tokens} tokens in ${seconds(ended - started)}${rate}`,
    waitWords(response, role, readyAfter),
  ].join(" · ");
}
