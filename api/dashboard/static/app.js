// shoal dashboard: reads this agent's APIs with the API key kept in
// localStorage (entered in the key dialog, or taken from a login link's
// #key=KEY fragment by login.js) and redraws every few seconds. No
// framework, no build step.
'use strict';

const KEY_STORE = 'shoal.apiKey';
const params = new URLSearchParams(location.search);
const INTERVAL = Math.max(250, Number(params.get('interval')) || 2000);
const SPARK_POINTS = 60;

const $ = (id) => document.getElementById(id);

let apiKey = localStorage.getItem(KEY_STORE) || '';
let timer = null;
let prevGen = null; // {t, v}: the previous scrape of shoal_generated_tokens_total
const rates = [];
let nodeNames = {}; // id -> name

class AuthError extends Error {}

async function get(path, asText) {
  const r = await fetch(path, { headers: { Authorization: 'Bearer ' + apiKey }, cache: 'no-store' });
  if (r.status === 401 || r.status === 403) {
    let msg = 'the API key was refused';
    try { const b = await r.json(); msg = (b.error && (b.error.message || b.error)) || msg; } catch (e) { /* not JSON */ }
    throw new AuthError(msg);
  }
  if (!r.ok) {
    let msg = r.status + ' ' + r.statusText;
    try { const b = await r.json(); msg += ': ' + ((b.error && (b.error.message || b.error)) || ''); } catch (e) { /* not JSON */ }
    throw new Error(path + ': ' + msg);
  }
  return asText ? r.text() : r.json();
}

// parseMetrics reads the Prometheus text format into [{name, labels, value}].
function parseMetrics(text) {
  const out = [];
  const lineRe = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const labelRe = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const line of text.split('\n')) {
    if (line === '' || line[0] === '#') continue;
    const m = lineRe.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) {
      for (const l of m[2].matchAll(labelRe)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function metricSum(ms, name, match) {
  let sum = 0, found = false;
  for (const m of ms) {
    if (m.name !== name) continue;
    if (match && Object.keys(match).some((k) => m.labels[k] !== match[k])) continue;
    sum += m.value; found = true;
  }
  return found ? sum : null;
}

// --- formatting ---
const fmtInt = (v) => (v == null ? '—' : Math.round(v).toLocaleString('en-US'));
function fmtNum(v, digits) {
  if (v == null || !isFinite(v)) return '—';
  return v.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
function fmtBytes(b) {
  if (!b) return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function fmtAgo(ts) {
  const t = Date.parse(ts);
  if (!t || t < 0) return '—';
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 60) return Math.round(s) + 's ago';
  if (s < 3600) return Math.round(s / 60) + 'm ago';
  if (s < 86400) return (s / 3600).toFixed(1) + 'h ago';
  return (s / 86400).toFixed(1) + 'd ago';
}
function fmtMs(s) { return s == null || !isFinite(s) ? '—' : (s * 1000).toFixed(s < 0.01 ? 2 : 1) + ' ms'; }

// el builds an element; children are nodes or text (never parsed as HTML).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else if (k === 'title') e.title = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? '' : String(c)));
  return e;
}
const td = (v, cls) => el('td', cls ? { class: cls } : null, v);
const num = (v) => td(v, 'num');

function fill(tableId, rows, cols, emptyText) {
  const tbody = $(tableId).tBodies[0];
  if (rows.length === 0) rows = [el('tr', { class: 'empty' }, el('td', { colspan: String(cols) }, emptyText))];
  tbody.replaceChildren(...rows);
}

// --- sections ---
function renderStatus(st) {
  const h = $('health');
  h.textContent = st.health || 'unknown';
  h.className = 'badge ' + (st.health || '');
  const leader = st.leader_name || (st.leader ? st.leader.slice(0, 8) : 'none');
  $('cluster-summary').textContent = `answering: ${st.node_name} · leader: ${leader} · nodes alive: ${st.nodes_alive}/${st.nodes}` +
    ` · tolerates ${st.failure_tolerance} server failure${st.failure_tolerance === 1 ? '' : 's'}`;
}

function renderNodes(nodes, st) {
  nodeNames = {};
  const voters = {};
  for (const s of (st && st.servers) || []) voters[s.id] = s;
  const rows = (nodes || []).slice().sort((a, b) => a.name.localeCompare(b.name)).map((n) => {
    nodeNames[n.id] = n.name;
    const srv = voters[n.id];
    let raft = '—';
    if (srv) raft = srv.leader ? 'leader' : srv.voter ? 'voter' : 'non-voter';
    else if (st && st.leader === n.id) raft = 'leader';
    const status = el('span', { class: 'pill status-' + n.status }, n.status + (n.draining ? ' · draining' : ''));
    const c = n.caps || {};
    const mem = c.mem_total ? fmtBytes(c.mem_total) + (c.mem_free ? ' (' + fmtBytes(c.mem_free) + ' free)' : '') : '—';
    return el('tr', { 'data-node': n.name },
      td(n.name), td(n.id.slice(0, 8), 'mono'), td(n.role), el('td', null, status), td(raft),
      td(n.rpc_addr || n.addr, 'mono'), td(n.http_addr || '—', 'mono'), td((n.version || '—') + (n.protocol ? ' p' + n.protocol : ''), 'mono'),
      num(c.cores || '—'), num(mem), num(c.gflops ? fmtNum(c.gflops, 1) : '—'), num(c.mem_gbps ? fmtNum(c.mem_gbps, 1) : '—'),
      td(c.gpu ? `${c.gpu} (${fmtBytes(c.gpu_mem)}, ${fmtNum(c.gpu_gbps, 1)} GB/s) + ${c.accel || 'cpu'}` : (c.accel || 'cpu')), td(fmtAgo(n.status_since)));
  });
  fill('nodes', rows, 14, 'no nodes registered yet');
}

// planOf describes a model's committed plan from the cluster's model list
// (GET /v1/cluster/models): "plan v2: [0,11)@mac1 → [11,22)@mac2 (3.1
// ms/token predicted)". A --model and a loaded model both have one.
function planOf(info) {
  if (!info || !info.plan_version || !(info.shards || []).length) return null;
  const chain = (shards) => shards.map((s) => `[${s.lo},${s.hi})@${s.node_name || s.node}` +
    (s.gpu_layers ? ` (${s.gpu_layers} on GPU)` : '')).join(' → ');
  // A disaggregated plan: "decode: [0,22)@mac; prefill: [0,22)@gpu".
  const pools = [...new Set(info.shards.map((s) => s.pool || ''))];
  const stages = pools.length > 1 || pools[0]
    ? pools.map((p) => `${p || 'shared'}: ${chain(info.shards.filter((s) => (s.pool || '') === p))}`).join('; ')
    : chain(info.shards);
  return `plan v${info.plan_version}: ${stages}` +
    (info.predicted_ms_per_token ? ` (${fmtNum(info.predicted_ms_per_token, 1)} ms/token predicted)` : '');
}

// placementOf finds a placement for model: its committed plan in the
// cluster's model list, else one in the status or the model entry when the
// agent reports it; otherwise it says the model runs whole on its serving
// node.
function placementOf(model, st, cluster) {
  const plan = planOf((cluster || []).find((c) => c.name === model.id));
  if (plan) return plan;
  const sources = [model['shoal.placement'], st && st.placements && st.placements[model.id],
    st && st.plans && (Array.isArray(st.plans) ? st.plans.find((p) => p.model === model.id) : st.plans[model.id])];
  for (const p of sources) {
    if (!p) continue;
    if (typeof p === 'string') return p;
    const pools = p.pools || (p.stages ? [{ name: 'shared', stages: p.stages }] : null);
    if (pools) {
      return pools.map((pool) => (pool.name || pool.role || 'pool') + ': ' + (pool.stages || []).map((s) => {
        const members = (s.members || []).map((m) => nodeNames[m.node] || m.node_name || m.node || '?').join('+');
        return `[${s.lo ?? s.layer_lo ?? '?'},${s.hi ?? s.layer_hi ?? '?'})@${members}`;
      }).join(' → ')).join('; ') + (p.predicted_ms_per_token ? ` (${fmtNum(p.predicted_ms_per_token, 1)} ms/token predicted)` : '');
    }
    return JSON.stringify(p);
  }
  return `whole model on ${servingNode(model)} (not yet planned across nodes)`;
}

// servingNode names the agent that runs a model: another agent's models
// carry shoal.served_by (this agent forwards their requests).
function servingNode(model) {
  return model['shoal.served_by'] || model.owned_by || 'this agent';
}

function renderModels(list, ms, st, cluster) {
  const rows = ((list && list.data) || []).map((m) => {
    const q = metricSum(ms, 'shoal_queue_depth', { model: m.id });
    const run = metricSum(ms, 'shoal_running_sequences', { model: m.id });
    const used = metricSum(ms, 'shoal_kv_blocks_used', { model: m.id });
    const free = metricSum(ms, 'shoal_kv_blocks_free', { model: m.id });
    const batch = metricSum(ms, 'shoal_batch_tokens', { model: m.id });
    const kv = used == null ? '—' : `${fmtInt(used)} / ${fmtInt(used + (free || 0))}`;
    return el('tr', { 'data-model': m.id },
      td(m.id), td(servingNode(m)), num(m['shoal.context_length'] ? fmtInt(m['shoal.context_length']) : '—'),
      td(m['shoal.chat_template'] || '—'), num(fmtInt(q)), num(fmtInt(run)), num(kv), num(fmtInt(batch)),
      td(placementOf(m, st, cluster), 'placement'));
  });
  fill('models', rows, 9, 'this agent serves no model (start it with --model FILE)');
}

function renderMetrics(ms) {
  const now = performance.now();
  const gen = metricSum(ms, 'shoal_generated_tokens_total');
  $('gen-total').textContent = fmtInt(gen == null ? 0 : gen);
  $('prompt-total').textContent = fmtInt(metricSum(ms, 'shoal_prompt_tokens_total') ?? 0);
  if (gen != null) {
    if (prevGen && now > prevGen.t) {
      const rate = gen >= prevGen.v ? (gen - prevGen.v) / ((now - prevGen.t) / 1000) : 0; // a restart resets the counter
      rates.push(rate);
      if (rates.length > SPARK_POINTS) rates.shift();
      $('tok-s').textContent = fmtNum(rate, 1);
      drawSpark();
    }
    prevGen = { t: now, v: gen };
  }
  const byStatus = {};
  let total = 0;
  for (const m of ms) {
    if (m.name !== 'shoal_requests_total') continue;
    byStatus[m.labels.status] = (byStatus[m.labels.status] || 0) + m.value;
    total += m.value;
  }
  $('requests-total').textContent = fmtInt(total);
  $('requests-by-status').textContent = Object.keys(byStatus).sort().map((s) => `${s}: ${fmtInt(byStatus[s])}`).join(' · ');
  const q = metricSum(ms, 'shoal_queue_depth') ?? 0, run = metricSum(ms, 'shoal_running_sequences') ?? 0;
  $('queue').textContent = `${fmtInt(q)} / ${fmtInt(run)}`;
  const used = metricSum(ms, 'shoal_kv_blocks_used'), free = metricSum(ms, 'shoal_kv_blocks_free');
  if (used != null && free != null && used + free > 0) {
    const pct = (100 * used) / (used + free);
    $('kv').textContent = `${fmtInt(used)} / ${fmtInt(used + free)} (${pct.toFixed(0)}%)`;
    $('kv-bar').style.width = pct.toFixed(1) + '%';
  } else {
    $('kv').textContent = '—';
  }
  const mean = (n) => { const s = metricSum(ms, n + '_sum'), c = metricSum(ms, n + '_count'); return c ? s / c : null; };
  $('latency').textContent = `${fmtMs(mean('shoal_ttft_seconds'))} / ${fmtMs(mean('shoal_inter_token_seconds'))}`;
}

// renderTraffic shows every agent's requests summed by model (GET
// /dashboard/api/cluster-traffic): what the cluster answered, wherever the
// clients sent their requests.
function renderTraffic(t) {
  const answered = (t.answered || []).length;
  $('traffic-note').textContent = t.missing && t.missing.length
    ? `(${answered} agent${answered === 1 ? '' : 's'}; not answering: ${t.missing.join(', ')})`
    : `(every agent: ${answered})`;
  const rows = (t.models || []).map((m) => el('tr', { 'data-model': m.model },
    td(m.model), num(fmtInt(m.requests)), num(fmtInt(m.errors)), num(fmtInt(m.prompt_tokens)), num(fmtInt(m.generated_tokens)),
    num(m.ttft_count ? fmtNum(m.ttft_ms_sum / m.ttft_count, 1) : '—'),
    num(m.inter_token_count ? fmtNum(m.inter_token_ms_sum / m.inter_token_count, 2) : '—')));
  fill('traffic', rows, 7, 'no requests yet');
}

function drawSpark() {
  const max = Math.max(1, ...rates);
  const step = 120 / (SPARK_POINTS - 1);
  const off = SPARK_POINTS - rates.length;
  const pts = rates.map((r, i) => `${((off + i) * step).toFixed(1)},${(29 - (28 * r) / max).toFixed(1)}`).join(' ');
  $('tok-spark').querySelector('polyline').setAttribute('points', pts);
}

// renderLinks shows this agent's traffic with each peer from its metrics
// (eBPF counters where the agent could load them, else QUIC's own), with
// the rates since the previous refresh.
let prevLinks = null; // {t, bytes: {peer|direction: value}}
function renderLinks(ms) {
  const info = ms.find((m) => m.name === 'shoal_net_telemetry_info');
  const source = info ? info.labels.source : null;
  $('links-note').textContent = source ? `(this agent's view, counted by ${source}${info.labels.reason ? ': ' + info.labels.reason : ''})` : '';
  const peers = {};
  const now = performance.now();
  const bytes = {};
  for (const m of ms) {
    if (!m.name.startsWith('shoal_peer_')) continue;
    const key = m.labels.addr;
    const p = peers[key] || (peers[key] = { peer: m.labels.peer, addr: m.labels.addr });
    if (m.name === 'shoal_peer_bytes_total' && m.labels.source === source) {
      p[m.labels.direction] = m.value;
      bytes[key + '|' + m.labels.direction] = m.value;
    } else if (m.name === 'shoal_peer_rtt_seconds') p.rtt = m.value;
    else if (m.name === 'shoal_peer_packets_lost_total') p.lost = m.value;
    else if (m.name === 'shoal_peer_interface_info') p.iface = m.labels.iface;
  }
  const rate = (key, dir) => {
    if (!prevLinks || now <= prevLinks.t) return '—';
    const a = prevLinks.bytes[key + '|' + dir], b = bytes[key + '|' + dir];
    if (a == null || b == null || b < a) return '—';
    return fmtBytes((b - a) / ((now - prevLinks.t) / 1000)) + '/s';
  };
  prevLinks = { t: now, bytes };
  const rows = Object.keys(peers).sort().map((key) => {
    const p = peers[key];
    return el('tr', { 'data-peer': p.peer }, td(p.peer), td(p.addr, 'mono'), td(p.iface || '—'),
      num(fmtBytes(p.tx)), num(fmtBytes(p.rx)), num(rate(key, 'tx')), num(rate(key, 'rx')),
      num(p.rtt ? fmtNum(p.rtt * 1000, 3) : '—'), num(fmtInt(p.lost)));
  });
  fill('links', rows, 9, 'no traffic with other nodes yet');
}

function renderRequests(body) {
  const recs = (body && body.requests) || [];
  $('requests-note').textContent = body && body.capacity ? `(last ${body.capacity} kept by this agent)` : '';
  const rows = recs.map((r) => el('tr', { 'data-seq': String(r.seq) },
    td(new Date(r.time).toLocaleTimeString()), td(r.endpoint + (r.stream ? ' (stream)' : '')), td(r.model || '—'),
    el('td', null, el('span', { class: 'pill ' + (r.status === 200 ? 'status-alive' : r.status >= 500 || r.status === 0 ? 'status-failed' : 'status-suspect') }, String(r.status))),
    td(r.finish_reason || '—'), num(fmtInt(r.prompt_tokens)), num(fmtInt(r.generated_tokens)),
    num(r.ttft_ms ? fmtNum(r.ttft_ms, 1) : '—'), num(r.tokens_per_second ? fmtNum(r.tokens_per_second, 1) : '—'),
    num(fmtNum(r.duration_ms, 1))));
  fill('requests', rows, 10, 'no requests yet');
}

// --- loop ---
function showError(msg) {
  const e = $('error');
  e.textContent = msg || '';
  e.hidden = !msg;
}

function askKey(msg) {
  stop();
  $('key-error').textContent = msg || '';
  $('key-error').hidden = !msg;
  $('key-dialog').hidden = false;
  $('api-key').value = '';
  $('api-key').focus();
}

async function refresh() {
  const [st, nodes, models, metrics, reqs, plans, traffic] = await Promise.allSettled([
    get('/v1/status'), get('/v1/nodes'), get('/v1/models'), get('/metrics', true), get('/dashboard/api/requests'),
    get('/v1/cluster/models'), get('/dashboard/api/cluster-traffic'),
  ]);
  const all = [st, nodes, models, metrics, reqs, plans, traffic];
  const auth = all.find((r) => r.status === 'rejected' && r.reason instanceof AuthError);
  // A key the model list accepts but the cluster API refuses is an
  // inference key: it can chat but not read the cluster's status.
  const limited = !!auth && models.status === 'fulfilled';
  if (auth && !limited) {
    askKey(auth.reason.message);
    return false;
  }
  $('limited').hidden = !limited;
  const val = (r) => (r.status === 'fulfilled' ? r.value : null);
  const ms = metrics.status === 'fulfilled' ? parseMetrics(metrics.value) : [];
  if (st.status === 'fulfilled') renderStatus(st.value);
  if (nodes.status === 'fulfilled') renderNodes(nodes.value, val(st));
  if (models.status === 'fulfilled') renderModels(models.value, ms, val(st), val(plans));
  if (metrics.status === 'fulfilled') { renderMetrics(ms); renderLinks(ms); }
  if (reqs.status === 'fulfilled') renderRequests(reqs.value);
  if (traffic.status === 'fulfilled') renderTraffic(traffic.value);
  if (limited) {
    const refused = (r) => r.status === 'rejected' && r.reason instanceof AuthError;
    const no = 'this key cannot read cluster status';
    if (refused(st)) { $('health').textContent = 'key cannot read status'; $('health').className = 'badge'; $('cluster-summary').textContent = ''; }
    if (refused(nodes)) fill('nodes', [], 14, no);
    if (refused(reqs)) { fill('requests', [], 10, no); $('requests-note').textContent = ''; }
    if (refused(traffic)) { fill('traffic', [], 7, no); $('traffic-note').textContent = ''; }
  }
  const errs = all.filter((r) => r.status === 'rejected' && !(r.reason instanceof AuthError)).map((r) => r.reason.message);
  showError(errs.join(' · '));
  $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  return true;
}

function stop() {
  if (timer) clearTimeout(timer);
  timer = null;
}

async function loop() {
  stop();
  let ok = true;
  try { ok = await refresh(); } catch (e) { showError(String(e)); }
  if (ok) timer = setTimeout(loop, INTERVAL);
}

function start() {
  $('key-dialog').hidden = true;
  prevGen = null;
  rates.length = 0;
  loop();
}

document.addEventListener('DOMContentLoaded', () => {
  $('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    apiKey = $('api-key').value.trim();
    if (!apiKey) return;
    localStorage.setItem(KEY_STORE, apiKey);
    start();
  });
  $('change-key').addEventListener('click', () => askKey(''));
  window.addEventListener('shoal:key', () => { // a login link opened on this page
    apiKey = localStorage.getItem(KEY_STORE) || '';
    if (apiKey) start();
  });
  if (apiKey) start(); else askKey('');
});
