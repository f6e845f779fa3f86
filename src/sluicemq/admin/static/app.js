// SluiceMQ console: plain JS, no build. Every page polls the JSON API under /api/.
"use strict";

const PAGES = [["/", "Overview"], ["/destinations", "Destinations"], ["/streams", "Streams"],
               ["/connections", "Connections"]];

// -- helpers ------------------------------------------------------------------------------
const $ = (sel, root = document) => root.querySelector(sel);
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}
async function api(method, path, body) {
  const init = { method, headers: { "Accept": "application/json" } };
  if (method === "POST") {  // the console refuses non-JSON writes (see console.py)
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body || {});
  }
  const resp = await fetch(path, init);
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.error || `${resp.status} ${resp.statusText}`);
  return data;
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}
const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
const rate = (n) => (n >= 100 ? n.toFixed(0) : n.toFixed(1));
function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}
const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "–");
function toast(text, isError = false) {
  const t = $("#toast");
  t.textContent = text;
  t.className = isError ? "show error" : "show";
  clearTimeout(t._timer);
  t._timer = setTimeout(() => { t.className = ""; }, 3500);
}
async function act(fn, okText) {
  try {
    const result = await fn();
    if (okText) toast(typeof okText === "function" ? okText(result) : okText);
    return result;
  } catch (e) {
    toast(e.message, true);
    return null;
  }
}
function destUrl(kind, name) {
  return `/destination?kind=${kind}&name=${encodeURIComponent(name)}`;
}
function apiDest(kind, name) {
  return `/api/destinations/${kind}/${encodeURIComponent(name)}`;
}
function poll(fn, ms) {
  let busy = false;
  const run = async () => {
    if (busy) return;
    busy = true;
    try { await fn(); $("#status").textContent = `updated ${new Date().toLocaleTimeString()}`; }
    catch (e) { $("#status").textContent = `console unreachable: ${e.message}`; }
    finally { busy = false; }
  };
  run();
  return setInterval(run, ms);
}

// A table whose rows are re-rendered from data while keeping the user's sort and filter.
class SortableTable {
  constructor(table, columns, rowFn, { sortKey, desc = false, filterFn } = {}) {
    this.table = table; this.columns = columns; this.rowFn = rowFn;
    this.sortKey = sortKey || columns[0].key; this.desc = desc; this.filterFn = filterFn;
    this.rows = [];
    const head = el("tr", {}, columns.map((c) => el("th", {
      class: `sortable ${c.num ? "num" : ""}`, dataset: { key: c.key },
      onclick: () => { this.desc = this.sortKey === c.key ? !this.desc : !!c.num; this.sortKey = c.key; this.render(); },
    }, c.label)));
    table.replaceChildren(el("thead", {}, head), el("tbody"));
  }
  update(rows) { this.rows = rows; this.render(); }
  render() {
    const key = this.sortKey, sign = this.desc ? -1 : 1;
    let rows = this.filterFn ? this.rows.filter(this.filterFn) : this.rows.slice();
    rows.sort((a, b) => (a[key] > b[key] ? sign : a[key] < b[key] ? -sign : 0));
    for (const th of this.table.tHead.rows[0].cells) {
      th.classList.toggle("sorted-asc", th.dataset.key === key && !this.desc);
      th.classList.toggle("sorted-desc", th.dataset.key === key && this.desc);
    }
    const body = this.table.tBodies[0];
    body.replaceChildren(...rows.map(this.rowFn));
    if (!rows.length) body.append(el("tr", {}, el("td", { colspan: this.columns.length, class: "empty" }, "nothing to show")));
  }
}

// -- overview -----------------------------------------------------------------------------
function drawChart(canvas, points) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio; canvas.height = h * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, w, h);
  const pad = { l: 48, r: 10, t: 10, b: 22 };
  const span = 300;
  const now = points.length ? points[points.length - 1].t : 0;
  const max = Math.max(1, ...points.map((p) => Math.max(p.in, p.out))) * 1.15;
  const x = (t) => pad.l + (w - pad.l - pad.r) * (1 - (now - t) / span);
  const y = (v) => h - pad.b - (h - pad.t - pad.b) * (v / max);
  g.strokeStyle = "#e1e4ea"; g.fillStyle = "#6b7385"; g.font = "11px system-ui"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4, yy = y(v);
    g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(w - pad.r, yy); g.stroke();
    g.fillText(rate(v), 4, yy + 4);
  }
  for (let m = 0; m <= 5; m++) g.fillText(m ? `-${m}m` : "now", x(now - m * 60) - 10, h - 6);
  g.save();
  g.beginPath(); g.rect(pad.l, 0, w - pad.l - pad.r, h); g.clip();
  for (const [key, color] of [["in", "#2162d0"], ["out", "#17a36b"]]) {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    points.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p[key])) : g.moveTo(x(p.t), y(p[key]))));
    g.stroke();
  }
  g.restore();
}
function card(label, value, sub, id) {
  return el("div", { class: "card", id }, el("div", { class: "label" }, label),
            el("div", { class: "value" }, value), el("div", { class: "sub" }, sub || ""));
}
function limitsCard(l) {
  const of = (x) => `${num(x.used)} / ${x.limit ? num(x.limit) : "∞"}`;
  return card("Limits", of(l.destinations),
              `destinations · per user ${of(l.destinations_per_user)} · connections ${of(l.connections)} · ` +
              `per address ${of(l.connections_per_address)} · consumer waits ${num(l.consumer_waits)} · ` +
              `frames ≤ ${bytes(l.max_frame_bytes)}, headers ≤ ${bytes(l.max_header_bytes)} · ` +
              `inputs deferred ${num(l.turns_deferred)} (turn budget ${l.turn_budget_ms} ms) · ` +
              `output waiting ${bytes(l.output_buffered || 0)} / ${bytes(l.output_buffer.limit)} ` +
              `(≤ ${bytes(l.output_buffer.per_connection)} a connection) · ` +
              `WebSocket state ${bytes(l.connection_memory.used)} / ${bytes(l.connection_memory.limit)} · ` +
              `refused ${num(l.refused.connections)} connections, ${num(l.refused.destinations)} destinations`,
              "card-limits");
}
function usersCard(u) {
  const top = u.users.slice(0, 5).map((x) => `${x.user} ${bytes(x.bytes)} in ${num(x.messages)}`);
  return card("Store per user", u.user_store_limit ? `≤ ${bytes(u.user_store_limit)}` : "no share",
              u.user_store_limit ? (top.join(" · ") || "nothing stored") + " (largest first)"
                                 : "user_store_limit not set", "card-user-shares");
}
function configuredCard(c) {
  const shown = (k, v) => (k.endsWith("_bytes") || k.endsWith("_limit") || k === "journal_backlog")
    ? bytes(v) : num(v);
  return card("[limits]", `${Object.keys(c).length} settings`,
              Object.entries(c).map(([k, v]) => `${k} ${shown(k, v)}`).join(" · "),
              "card-configured-limits");
}
function overviewPage() {
  poll(async () => {
    const [o, r] = await Promise.all([api("GET", "/api/overview"), api("GET", "/api/rates?seconds=300")]);
    const mem = o.memory, j = o.journal;
    const pct = mem.limit_bytes ? ` · ${(100 * mem.rss_bytes / mem.limit_bytes).toFixed(1)}% of ${bytes(mem.limit_bytes)} (${mem.limit_source})` : "";
    $("#cards").replaceChildren(
      card("Uptime", duration(o.uptime_s), `SluiceMQ ${o.version}`, "card-uptime"),
      card("Connections", num(o.connections), `${o.durable_subscriptions} durable subscriptions`, "card-connections"),
      card("Messages in", `${rate(o.rates.in)}/s`, `${num(o.rates.total_in)} since start`, "card-in"),
      card("Messages out", `${rate(o.rates.out)}/s`, `${num(o.rates.total_out)} since start`, "card-out"),
      card("Waiting", num(o.depth), `${o.queues} queues · ${o.topics} topics`, "card-depth"),
      card("Memory (RSS)", bytes(mem.rss_bytes), pct.slice(3), "card-memory"),
      card("Journal on disk", bytes(j.disk_bytes), j.records !== undefined ? `${num(j.records)} records · fsync p99 ${j.fsync_p99_ms ? j.fsync_p99_ms.toFixed(2) + " ms" : "–"}` : "", "card-journal"),
      card("Streams", num(o.streams_in_progress), "in progress", "card-streams"),
      card("Flow control", num(o.flow.producers_waiting), `producers held now · ${num(o.flow.blocked_total)} sends held at a limit, ${num(o.flow.paced_total || 0)} paced to consumers, since start`, "card-flow"),
      card("Paged out", num(o.flow.paged), `messages on disk only · store ${bytes(o.flow.limits.store.used)} of ${bytes(o.flow.limits.store.limit)}`, "card-paged"),
      limitsCard(o.limits),
      usersCard(o.user_shares),
      configuredCard(o.limits.configured),
    );
    const bar = $("#membar > div");
    if (mem.limit_bytes) bar.style.width = `${Math.min(100, 100 * mem.rss_bytes / mem.limit_bytes)}%`;
    $("#membar span").textContent = `${bytes(mem.rss_bytes)}${mem.limit_bytes ? " of " + bytes(mem.limit_bytes) : ""}`;
    drawChart($("#chart"), r.points);
  }, 1000);
}

// -- destinations -------------------------------------------------------------------------
function destinationsPage() {
  const filter = $("#filter"), kind = $("#kind");
  const cols = [
    { key: "kind", label: "Kind" }, { key: "name", label: "Name" },
    { key: "depth", label: "Depth", num: true }, { key: "consumers", label: "Consumers", num: true },
    { key: "enqueued", label: "Enqueued", num: true }, { key: "dequeued", label: "Dequeued", num: true },
    { key: "redelivered", label: "Redelivered", num: true }, { key: "dead_lettered", label: "To DLQ", num: true },
    { key: "memory_bytes", label: "Memory", num: true },
    { key: "paged", label: "Paged", num: true },
    { key: "lag_bytes", label: "Consumer lag", num: true },
  ];
  const table = new SortableTable($("#destinations"), cols, (d) => el("tr", { dataset: { kind: d.kind, name: d.name } },
    el("td", {}, el("span", { class: `badge ${d.dlq ? "dlq" : ""}` }, d.dlq ? "dlq" : d.kind)),
    el("td", {}, el("a", { href: destUrl(d.kind, d.name) }, d.name)),
    el("td", { class: "num depth" }, num(d.depth)), el("td", { class: "num consumers" }, num(d.consumers)),
    el("td", { class: "num" }, num(d.enqueued)), el("td", { class: "num" }, num(d.dequeued)),
    el("td", { class: "num" }, num(d.redelivered)), el("td", { class: "num" }, num(d.dead_lettered)),
    el("td", { class: "num" }, bytes(d.memory_bytes)),
    el("td", { class: "num" }, num(d.paged)),
    el("td", { class: "num", title: `producers paced past ${bytes(d.max_consumer_lag)}` },
       d.lag_bytes === null ? "-" : bytes(d.lag_bytes))), {
    sortKey: "name",
    filterFn: (d) => d.name.toLowerCase().includes(filter.value.toLowerCase()) &&
                     (!kind.value || (kind.value === "dlq" ? d.dlq : d.kind === kind.value)),
  });
  filter.addEventListener("input", () => table.render());
  kind.addEventListener("change", () => table.render());
  poll(async () => table.update((await api("GET", "/api/destinations")).destinations), 1000);
}

// -- one destination ----------------------------------------------------------------------
function destinationPage() {
  const params = new URLSearchParams(location.search);
  const kind = params.get("kind") || "queue", name = params.get("name") || "";
  const base = apiDest(kind, name);
  const state = { offset: 0, limit: 20, open: new Set(), selected: new Set(), detail: null };
  $("#title").textContent = `/${kind}/${name}`;
  document.title = `/${kind}/${name} · SluiceMQ`;
  if (kind !== "queue") for (const n of document.querySelectorAll(".queue-only")) n.hidden = true;

  async function refreshDetail() {
    const d = state.detail = await api("GET", base);
    $("#dlq-actions").hidden = !d.dlq;
    $("#cards").replaceChildren(
      card("Depth", num(d.depth), `${num(d.pending)} waiting · ${num(d.inflight)} in flight`, "card-depth"),
      card("Consumers", num(d.consumers), kind === "topic" ? `${d.subscriptions} subscriptions` : ""),
      card("Enqueued", num(d.enqueued)), card("Dequeued", num(d.dequeued)),
      card("Redelivered", num(d.redelivered)), card("To DLQ", num(d.dead_lettered)),
      card("Memory", bytes(d.memory_bytes)),
      card("Consumer lag", d.lag_bytes === null ? "-" : bytes(d.lag_bytes),
           d.max_consumer_lag ? `producers paced past ${bytes(d.max_consumer_lag)}` : "no pacing"));
    const rows = d.consumers_detail.map((c) => el("tr", {},
      el("td", {}, c.subscription), el("td", {}, c.peer), el("td", {}, c.ack),
      el("td", { class: "num" }, num(c.prefetch)), el("td", { class: "num" }, num(c.inflight)),
      el("td", {}, c.selector || ""), el("td", {}, c.exclusive ? "yes" : "")));
    $("#consumers tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7, class: "empty" }, "no consumers"))]));
  }

  async function refreshMessages() {
    if (kind !== "queue") return;
    const page = await api("GET", `${base}/messages?offset=${state.offset}&limit=${state.limit}`);
    const last = Math.min(page.total, page.offset + page.messages.length);
    $("#page-info").textContent = page.total ? `${page.offset + 1}–${last} of ${num(page.total)} waiting` : "no waiting messages";
    $("#prev").disabled = page.offset === 0;
    $("#next").disabled = last >= page.total;
    const rows = [];
    for (const m of page.messages) {
      const open = state.open.has(m.mid);
      rows.push(el("tr", { class: "msg", dataset: { mid: m.mid } },
        el("td", {}, el("input", { type: "checkbox", checked: state.selected.has(m.mid),
          onchange: (e) => { e.target.checked ? state.selected.add(m.mid) : state.selected.delete(m.mid); updateSelection(); } })),
        el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); open ? state.open.delete(m.mid) : state.open.add(m.mid); refreshMessages(); } }, m.id)),
        el("td", { class: "num" }, m.priority), el("td", {}, m.persistent ? "yes" : "no"),
        el("td", { class: "num" }, bytes(m.size)), el("td", {}, when(m.timestamp)),
        el("td", { class: "preview" }, (m.binary ? "hex " : "") + m.body_preview.slice(0, 80))));
      if (open) {
        const headers = Object.entries(m.headers).map(([k, v]) => `${k}: ${v}`).join("\n");
        rows.push(el("tr", { class: "msg-detail" }, el("td", { colspan: 7 },
          el("b", {}, "Headers"), el("pre", { class: "headers" }, headers || "(none)"),
          el("b", {}, `Body (${bytes(m.size)}${m.truncated ? ", preview" : ""})`),
          el("pre", { class: "body" }, m.body_preview),
          el("a", { href: `${base}/messages/${m.mid}?raw=1`, target: "_blank" }, "download body"))));
      }
    }
    $("#messages tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7, class: "empty" }, "no waiting messages"))]));
  }

  function updateSelection() {
    const n = state.selected.size;
    $("#selection").textContent = n ? `${n} selected` : "all waiting messages";
  }
  const ids = () => (state.selected.size ? [...state.selected] : undefined);
  async function refresh() { await refreshDetail(); await refreshMessages(); }

  $("#prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); refreshMessages(); });
  $("#next").addEventListener("click", () => { state.offset += state.limit; refreshMessages(); });
  $("#purge").addEventListener("click", async () => {
    if (!confirm(`Purge every waiting message of /${kind}/${name}?`)) return;
    await act(() => api("POST", `${base}/purge`), (r) => `purged ${r.removed} message(s)`);
    state.selected.clear(); updateSelection(); refresh();
  });
  $("#delete").addEventListener("click", async () => {
    if (!confirm(`Delete /${kind}/${name} and everything it holds?`)) return;
    if (await act(() => api("DELETE", base), "deleted")) location.href = "/destinations";
  });
  for (const action of ["move", "copy"]) {
    $(`#${action}`).addEventListener("click", async () => {
      const to = $("#target").value.trim();
      if (!to) { toast("enter a target destination", true); return; }
      const r = await act(() => api("POST", `${base}/${action}`, { to, ids: ids() }),
                          (r) => `${action === "move" ? "moved" : "copied"} ${r.moved ?? r.copied} message(s) to ${to}`);
      if (r) { state.selected.clear(); updateSelection(); refresh(); }
    });
  }
  $("#retry").addEventListener("click", async () => {
    const r = await act(() => api("POST", `${base}/retry`, { ids: ids() }), (r) => `retried ${r.retried} message(s)`);
    if (r) { state.selected.clear(); updateSelection(); refresh(); }
  });
  $("#send-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const headers = {};
    for (const line of $("#send-headers").value.split("\n")) {
      const i = line.indexOf(":");
      if (i > 0) headers[line.slice(0, i).trim()] = line.slice(i + 1).trim();
    }
    await act(() => api("POST", `${base}/send`, { body: $("#send-body").value, headers,
                                                  persistent: $("#send-persistent").checked }),
              (r) => `sent ${r.id}`);
    refresh();
  });
  updateSelection();
  poll(refresh, 2000);
}

// -- streams ------------------------------------------------------------------------------
function progress(fraction, done, cls) {
  const known = fraction !== null && fraction !== undefined;
  return el("div", { class: `bar ${cls} ${known ? "" : "indeterminate"}` },
    el("div", { style: `width:${known ? (100 * fraction).toFixed(1) : 30}%` }),
    el("span", {}, known ? `${(100 * fraction).toFixed(1)}% · ${bytes(done)}` : bytes(done)));
}
function streamsPage() {
  poll(async () => {
    const data = await api("GET", "/api/streams");
    $("#streams-note").hidden = data.available;
    const rows = data.streams.map((s) => el("tr", { class: "stream", dataset: { id: s.id, state: s.state } },
      el("td", {}, s.name || s.id), el("td", {}, s.destination),
      el("td", {}, el("span", { class: `badge ${s.state}` }, s.state)),
      el("td", { class: "num" }, s.size === null ? "unknown" : bytes(s.size)),
      el("td", {}, progress(s.received_fraction, s.received_bytes, "in")),
      el("td", {}, progress(s.delivered_fraction, s.delivered_bytes, "out")),
      el("td", { class: "num" }, `${bytes(Math.round(s.receive_rate))}/s in · ${bytes(Math.round(s.deliver_rate))}/s out`),
      el("td", { class: "num" }, num(s.chunks)),
      el("td", {}, s.producer || "–"), el("td", {}, s.consumer || "–"),
      el("td", {}, s.updated ? new Date(s.updated * 1000).toLocaleTimeString() : "–")));
    $("#streams tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 11, class: "empty" }, "no streams"))]));
  }, 1000);
}

// -- connections --------------------------------------------------------------------------
function connectionsPage() {
  poll(async () => {
    const data = await api("GET", "/api/connections");
    const rows = data.connections.map((c) => el("tr", { class: "connection", dataset: { id: c.id } },
      el("td", {}, c.peer), el("td", {}, c.transport), el("td", {}, c.login || "–"),
      el("td", {}, c.client_id || "–"), el("td", {}, c.connected ? c.version : "connecting"),
      el("td", {}, `${c.heartbeat.send_ms}/${c.heartbeat.expect_ms} ms`),
      el("td", {}, c.subscriptions.map((s) => el("div", {}, el("a", { href: destUrl(s.destination.split("/")[1], s.destination.split("/").slice(2).join("/")) }, s.destination),
                                                ` ${s.ack}, ${s.inflight}/${s.prefetch} in flight`))),
      el("td", { class: "num" }, num(c.received)), el("td", { class: "num" }, num(c.delivered)),
      el("td", {}, el("button", { class: "danger close", onclick: async () => {
        if (!confirm(`Close the connection from ${c.peer}?`)) return;
        await act(() => api("DELETE", `/api/connections/${encodeURIComponent(c.id)}`), `closed ${c.peer}`);
      } }, "Close"))));
    $("#connections tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 10, class: "empty" }, "no connections"))]));
  }, 2000);
}

// -- boot ---------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  const here = location.pathname === "/destination" ? "/destinations" : location.pathname;
  document.body.prepend(el("header", {},
    el("div", { class: "brand" }, "Sluice", el("span", {}, "MQ")),
    el("nav", {}, PAGES.map(([href, label]) => el("a", { href, class: href === here ? "active" : "" }, label))),
    el("div", { class: "status", id: "status" }, "")));
  document.body.append(el("div", { id: "toast" }));
  const page = { overview: overviewPage, destinations: destinationsPage, destination: destinationPage,
                 streams: streamsPage, connections: connectionsPage }[document.body.dataset.page];
  if (page) page();
});
