// The page's usage table: per key and role, what was used in the last 7 days (requests,
// prompt and completion tokens as the backends reported them, errors, queue wait and time
// served), from GET /rosterd/usage, read again every 30 s. The route needs the watch scope
// (as the event stream does); for a key without it (403), or a router that keeps no usage
// (404), the table stays hidden. Shares page.js's helpers ($, el, headers).
"use strict";

const USAGE_SINCE = "7d";
const USAGE_REFRESH_MS = 30000;
let usageTimer = null;

function startUsage() {
  loadUsage();
  if (usageTimer === null) usageTimer = setInterval(loadUsage, USAGE_REFRESH_MS);
}

async function loadUsage() {
  let response;
  try {
    response = await fetch(`/rosterd/usage?since=${USAGE_SINCE}&by=key,role`, {
      headers: headers(), cache: "no-store",
    });
  } catch (_) {
    return; // the stream's reconnect tells of a lost connection
  }
  if (!response.ok) {
    $("usage").hidden = true;
    return;
  }
  renderUsage((await response.json()).rows || []);
}

function seconds(value) {
  return `${(value || 0).toFixed(1)} s`;
}

function renderUsage(rows) {
  const body = $("usage-rows");
  body.replaceChildren();
  for (const row of rows) {
    body.append(el("tr", { "data-usage-key": row.key, "data-usage-role": row.role },
      el("td", { class: "name", text: row.key }),
      el("td", { text: row.role }),
      el("td", { class: "num", text: String(row.requests) }),
      el("td", { class: "num", text: row.prompt_tokens.toLocaleString("en") }),
      el("td", { class: "num", text: row.completion_tokens.toLocaleString("en") }),
      el("td", { class: "num", text: String(row.errors) }),
      el("td", { class: "num", text: seconds(row.queue_wait_s) }),
      el("td", { class: "num", text: seconds(row.served_s) })));
  }
  $("usage-empty").hidden = rows.length > 0;
  $("usage").hidden = false;
}
