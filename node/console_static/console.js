// The SMS console (node/console.py): polls /api/state and /api/history and draws them; a
// message browser (/api/records) and actions (/api/actions/*, each behind a confirmation
// dialog). Plain DOM calls, no library, nothing from the network; every value goes in as
// text (textContent), never as markup. The key is kept in memory only and sent as an
// `Authorization: Bearer` header.
//
// Elements carry data-* attributes that the tests find (tests/integration/test_console*.py):
// data-tab; #nodes-table tr[data-node] with data-up ("1"/"0") and data-draining, and its
// details row tr[data-node-details]; data-stream (a stream's card, and its groups' block),
// data-partition + data-state (lineage boxes), data-partition-row (partition tables),
// data-edge, data-group (with data-lag-records), tr[data-lease] + data-owner + data-lag-records,
// tr[data-consumer], data-under-replicated, #channels-table tr[data-channel] + data-partition +
// data-records + data-error, data-action (buttons), #dialog-result[data-outcome] ("ok",
// "error"), tr[data-record] (the browser's rows), data-series (chart lines).
"use strict";

const POLL_INTERVAL_MS = 1000;
const HISTORY_INTERVAL_MS = 10000;
const SVG_NS = "http://www.w3.org/2000/svg";
const BOX_WIDTH_MIN = 120;     // px: a partition box at least this wide (its text must fit)
const BOX_HEIGHT = 58;
const ROW_GAP = 38;
const WIDTH_MAX = 4000;        // px: the key space at most this wide (the page scrolls)
const CHART_WIDTH = 720;
const CHART_HEIGHT = 160;
const CHART_SERIES_MAX = 8;    // lines in one chart

// a key given as ?token= is kept in memory and sent as a header; the address bar drops it
const params = new URLSearchParams(window.location.search);
let token = params.get("token") || "";
if (params.has("token")) {
  params.delete("token");
  const rest = params.toString();
  window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : "") + window.location.hash);
}

let shown = "";                // the last state drawn, without its time: redraw only on a change
let state = null;              // the last state answered
let chartHistory = null;           // the last history answered
const openNodes = new Set();   // nodes whose details are open
let browseNext = null;         // the browser's next page (an iterator)

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function table(headers, rows, attrs) {
  const head = el("tr", {}, ...headers.map(h => el("th", h.num ? {class: "num"} : {}, h.label || h)));
  return el("table", attrs || {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

function button(label, action, onClick, attrs) {
  const b = el("button", {type: "button", "data-action": action, ...(attrs || {})}, label);
  b.addEventListener("click", e => { e.stopPropagation(); onClick(); });
  return b;
}

function ago(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return ms + " ms ago";
  if (ms < 120000) return Math.round(ms / 1000) + " s ago";
  return Math.round(ms / 60000) + " min ago";
}

function when(atMs) {
  return atMs ? new Date(atMs).toLocaleString() : "";
}

function fraction(x) {
  return x.toFixed(3).replace(/\.?0+$/, "") || "0";
}

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + " " + units[i];
}

function rate(x) {
  if (x === null || x === undefined) return "?";
  return x >= 100 ? Math.round(x).toLocaleString() : x >= 10 ? x.toFixed(1) : x.toFixed(2);
}

function count(n) {
  return n === null || n === undefined ? "?" : Number(n).toLocaleString();
}

function durationText(ms) {
  if (ms === null || ms === undefined) return "?";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 7200000) return Math.round(ms / 60000) + " min";
  return (ms / 3600000).toFixed(1) + " h";
}

function retentionText(s) {
  return s % 3600 === 0 ? `${s / 3600} h` : `${s} s`;
}

// --- requests -----------------------------------------------------------------------------

function headers(extra) {
  return {...(token ? {Authorization: "Bearer " + token} : {}), ...(extra || {})};
}

async function getJson(path) {
  const answer = await fetch(path, {cache: "no-store", headers: headers()});
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error && body.message ? `${body.error}: ${body.message}` :
                                  body.error || answer.statusText);
  return body;
}

// an action: its answer, or {error, message} (the named error the cluster gave)
async function act(name, body) {
  try {
    const answer = await fetch("/api/actions/" + name, {method: "POST", cache: "no-store",
      headers: headers({"Content-Type": "application/json"}), body: JSON.stringify(body)});
    const result = await answer.json();
    return answer.ok ? result : {error: result.error || String(answer.status), message: result.message || ""};
  } catch (e) {
    return {error: "NetworkError", message: e.message};
  }
}

// --- tabs -----------------------------------------------------------------------------------

function showTab() {
  const tab = (window.location.hash || "#overview").slice(1);
  const known = ["overview", "streams", "consumers", "browser"].includes(tab) ? tab : "overview";
  for (const section of document.querySelectorAll("section.tab")) section.hidden = section.id !== known;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === known);
}

// --- overview -------------------------------------------------------------------------------

function nodeState(n) {
  return (n.up ? "up" : "down") + (n.draining ? ", draining" : "") + (n.disk_failed ? ", disk failed" : "");
}

function drawSummary(s) {
  const up = s.nodes.filter(n => n.up).length, down = s.nodes.length - up;
  const draining = s.nodes.filter(n => n.draining).length;
  const parts = s.streams.reduce((k, x) => k + x.partitions.filter(p => p.state === "OPEN").length, 0);
  const tile = (label, value, cls, id) => el("div", {class: "tile " + (cls || ""), id}, el("div", {class: "value"}, value),
                                             el("div", {class: "label"}, label));
  return [tile("nodes up", up, "", "tile-up"), tile("nodes down", down, down ? "bad" : "", "tile-down"),
          tile("draining", draining, draining ? "warn" : "", "tile-draining"),
          tile("streams", s.streams_total), tile("open partitions", parts),
          tile("under-replicated", s.under_replicated.length, s.under_replicated.length ? "bad" : "", "tile-short"),
          tile("records/s in", rate(s.totals.in_records_per_s), "", "tile-in"),
          tile("records/s out", rate(s.totals.out_records_per_s), "", "tile-out"),
          tile("bytes/s in", bytes(s.totals.in_bytes_per_s)), tile("bytes/s out", bytes(s.totals.out_bytes_per_s))];
}

function linksText(n) {
  if (!n.live) return el("span", {class: n.up ? "muted" : "warn"}, n.status_error ? "no answer" : "");
  if (!n.live.links.length) return el("span", {class: "muted"}, "none");
  const down = n.live.links.filter(l => !l.connected);
  const heard = Math.max(...n.live.links.map(l => l.heard_ago_s));
  return el("span", {class: down.length ? "warn" : ""},
            `${n.live.links.length - down.length}/${n.live.links.length} connected` +
            (heard >= 0 ? ` · heard ${heard.toFixed(1)} s ago` : ""));
}

function diskText(d) {
  if (!d) return el("span", {class: "muted"}, "");
  return el("span", {title: `LMDB ${bytes(d.lmdb_used_bytes)} of a ${bytes(d.lmdb_map_bytes)} map; ` +
                            `file system ${bytes(d.disk_free_bytes)} free of ${bytes(d.disk_bytes)}`},
            `${bytes(d.lmdb_used_bytes)} · ${bytes(d.disk_free_bytes)} free`);
}

function nodeActions(n) {
  if (!n.roles.includes("storage") && n.up) return null;
  return el("span", {class: "actions"},
    n.draining ? button("Undrain", "undrain-node", () => confirmNode(n, "undrain"))
               : button("Drain", "drain-node", () => confirmNode(n, "drain")),
    n.up ? null : button("Remove", "remove-node", () => confirmNode(n, "remove")));
}

function nodeDetails(n) {
  const replicas = n.chains.map(c => el("span", {"data-chain": c.stream + "/" + c.partition, "data-role": c.role},
    `${c.stream}/${c.partition} ${c.role} e${c.epoch}` + (c.state === "CLOSED" ? " (closed)" : "")));
  const links = n.live ? n.live.links.map(l => el("span", {class: l.connected ? "" : "warn"},
    `${l.direction === "out" ? "→" : "←"} ${l.peer} ${l.connected ? "connected" : "DISCONNECTED"}, ` +
    `${l.chains} chain link(s)` + (l.heard_ago_s >= 0 ? `, heard ${l.heard_ago_s.toFixed(1)} s ago` : ""))) : [];
  const changes = n.changes.map(c => el("span", {}, `${c.stream}/${c.partition} e${c.epoch} ${c.action} ` +
                                                    `${when(c.at_ms)}` + (c.reason ? `: ${c.reason}` : "")));
  return el("div", {class: "details"},
    el("div", {}, el("b", {}, "Address "), n.address || "(not registered)", n.metrics_address ?
      ` · metrics ${n.metrics_address}` : "", n.started_ms ? ` · started ${when(n.started_ms)}` : "",
      n.live && n.live.write_failures ? el("span", {class: "warn"}, ` · ${n.live.write_failures} failed writes: ` +
                                                                 n.live.last_error) : null,
      n.status_error ? el("span", {class: "warn"}, ` · status: ${n.status_error}`) : null,
      n.metrics_error ? el("span", {class: "warn"}, ` · metrics: ${n.metrics_error}`) : null),
    el("div", {}, el("b", {}, "Replicas "), el("div", {class: "chains"}, ...(replicas.length ? replicas : ["none"]))),
    el("div", {}, el("b", {}, "Links "), el("div", {class: "chains"}, ...(links.length ? links : ["none"]))),
    el("div", {}, el("b", {}, "Recent changes "), el("div", {class: "chains"}, ...(changes.length ? changes : ["none"]))));
}

function drawNodes(s) {
  const rows = [];
  for (const n of s.nodes) {
    const row = el("tr", {"data-node": n.node_id, "data-up": n.up ? "1" : "0", "data-draining": n.draining ? "1" : "0",
                          class: "clickable" + (n.up ? "" : " down") + (openNodes.has(n.node_id) ? " open" : "")},
      el("td", {}, n.node_id), el("td", {class: "state"}, el("span", {class: "badge " + (n.up ? (n.draining ? "warnbg" : "ok") : "error")},
                                                             nodeState(n))),
      el("td", {}, n.roles.join(", ")), el("td", {}, n.address),
      el("td", {class: "num"}, n.replicas), el("td", {class: "num"}, n.heads), el("td", {class: "num"}, n.learners),
      el("td", {}, diskText(n.disk)), el("td", {}, linksText(n)), el("td", {}, nodeActions(n)));
    row.addEventListener("click", () => {
      if (openNodes.has(n.node_id)) openNodes.delete(n.node_id); else openNodes.add(n.node_id);
      shown = "";
      draw(state);
    });
    rows.push(row);
    if (openNodes.has(n.node_id))
      rows.push(el("tr", {"data-node-details": n.node_id}, el("td", {colspan: 10}, nodeDetails(n))));
  }
  return table(["node", "state", "roles", "address", {label: "replicas", num: 1}, {label: "heads", num: 1},
                {label: "learners", num: 1}, "disk (LMDB · free)", "links", ""], rows, {id: "nodes-table"});
}

function drawReplication(s) {
  const short = s.under_replicated || [];
  const attrs = {id: "replication-state", "data-under-replicated": short.length};
  if (!short.length) return el("p", attrs, "Every partition has its replication factor.");
  return el("div", attrs,
    el("p", {class: "warn"}, `${short.length} partition(s) with fewer live members than their replication factor ` +
                             "(the chain manager restores them as nodes come back or take learners):"),
    table(["stream/partition", {label: "live members", num: 1}, {label: "replication factor", num: 1}],
          short.map(p => el("tr", {"data-short": `${p.stream}/${p.partition}`},
                            el("td", {}, `${p.stream}/${p.partition}`), el("td", {class: "num"}, p.live_members),
                            el("td", {class: "num"}, p.replication_factor)))));
}

function drawChanges(s) {
  if (!s.changes.length) return el("p", {class: "muted"}, "None.");
  return table(["time", "stream/partition", "epoch", "action", "node", "reason"], s.changes.map(c =>
    el("tr", {"data-change": `${c.stream}/${c.partition}/${c.epoch}`},
       el("td", {}, when(c.at_ms)), el("td", {}, `${c.stream}/${c.partition}`), el("td", {}, c.epoch),
       el("td", {}, c.action), el("td", {}, c.node), el("td", {}, c.reason))));
}

// --- streams: the lineage DAG ----------------------------------------------------------------

function depths(partitions) {
  const by = new Map(partitions.map(p => [p.partition, p]));
  const depth = new Map();
  function of(p, seen) {
    if (depth.has(p.partition)) return depth.get(p.partition);
    let d = 0;
    for (const parent of p.parents) {
      const q = by.get(parent);
      if (q && !seen.has(parent)) d = Math.max(d, of(q, new Set([...seen, parent])) + 1);
    }
    depth.set(p.partition, d);
    return d;
  }
  for (const p of partitions) of(p, new Set([p.partition]));
  return depth;
}

function drawLineage(stream, index) {
  const parts = stream.partitions;
  const depth = depths(parts);
  const levels = Math.max(0, ...depth.values()) + 1;
  // the key space across the page's width (wider where a partition is narrow, up to
  // WIDTH_MAX); within a generation, boxes in hash order and never on top of each other
  const narrowest = Math.min(...parts.map(p => Math.max(p.hi - p.lo, 1e-9)));
  const available = Math.max(720, (document.getElementById("stream-list").clientWidth || 900) - 64);
  const span = Math.min(WIDTH_MAX, Math.max(available, Math.ceil(BOX_WIDTH_MIN / narrowest)));
  const boxes = new Map();
  let width = span;
  for (let d = 0; d < levels; d++) {
    let end = 0;
    for (const p of parts.filter(q => depth.get(q.partition) === d).sort((a, b) => a.lo - b.lo)) {
      const x = Math.max(p.lo * span + 3, end + 6);
      const w = Math.max((p.hi - p.lo) * span - 6, BOX_WIDTH_MIN - 6);
      boxes.set(p.partition, {x, y: 6 + d * (BOX_HEIGHT + ROW_GAP), w});
      end = x + w;
    }
    width = Math.max(width, end + 3);
  }
  const height = levels * (BOX_HEIGHT + ROW_GAP) - ROW_GAP + 12;
  const root = svg("svg", {class: "lineage", width, height, viewBox: `0 0 ${width} ${height}`,
                           "data-lineage": stream.name});
  const arrow = `arrow-${index}`;
  const defs = svg("defs");
  const marker = svg("marker", {id: arrow, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                                markerHeight: 7, orient: "auto-start-reverse"});
  marker.append(svg("path", {d: "M 0 0 L 10 5 L 0 10 z"}));
  defs.append(marker);
  root.append(defs);
  for (const p of parts) {          // edges first: the boxes are drawn over them
    const to = boxes.get(p.partition);
    for (const parent of p.parents) {
      const from = boxes.get(parent);
      if (!from) continue;
      const x1 = from.x + from.w / 2, y1 = from.y + BOX_HEIGHT, x2 = to.x + to.w / 2, y2 = to.y;
      const mid = (y1 + y2) / 2;
      root.append(svg("path", {class: "edge", "data-edge": `${parent}->${p.partition}`, "data-from": parent,
                               "data-to": p.partition, d: `M ${x1} ${y1} C ${x1} ${mid}, ${x2} ${mid}, ${x2} ${y2}`,
                               "marker-end": `url(#${arrow})`}));
    }
  }
  for (const p of parts) {
    const {x, y, w} = boxes.get(p.partition);
    const g = svg("g", {class: "partition " + p.state.toLowerCase() + (p.under_replicated ? " short" : ""),
                        "data-partition": p.partition, "data-state": p.state, "data-epoch": p.epoch,
                        "data-under-replicated": p.under_replicated ? "1" : "0"});
    const chain = p.chain.map(m => m.node_id).join(" → ") + (p.learners.length ? ` (+${p.learners.join(", ")})` : "");
    g.append(svg("title", {}, `${stream.name}/${p.partition} ${p.state}${p.sealed && p.state === "OPEN" ? " sealed" : ""}\n` +
                               `hash [${p.hash_lo}, ${p.hash_hi})\nchain epoch ${p.epoch}: ${chain}` +
                               (p.under_replicated ? `\nunder-replicated: ${p.live_members} of ` +
                                                     `${stream.replication_factor} members live` : "") +
                               (p.parents.length ? `\nparents ${p.parents.join(", ")}` : "") +
                               (p.children.length ? `\nchildren ${p.children.join(", ")}` : "")));
    g.append(svg("rect", {x, y, width: w, height: BOX_HEIGHT, rx: 5}));
    g.append(svg("text", {x: x + 6, y: y + 15, class: "pid"}, `${p.partition} ${p.state}`));
    g.append(svg("text", {x: x + 6, y: y + 31, class: "range"}, `[${fraction(p.lo)}, ${fraction(p.hi)})`));
    g.append(svg("text", {x: x + 6, y: y + 47, class: "chain"}, `e${p.epoch} ${chain}`));
    root.append(g);
  }
  return el("div", {class: "dag"}, root);
}

function drawPartitions(s) {
  const rows = s.partitions.map(p => el("tr", {"data-partition-row": p.partition, "data-row-state": p.state},
    el("td", {}, p.partition), el("td", {}, p.state), el("td", {}, p.chain.map(m => m.node_id).join(" → ")),
    el("td", {class: "num"}, count(p.records)),
    el("td", {class: "num"}, rate(p.in_records_per_s)), el("td", {class: "num"}, bytes(p.in_bytes_per_s)),
    el("td", {class: "num"}, rate(p.out_records_per_s)), el("td", {class: "num"}, bytes(p.out_bytes_per_s)),
    el("td", {class: "num"}, p.archive_lag_ms === null ? "" : durationText(p.archive_lag_ms)),
    el("td", p.archive_error ? {class: "error"} : {}, p.archive_error)));
  return table(["partition", "state", "chain", {label: "records stored", num: 1}, {label: "records/s in", num: 1},
                {label: "bytes/s in", num: 1}, {label: "records/s out", num: 1}, {label: "bytes/s out", num: 1},
                {label: "archive lag", num: 1}, "archive error"], rows, {class: "partitions"});
}

function drawStreams(s) {
  if (!s.streams.length) return el("p", {class: "muted"}, "No streams.");
  const cards = s.streams.map((x, i) => {
    const short = x.partitions.filter(p => p.under_replicated).length;
    const open = x.partitions.filter(p => p.state === "OPEN").length;
    return el("div", {class: "card", "data-stream": x.name, "data-under-replicated": short},
      el("h3", {}, x.name, " ", el("span", {class: "badge"}, x.status), " ",
         el("span", {class: "muted"}, `${open} open, ${x.partitions.length - open} closed partitions · ` +
                                       `replication ${x.replication_factor} · ${x.persistence} · map v${x.map_version}`),
         short ? el("span", {class: "warn"}, ` · ${short} under-replicated`) : null,
         el("span", {class: "actions"},
            button("Retention…", "update-stream", () => confirmRetention(x)),
            button("Repartition…", "repartition", () => confirmRepartition(x)),
            button("Delete…", "delete-stream", () => confirmDelete(x), {class: "danger"}))),
      el("p", {class: "facts", "data-facts": x.name},
         `${count(x.records)} records stored · in ${rate(x.in_records_per_s)} records/s (${bytes(x.in_bytes_per_s)}/s) · ` +
         `out ${rate(x.out_records_per_s)} records/s (${bytes(x.out_bytes_per_s)}/s) · retention ${retentionText(x.retention_s)}` +
         (x.protect_unread ? " (unread kept)" : "") +
         ` · archive ${x.archive ? x.archive + ` after ${x.archive_after_s} s, lag ${durationText(x.archive_lag_ms)}` : "none"}` +
         ` · encryption ${x.encryption}`),
      drawLineage(x, i), drawPartitions(x));
  });
  if (s.streams_total > s.streams_shown)
    cards.push(el("p", {class: "warn"}, `${s.streams_shown} of ${s.streams_total} streams shown.`));
  return el("div", {}, ...cards);
}

// --- consumers --------------------------------------------------------------------------------

function lagCell(records, ms) {
  if (records === null || records === undefined)
    return el("td", {class: "num", title: "not known: the partition's head did not answer"}, "?");
  return el("td", {class: "num"}, `${count(records)}` + (records ? ` (${durationText(ms)})` : ""));
}

function drawGroup(stream, g) {
  const leases = g.leases.map(l => el("tr", {"data-lease": l.partition, "data-owner": l.owner,
                                             "data-lag-records": l.lag_records === null ? "" : l.lag_records},
    el("td", {}, l.partition), el("td", {}, l.owner || el("span", {class: "muted"}, "free")),
    el("td", {class: "sn"}, l.checkpoint), el("td", {class: "num"}, count(l.records)), el("td", {class: "num"}, rate(l.rate)),
    lagCell(l.lag_records, l.lag_ms), el("td", {class: "num"}, l.failures),
    el("td", {class: "num"}, l.dead_letters), el("td", {}, l.last_error), el("td", {}, ago(l.heartbeat_age_ms))));
  const members = g.members.map(m => `${m.member}${m.host ? "@" + m.host : ""} (${ago(m.heartbeat_age_ms)})`);
  return el("div", {"data-group": g.group, "data-lag-records": g.lag_records, class: "group"},
    el("h4", {}, `group ${g.group} `,
       el("span", {class: "muted"}, `${g.members.length} member(s)${members.length ? ": " + members.join(", ") : ""}` +
                                    ` · lag ${count(g.lag_records)} records (${durationText(g.lag_ms)})` +
                                    ` · ${rate(g.rate)} records/s · failures ${g.failures} · dead letters ${g.dead_letters}`),
       el("span", {class: "actions"}, button("Reset…", "reset-group", () => confirmReset(stream, g)))),
    table(["partition", "owner", "checkpoint", {label: "records done", num: 1}, {label: "records/s", num: 1},
           {label: "lag (records, time)", num: 1}, {label: "failures", num: 1}, {label: "dead letters", num: 1},
           "last error", "owner's last write"], leases));
}

function drawConsumers(s) {
  const blocks = s.streams.filter(x => x.groups.length || x.consumers.length).map(x => {
    const registered = x.consumers.map(c => el("tr", {"data-consumer": c.consumer},
      el("td", {}, c.consumer), el("td", {}, c.group ? "group" : "registered"),
      el("td", {}, Object.entries(c.checkpoints).map(([p, sn]) => `${p}: ${sn}`).join(", ") || "nothing processed"),
      el("td", {class: "num"}, count(c.lag_records_total))));
    return el("div", {class: "card", "data-stream": x.name},
      el("h3", {}, x.name),
      ...x.groups.map(g => drawGroup(x, g)),
      registered.length ? el("h4", {}, "Registered consumers") : null,
      registered.length ? table(["consumer", "kind", "checkpoints", {label: "lag (records)", num: 1}], registered) : null);
  });
  return blocks.length ? el("div", {}, ...blocks) : el("p", {class: "muted"}, "No consumer groups, SPS stages or registered consumers.");
}

function drawQueues(s) {
  if (!s.queues.length) return el("p", {class: "muted"}, "No queues (or their nodes did not answer).");
  return table(["queue", "stream", "partition", {label: "available", num: 1}, {label: "in flight", num: 1},
                {label: "dead letters", num: 1}, {label: "oldest", num: 1}], s.queues.map(q =>
    el("tr", {"data-queue": q.queue, "data-partition": q.partition},
       el("td", {}, q.queue), el("td", {}, q.stream), el("td", {}, q.partition),
       el("td", {class: "num"}, count(q.available)), el("td", {class: "num"}, count(q.in_flight)),
       el("td", {class: "num"}, count(q.dead)), el("td", {class: "num"}, q.oldest_age_s + " s"))));
}

function positionText(position) {
  if (!position) return el("span", {class: "muted"}, "none");
  return position === "SHARD_END" ? "SHARD_END (done)" : position;
}

function drawChannels(s) {
  const channels = s.channels || [];
  if (!channels.length) return el("p", {class: "muted"}, "No channels.");
  const rows = [];
  for (const c of channels) {
    const parts = c.partitions.length ? c.partitions : [null];
    const where = el("td", c.catalog_uri ? {rowspan: parts.length, class: "lead", title: "catalog " + c.catalog_uri}
                             : {rowspan: parts.length, class: "lead"},
                     el("span", {class: "badge"}, c.kind), " ", c.destination);
    const name = el("td", {rowspan: parts.length, class: "lead"}, c.channel,
                    c.status === "ACTIVE" ? null : el("span", {class: "badge error"}, c.status), " ",
                    el("span", {class: "muted"}, `${c.record_format} · every ${c.data_freshness_s} s`));
    const stream = el("td", {rowspan: parts.length, class: "lead"}, c.stream);
    parts.forEach((p, i) => {
      const lead = i === 0 ? [name, stream, where] : [];
      if (p === null) {
        rows.push(el("tr", {"data-channel": c.channel, "data-partition": "", "data-error": "0"}, ...lead,
                     el("td", {colspan: 9, class: "muted"}, "no progress recorded yet")));
        return;
      }
      rows.push(el("tr", {"data-channel": c.channel, "data-partition": p.partition, "data-records": p.records,
                          "data-error": p.error ? "1" : "0", class: p.error ? "failing" : ""}, ...lead,
        el("td", {}, p.partition), el("td", {class: "sn"}, positionText(p.position)),
        el("td", {class: "num"}, p.records), el("td", {class: "num"}, p.files),
        el("td", {class: "num"}, p.dead_letters),
        el("td", {class: "age"}, p.last_commit_age_ms === null ? el("span", {class: "muted"}, "never")
                                                                : ago(p.last_commit_age_ms)),
        el("td", {class: "num age"}, durationText(p.lag_ms)),
        el("td", {}, p.node, p.node_registered ? null : el("span", {class: "warn"}, " (not registered)")),
        el("td", p.error ? {class: "error"} : {}, p.error)));
    });
  }
  const failing = channels.reduce((n, c) => n + c.errors, 0);
  return el("div", {},
    failing ? el("p", {class: "warn", id: "channels-failing"}, `${failing} channel partition(s) failing ` +
                                                                 "(retried with backoff):") : null,
    table(["channel", "stream", "destination", "partition", "position", {label: "records", num: 1},
           {label: "files", num: 1}, {label: "dead letters", num: 1}, "last commit", {label: "lag", num: 1},
           "node", "error"], rows, {id: "channels-table"}),
    s.channels_total > channels.length ?
      el("p", {class: "warn"}, `${channels.length} of ${s.channels_total} channels shown.`) : null);
}

// --- charts (inline SVG) ------------------------------------------------------------------------

function drawChart(series, unit, container, sampleS) {
  const names = Object.keys(series).slice(0, CHART_SERIES_MAX);
  const points = names.flatMap(n => series[n]);
  if (points.length < 2) return el("p", {class: "muted"}, `No points yet: each node keeps a point every ${sampleS} s.`);
  // the time the points cover, up to the last hour
  const t1 = Math.max(...points.map(p => p[0])), t0 = Math.max(t1 - 3600000, Math.min(...points.map(p => p[0])));
  const top = Math.max(1, ...points.map(p => p[1]));
  const width = Math.max(CHART_WIDTH, (container.clientWidth || CHART_WIDTH) - 8);
  const left = 56, bottom = 18, w = width - left - 8, h = CHART_HEIGHT - bottom - 8;
  const root = svg("svg", {class: "chart", width, height: CHART_HEIGHT, viewBox: `0 0 ${width} ${CHART_HEIGHT}`});
  const x = t => left + (t - t0) / Math.max(1, t1 - t0) * w, y = v => 8 + h - v / top * h;
  root.append(svg("line", {x1: left, y1: 8 + h, x2: left + w, y2: 8 + h, class: "axis"}));
  root.append(svg("line", {x1: left, y1: 8, x2: left, y2: 8 + h, class: "axis"}));
  root.append(svg("text", {x: left - 4, y: 16, class: "tick", "text-anchor": "end"}, rate(top)));
  root.append(svg("text", {x: left - 4, y: 8 + h, class: "tick", "text-anchor": "end"}, "0"));
  root.append(svg("text", {x: left, y: CHART_HEIGHT - 4, class: "tick"}, new Date(t0).toLocaleTimeString()));
  root.append(svg("text", {x: left + w, y: CHART_HEIGHT - 4, class: "tick", "text-anchor": "end"},
                  new Date(t1).toLocaleTimeString()));
  names.forEach((name, i) => {
    // a gap of more than two samples (no node answered for it) breaks the line
    let d = "", last = null;
    for (const [t, v] of series[name].filter(p => p[0] >= t0)) {
      d += `${last === null || t - last > 2500 * sampleS ? "M" : "L"} ${x(t).toFixed(1)} ${y(v).toFixed(1)} `;
      last = t;
    }
    root.append(svg("path", {d, class: `line c${i}`, "data-series": name}));
  });
  const legend = el("div", {class: "legend"}, ...names.map((n, i) => el("span", {class: `key c${i}`}, n)),
                    el("span", {class: "muted"}, unit));
  return el("div", {}, root, legend);
}

function drawHistory() {
  if (!chartHistory) return;
  const s = chartHistory.series;
  const pick = (prefix, rename) => Object.fromEntries(Object.entries(s).filter(([n]) => n === prefix ||
                                                      (rename && n.startsWith(prefix))).map(([n, v]) => [rename ? n.slice(prefix.length) : n, v]));
  const throughput = {"records/s in": s.in || [], "records/s out": s.out || []};
  const throughputChart = document.getElementById("chart-throughput"), lagChart = document.getElementById("chart-lag");
  const sampleS = chartHistory.sample_s;
  throughputChart.replaceChildren(drawChart(Object.fromEntries(Object.entries(throughput).filter(([, v]) => v.length)),
                                            "records/s, whole cluster", throughputChart, sampleS));
  lagChart.replaceChildren(drawChart(pick("lag:", true), "records behind, per stream/consumer", lagChart, sampleS));
  const missing = Object.keys(chartHistory.errors || {});
  document.getElementById("history-note").textContent = `(a point every ${sampleS} s, kept by each node` +
    (missing.length ? `; no history from ${missing.join(", ")})` : ")");
}

// --- dialogs and actions -----------------------------------------------------------------------

const dialog = () => document.getElementById("dialog");
let onConfirm = null, onPlan = null;

function field(label, id, attrs) {
  return el("label", {}, label + " ", el("input", {id, ...(attrs || {})}));
}

function selectField(label, id, options, value) {
  const s = el("select", {id}, ...options.map(o => el("option", {value: o}, o)));
  s.value = value;
  return el("label", {}, label + " ", s);
}

function value(id) {
  const e = document.getElementById(id);
  return e ? e.value.trim() : "";
}

function openDialog(title, text, fields, confirm, label, plan) {
  document.getElementById("dialog-title").textContent = title;
  document.getElementById("dialog-text").textContent = text;
  document.getElementById("dialog-fields").replaceChildren(...fields);
  document.getElementById("dialog-plan").replaceChildren();
  const result = document.getElementById("dialog-result");
  result.textContent = "";
  result.dataset.outcome = "";
  const ok = document.getElementById("dialog-confirm");
  ok.textContent = label || "Confirm";
  ok.disabled = !!plan;
  const planButton = document.getElementById("dialog-plan-button");
  planButton.hidden = !plan;
  onConfirm = confirm;
  onPlan = plan || null;
  dialog().showModal();
}

function showResult(answer, done) {
  const result = document.getElementById("dialog-result");
  if (answer.error) {
    result.dataset.outcome = "error";
    result.textContent = `${answer.error}: ${answer.message}`;
    return false;
  }
  result.dataset.outcome = "ok";
  result.textContent = done(answer);
  shown = "";                       // (the next poll redraws)
  return true;
}

async function run(button, work) {
  button.disabled = true;
  try { await work(); } finally { button.disabled = false; }
}

function confirmCreate() {
  openDialog("Create a stream", "A new stream, its partitions spread over the storage nodes.",
    [field("name", "f-name", {required: "", size: 24}), field("partitions", "f-partitions", {type: "number", min: 1, value: 1}),
     field("replication factor", "f-rf", {type: "number", min: 1, value: 1}),
     field("retention (hours, 0: the default)", "f-hours", {type: "number", min: 0, value: 0})],
    async () => showResult(await act("create-stream", {name: value("f-name"), partitions: Number(value("f-partitions")),
                                                       replication_factor: Number(value("f-rf")),
                                                       retention_hours: Number(value("f-hours"))}),
                           a => `created ${a.stream} with ${a.partitions} partition(s)`), "Create");
}

function confirmRetention(x) {
  openDialog(`Retention of ${x.name}`, `Now ${retentionText(x.retention_s)}. It applies at once: records older ` +
             "than the new retention are deleted within seconds.",
    [field("retention (hours)", "f-hours", {type: "number", min: 1, value: Math.max(1, Math.round(x.retention_s / 3600))})],
    async () => showResult(await act("update-stream", {name: x.name, retention_hours: Number(value("f-hours"))}),
                           a => `retention of ${a.stream} is now ${retentionText(a.retention_s)}`), "Update");
}

function confirmDelete(x) {
  openDialog(`Delete ${x.name}`, `Every record of ${x.name} (${count(x.records)} stored) and its consumers' ` +
             "checkpoints are deleted. This cannot be undone. Type the stream's name to confirm.",
    [field("name", "f-confirm-name", {size: 24})],
    async () => {
      if (value("f-confirm-name") !== x.name)
        return showResult({error: "NotConfirmed", message: `type ${x.name} to delete it`});
      return showResult(await act("delete-stream", {name: x.name}), a => `deleted ${a.stream}`);
    }, "Delete");
}

// a field shown only for some operations of the repartition dialog
function opField(label, ops) {
  label.dataset.ops = ops;
  label.hidden = !ops.split(" ").includes("split");
  return label;
}

function opChanged() {
  const op = value("f-op");
  for (const label of document.querySelectorAll("#dialog-fields label[data-ops]"))
    label.hidden = !label.dataset.ops.split(" ").includes(op);
}

function confirmRepartition(x) {
  const open = x.partitions.filter(p => p.state === "OPEN").map(p => p.partition);
  openDialog(`Repartition ${x.name}`, `${open.length} open partitions. A split or merge closes the partitions ` +
             "it changes and opens their children; producers and consumers carry on.",
    [selectField("operation", "f-op", ["split", "merge", "scale"], "split"),
     opField(selectField("partition", "f-p1", open, open[0]), "split merge"),
     opField(selectField("and the adjacent partition", "f-p2", open, open[1] || open[0]), "merge"),
     opField(field("open partitions wanted", "f-target", {type: "number", min: 1, value: open.length * 2}), "scale")],
    async () => {
      const op = value("f-op");
      const body = {name: x.name, op};
      if (op === "split") body.partition = value("f-p1");
      else if (op === "merge") body.partitions = [value("f-p1"), value("f-p2")];
      else body.target_partitions = Number(value("f-target"));
      return showResult(await act("repartition", body), a => `${a.stream}: open partitions now ${a.open.join(", ")}`);
    }, "Repartition");
  document.getElementById("f-op").addEventListener("change", opChanged);
}

function resetBody(x, g) {
  const to = value("f-to");
  const body = {stream: x.name, group: g.group};
  if (to === "AT_TIMESTAMP") body.timestamp_ms = new Date(value("f-ts")).getTime();
  else body.to = to;
  return body;
}

function confirmReset(x, g) {
  openDialog(`Reset group ${g.group} of ${x.name}`, "Moves the group's checkpoints; running members resume " +
             "from there. Show the plan first (nothing changes), then execute it.",
    [selectField("to", "f-to", ["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"], "TRIM_HORIZON"),
     field("time (AT_TIMESTAMP)", "f-ts", {type: "datetime-local", step: 1})],
    async () => showResult(await act("reset-group", {...resetBody(x, g), execute: true}),
                           a => `group ${a.group} reset (${a.target || JSON.stringify(a.to)})`),
    "Execute",
    async () => {
      const a = await act("reset-group", {...resetBody(x, g), execute: false});
      if (!showResult(a, a => `the plan (nothing changed yet): ${a.target}`)) return;
      document.getElementById("dialog-plan").replaceChildren(table(["partition", "state", "checkpoint now", "to"],
        a.plan.map(p => el("tr", {"data-plan": p.partition_id}, el("td", {}, p.partition_id), el("td", {}, p.state),
                           el("td", {class: "sn"}, p.checkpoint || "-"), el("td", {class: "sn"}, p.to))),
        {id: "reset-plan"}));
      document.getElementById("dialog-confirm").disabled = false;
    });
}

function confirmNode(n, what) {
  const text = {drain: `Move every replica off ${n.node_id} (${n.replicas} replicas, ${n.heads} heads) to the other ` +
                       "nodes, keeping each chain's replication factor; nothing new is placed on it.",
                undrain: `Stop draining ${n.node_id}: it takes new replicas again.`,
                remove: `Forget ${n.node_id} for good: it must be stopped and hold no replica (drained).`}[what];
  openDialog(`${what[0].toUpperCase() + what.slice(1)} node ${n.node_id}`, text, [],
    async () => showResult(await act(what === "remove" ? "remove-node" : "drain-node",
                                     what === "remove" ? {node_id: n.node_id} : {node_id: n.node_id, undo: what === "undrain"}),
                           a => what === "remove" ? `removed ${a.node_id}` : `${a.node_id} ${a.draining ? "is draining" : "no longer drains"}`),
    what[0].toUpperCase() + what.slice(1));
}

// --- the message browser -----------------------------------------------------------------------

function fillBrowseChoices(s) {
  const streamSel = document.getElementById("browse-stream");
  const names = s.streams.map(x => x.name);
  if (JSON.stringify([...streamSel.options].map(o => o.value)) !== JSON.stringify(names)) {
    const keep = streamSel.value;
    streamSel.replaceChildren(...names.map(n => el("option", {value: n}, n)));
    if (names.includes(keep)) streamSel.value = keep;
  }
  const stream = s.streams.find(x => x.name === streamSel.value);
  const partSel = document.getElementById("browse-partition");
  const parts = stream ? stream.partitions.map(p => p.partition) : [];
  if (JSON.stringify([...partSel.options].map(o => o.value)) !== JSON.stringify(parts)) {
    const keep = partSel.value;
    partSel.replaceChildren(...(stream ? stream.partitions : []).map(p =>
      el("option", {value: p.partition}, `${p.partition} (${p.state.toLowerCase()})`)));
    if (parts.includes(keep)) partSel.value = keep;
  }
}

function browseFromChanged() {
  const from = value("browse-from");
  document.getElementById("browse-n-label").hidden = from !== "LATEST_N";
  document.getElementById("browse-sn-label").hidden = from !== "AT_SEQUENCE_NUMBER";
  document.getElementById("browse-ts-label").hidden = from !== "AT_TIMESTAMP";
}

function hexOf(b64) {
  const raw = atob(b64);
  let out = "";
  for (let i = 0; i < raw.length; i++) out += raw.charCodeAt(i).toString(16).padStart(2, "0") + (i % 16 === 15 ? "\n" : " ");
  return out.trim();
}

function recordData(r) {
  if (r.kind === "json" || r.kind === "text") return el("pre", {class: "data " + r.kind}, r.text);
  const as = value("browse-binary");
  return el("pre", {class: "data binary", "data-b64": r.base64}, as === "hex" ? hexOf(r.base64) : r.base64);
}

function drawRecords(page, append) {
  const rows = page.records.map(r => el("tr", {"data-record": r.sequence_number, "data-kind": r.kind},
    el("td", {class: "sn"}, r.sequence_number), el("td", {class: "age"}, new Date(r.arrival_ms).toISOString()),
    el("td", {}, r.partition_key),
    el("td", {}, Object.entries(r.headers).map(([k, v]) => `${k}: ${v}`).join("\n")),
    el("td", {}, el("span", {class: "badge"}, r.kind), ` ${count(r.bytes)} B` + (r.cut ? " (cut)" : ""), recordData(r))));
  const target = document.getElementById("records");
  if (append && target.querySelector("tbody")) target.querySelector("tbody").append(...rows);
  else target.replaceChildren(table(["sequence number", "arrival", "partition key", "headers", "data"], rows,
                                    {id: "records-table"}));
}

async function browse(next) {
  const status = document.getElementById("browse-status");
  const q = new URLSearchParams({limit: value("browse-limit") || "20"});
  if (next) q.set("iterator", browseNext);
  else {
    q.set("stream", value("browse-stream"));
    q.set("partition", value("browse-partition"));
    const from = value("browse-from");
    q.set("from", from);
    if (from === "LATEST_N") q.set("n", value("browse-n"));
    if (from === "AT_SEQUENCE_NUMBER") q.set("sequence_number", value("browse-sn"));
    if (from === "AT_TIMESTAMP") q.set("timestamp_ms", String(new Date(value("browse-ts")).getTime()));
  }
  status.textContent = "reading…";
  status.dataset.outcome = "";
  try {
    const page = await getJson("/api/records?" + q.toString());
    browseNext = page.next_iterator;
    drawRecords(page, next);
    document.getElementById("browse-next").disabled = !browseNext;
    status.dataset.outcome = "ok";
    status.textContent = `${page.records.length} record(s)` + (page.child_partitions.length ?
      ` · the partition is closed and read to its end: its children are ${page.child_partitions.join(", ")}` :
      page.records.length ? "" : " · nothing more now");
  } catch (e) {
    status.dataset.outcome = "error";
    status.textContent = e.message;
  }
}

// --- drawing and polling -----------------------------------------------------------------------

function draw(s) {
  if (!s) return;
  const served = document.getElementById("served-by");
  const role = s.node.leader ? "leader" : "standby";
  served.replaceChildren(`served by ${s.node.node_id} `, el("span", {class: "badge " + role, id: "role"}, role),
                         s.node.leader || !s.node.leader_address ? "" :
                           ` (the leader's client address: ${s.node.leader_address})`);
  const key = JSON.stringify({...s, generated_ms: 0});
  if (key === shown) return;
  shown = key;
  document.getElementById("summary").replaceChildren(...drawSummary(s));
  document.getElementById("nodes").replaceChildren(drawNodes(s));
  document.getElementById("replication").replaceChildren(drawReplication(s));
  document.getElementById("changes").replaceChildren(drawChanges(s));
  document.getElementById("stream-list").replaceChildren(drawStreams(s));
  document.getElementById("groups").replaceChildren(drawConsumers(s));
  document.getElementById("queues").replaceChildren(drawQueues(s));
  document.getElementById("channels").replaceChildren(drawChannels(s));
  fillBrowseChoices(s);
}

function setStatus(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.dataset.status = kind;
  status.className = kind === "ok" ? "muted" : "badge error";
}

async function poll() {
  try {
    state = await getJson("/api/state");
    draw(state);
    setStatus("updated " + new Date(state.generated_ms).toLocaleTimeString(), "ok");
  } catch (e) {
    setStatus("not updated: " + e.message, "error");
  } finally {
    window.setTimeout(poll, POLL_INTERVAL_MS);
  }
}

async function pollHistory() {
  try {
    chartHistory = await getJson("/api/history");
    drawHistory();
  } catch (e) {
    // (the state's poll says what is wrong)
  } finally {
    window.setTimeout(pollHistory, HISTORY_INTERVAL_MS);
  }
}

function setup() {
  window.addEventListener("hashchange", () => { showTab(); drawHistory(); });   // (a chart fits its tab's width)
  showTab();
  document.getElementById("key-form").addEventListener("submit", e => {
    e.preventDefault();
    token = document.getElementById("key").value.trim();
    document.getElementById("key").value = "";
    shown = "";
  });
  document.getElementById("create-stream").addEventListener("click", confirmCreate);
  document.getElementById("dialog-cancel").addEventListener("click", () => dialog().close());
  document.getElementById("dialog-confirm").addEventListener("click", e => {
    if (onConfirm) run(e.target, onConfirm);
  });
  document.getElementById("dialog-plan-button").addEventListener("click", e => {
    if (onPlan) run(e.target, onPlan);
  });
  document.getElementById("browse-form").addEventListener("submit", e => { e.preventDefault(); browse(false); });
  document.getElementById("browse-next").addEventListener("click", () => browse(true));
  document.getElementById("browse-from").addEventListener("change", browseFromChanged);
  document.getElementById("browse-stream").addEventListener("change", () => state && fillBrowseChoices(state));
  document.getElementById("browse-binary").addEventListener("change", () => {
    for (const row of document.querySelectorAll("#records-table tr[data-kind=binary] pre.data")) {
      const b64 = row.dataset.b64;
      if (b64) row.textContent = value("browse-binary") === "hex" ? hexOf(b64) : b64;
    }
  });
  browseFromChanged();
  poll();
  pollHistory();
}

setup();
