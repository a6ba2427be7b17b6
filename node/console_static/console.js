// The SMS console (node/console.py): polls /api/state and draws it. Plain DOM calls, no
// library, nothing from the network; every value goes in as text (textContent), never
// as markup. Elements carry data-* attributes that the tests find (tests/integration/
// test_console.py): data-node, data-stream, data-partition + data-state, data-edge,
// data-group, data-lease + data-owner, data-consumer, data-under-replicated (the count, on
// #replication and on each stream's card; "1" on a partition short of replicas), and in
// #channels-table data-channel + data-partition + data-records + data-error ("1": failing)
// on each channel partition's row (data-partition "" on a channel with no progress yet).
"use strict";

const POLL_INTERVAL_MS = 1000;
const SVG_NS = "http://www.w3.org/2000/svg";
const BOX_WIDTH_MIN = 120;     // px: a partition box at least this wide (its text must fit)
const BOX_HEIGHT = 58;
const ROW_GAP = 38;
const WIDTH_MAX = 4000;     // px: the key space at most this wide (the page scrolls)

// a key given as ?token= is kept in memory and sent as a header; the address bar drops it
const params = new URLSearchParams(window.location.search);
const token = params.get("token") || "";
if (token) {
  params.delete("token");
  const rest = params.toString();
  window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
}

let shown = "";                // the last state drawn, without its time: redraw only on a change

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
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

function lagText(ms) {
  return ms === null || ms === undefined ? "?" : ms + " ms";
}

// --- nodes ------------------------------------------------------------------------

function drawNodes(state) {
  const rows = state.nodes.map(n => {
    const chains = el("div", {class: "chains"}, ...n.chains.map(c =>
      el("span", {"data-chain": c.stream + "/" + c.partition, "data-role": c.role},
         `${c.stream}/${c.partition} ${c.role} e${c.epoch}` + (c.state === "CLOSED" ? " (closed)" : ""))));
    const changes = el("div", {class: "chains"}, ...n.changes.map(c =>
      el("span", {}, `${c.stream}/${c.partition} e${c.epoch} ${c.action} ${when(c.at_ms)}` +
                     (c.reason ? `: ${c.reason}` : ""))));
    return el("tr", {"data-node": n.node_id},
              el("td", {}, n.node_id, n.registered ? null : el("span", {class: "warn"}, " (not registered)")),
              el("td", {}, n.address), el("td", {}, n.roles.join(", ")),
              el("td", {}, n.metrics_address),
              el("td", {}, n.chains.length ? chains : el("span", {class: "muted"}, "none")),
              el("td", {}, n.changes.length ? changes : el("span", {class: "muted"}, "none")));
  });
  return table(["node", "address", "roles", "metrics", "chains (role, epoch)", "recent changes"], rows,
               {id: "nodes-table"});
}

// --- streams: the lineage DAG ----------------------------------------------------

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
  const available = Math.max(720, (document.getElementById("streams").clientWidth || 900) - 64);
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

// --- consumer groups and stages ----------------------------------------------------

function drawGroups(stream) {
  if (!stream.groups.length) return el("p", {class: "muted"}, "No consumer groups or SPS stages.");
  return el("div", {}, ...stream.groups.map(g => {
    const leases = g.leases.map(l => el("tr", {"data-lease": l.partition, "data-owner": l.owner},
      el("td", {}, l.partition), el("td", {}, l.owner || el("span", {class: "muted"}, "free")),
      el("td", {}, l.checkpoint), el("td", {class: "num"}, l.records), el("td", {class: "num"}, l.rate),
      el("td", l.lag_ms === null ? {class: "num", title: "not known on the control node: the partition " +
                                       "is open, and its last SN is on its chain"} : {class: "num"}, lagText(l.lag_ms)), el("td", {class: "num"}, l.failures),
      el("td", {class: "num"}, l.dead_letters), el("td", {}, l.last_error),
      el("td", {}, ago(l.heartbeat_age_ms))));
    const members = g.members.map(m => `${m.member}${m.host ? "@" + m.host : ""} (${ago(m.heartbeat_age_ms)})`);
    return el("div", {"data-group": g.group},
      el("h4", {}, `group ${g.group}`, " ",
         el("span", {class: "muted"}, `${g.members.length} member(s)${members.length ? ": " + members.join(", ") : ""}` +
                                      ` · failures ${g.failures} · dead letters ${g.dead_letters}`)),
      table(["partition", "owner", "checkpoint", {label: "records", num: 1}, {label: "records/s", num: 1},
             {label: "lag", num: 1}, {label: "failures", num: 1}, {label: "dead letters", num: 1}, "last error",
             "owner's last write"], leases));
  }));
}

function drawConsumers(stream) {
  const rows = stream.consumers.map(c => el("tr", {"data-consumer": c.consumer},
    el("td", {}, c.consumer), el("td", {}, c.group ? "group" : "registered"),
    el("td", {}, Object.entries(c.checkpoints).map(([p, sn]) => `${p}: ${sn}`).join(", ") || "nothing processed")));
  if (!rows.length) return null;
  return el("div", {}, el("h4", {}, "Registered consumers"), table(["consumer", "kind", "checkpoints"], rows));
}

function drawStreams(state) {
  if (!state.streams.length) return el("p", {class: "muted"}, "No streams.");
  const cards = state.streams.map((s, i) => {
    const short = s.partitions.filter(p => p.under_replicated).length;
    return el("div", {class: "card", "data-stream": s.name, "data-under-replicated": short},
      el("h3", {}, s.name, " ", el("span", {class: "badge"}, s.status), " ",
         el("span", {class: "muted"}, `${s.partitions.filter(p => p.state === "OPEN").length} open of ` +
                                       `${s.partitions.length} partitions · replication ${s.replication_factor} · ` +
                                       `${s.persistence} · map v${s.map_version}`),
         short ? el("span", {class: "warn"}, ` · ${short} under-replicated`) : null),
      drawLineage(s, i),
      el("h4", {}, "Consumer groups and SPS stages"),
      drawGroups(s),
      drawConsumers(s));
  });
  if (state.streams_total > state.streams_shown)
    cards.push(el("p", {class: "warn"}, `${state.streams_shown} of ${state.streams_total} streams shown.`));
  return el("div", {}, ...cards);
}

// --- channels ------------------------------------------------------------------------

function durationText(ms) {
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function positionText(position) {
  if (!position) return el("span", {class: "muted"}, "none");
  return position === "SHARD_END" ? "SHARD_END (done)" : position;
}

function drawChannels(state) {
  const channels = state.channels || [];
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
    state.channels_total > channels.length ?
      el("p", {class: "warn"}, `${channels.length} of ${state.channels_total} channels shown.`) : null);
}

function drawReplication(state) {
  const short = state.under_replicated || [];
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

function drawChanges(state) {
  if (!state.changes.length) return el("p", {class: "muted"}, "None.");
  return table(["time", "stream/partition", "epoch", "action", "node", "reason"], state.changes.map(c =>
    el("tr", {"data-change": `${c.stream}/${c.partition}/${c.epoch}`},
       el("td", {}, when(c.at_ms)), el("td", {}, `${c.stream}/${c.partition}`), el("td", {}, c.epoch),
       el("td", {}, c.action), el("td", {}, c.node), el("td", {}, c.reason))));
}

// --- polling -------------------------------------------------------------------------

function draw(state) {
  const served = document.getElementById("served-by");
  const role = state.node.leader ? "leader" : "standby";
  served.replaceChildren(`served by ${state.node.node_id} `, el("span", {class: "badge " + role, id: "role"}, role),
                         state.node.leader || !state.node.leader_address ? "" :
                           ` (the leader's client address: ${state.node.leader_address})`);
  const key = JSON.stringify({...state, generated_ms: 0});
  if (key === shown) return;
  shown = key;
  document.getElementById("replication").replaceChildren(drawReplication(state));
  document.getElementById("nodes").replaceChildren(drawNodes(state));
  document.getElementById("streams").replaceChildren(drawStreams(state));
  document.getElementById("channels").replaceChildren(drawChannels(state));
  document.getElementById("changes").replaceChildren(drawChanges(state));
}

function setStatus(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.dataset.status = kind;
  status.className = kind === "ok" ? "muted" : "badge error";
}

async function poll() {
  try {
    const answer = await fetch("/api/state", {cache: "no-store",
                                              headers: token ? {Authorization: "Bearer " + token} : {}});
    const body = await answer.json();
    if (!answer.ok) throw new Error(body.error || answer.statusText);
    draw(body);
    setStatus("updated " + new Date(body.generated_ms).toLocaleTimeString(), "ok");
  } catch (e) {
    setStatus("not updated: " + e.message, "error");
  } finally {
    window.setTimeout(poll, POLL_INTERVAL_MS);
  }
}

poll();
