'use strict';
// Polls /api/status and /api/history every 2 s and redraws. No library:
// the charts are SVG drawn here; every point is a <circle class="pt"
// data-series=... data-round=...> (the e2e test counts them).
const POLL_MS = 2000;
// WorkerStatus.state of a worker that is no longer a member (common/worker_state.h).
const DEPARTED = new Set(['left', 'lost', 'finished', 'evicted']);
const MAX_ROUNDS = 10000;
const st = { rounds: [], checkpoints: [], after: 0 };

const num = (v) => (v === undefined || v === null ? 0 : Number(v));
const esc = (s) => String(s === undefined ? '' : s).replace(/[&<>"']/g,
  (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
const $ = (id) => document.getElementById(id);
function bytes(n) {
  n = num(n);
  if (n < 1024) return n + ' B';
  const u = ['KiB', 'MiB', 'GiB', 'TiB'];
  let i = -1;
  do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
  return n.toFixed(n < 10 ? 2 : 1) + ' ' + u[i];
}
function ago(ms) {
  ms = num(ms);
  if (ms < 1000) return ms + ' ms ago';
  if (ms < 120000) return (ms / 1000).toFixed(1) + ' s ago';
  return Math.round(ms / 60000) + ' min ago';
}
const fixed = (v, d) => (v === null || v === undefined || !isFinite(v) ? '-' : Number(v).toFixed(d));

// series: [{name, color, points: [[round, value], ...]}]
function chart(el, series, opts) {
  const W = 560, H = 230, L = 48, R = 12, T = 10, B = 30;
  const all = series.flatMap((s) => s.points);
  let svg = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${W} ${H}" width="100%" data-points="${all.length}">`;
  if (all.length === 0) {
    el.innerHTML = svg + `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">no completed round yet</text></svg>`;
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = opts.min !== undefined ? opts.min : Math.min(...all.map((p) => p[1]));
  let y1 = opts.max !== undefined ? opts.max : Math.max(...all.map((p) => p[1]));
  if (opts.min === undefined) y0 = Math.max(0, y0 - 0.05 * (y1 - y0));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y1 += 0.5; y0 = Math.max(0, y0 - 0.5); }
  const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4;
    svg += `<line class="grid" x1="${L}" x2="${W - R}" y1="${Y(v)}" y2="${Y(v)}"/>` +
      `<text x="${L - 4}" y="${Y(v) + 4}" text-anchor="end">${v.toFixed(opts.digits)}</text>`;
  }
  const ticks = Math.min(6, Math.round(x1 - x0));
  for (let i = 0; i <= ticks; i++) {
    const r = Math.round(x0 + (x1 - x0) * i / ticks);
    svg += `<text x="${X(r)}" y="${H - B + 14}" text-anchor="middle">${r}</text>`;
  }
  svg += `<line class="axis" x1="${L}" x2="${L}" y1="${T}" y2="${H - B}"/>` +
    `<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>` +
    `<text x="${(L + W - R) / 2}" y="${H - 2}" text-anchor="middle">round</text>`;
  const dots = all.length <= 400;  // beyond that the dots hide the line
  for (const s of series) {
    if (s.points.length === 0) continue;
    svg += `<polyline class="line" stroke="${s.color}" points="${s.points.map((p) => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' ')}"/>`;
    for (const p of s.points) {
      svg += `<circle class="pt" data-series="${s.name}" data-round="${p[0]}" data-value="${p[1]}" cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="${dots ? 3 : 0}" fill="${s.color}"><title>round ${p[0]}: ${p[1]}</title></circle>`;
    }
  }
  el.innerHTML = svg + '</svg>';
}

function render(s) {
  const cfg = s.config || {};
  const rounds = num((cfg.sync || {}).rounds);
  $('run').textContent = `run ${s.run_id || '?'} · model ${(cfg.model || {}).name || '?'}` + (cfg.gossip ? ' · gossip' : '') + (s.replica_role ? ` · ${s.replica_role}` : '');
  const phase = s.phase || 'PHASE_UNSPECIFIED';
  $('phase').textContent = phase;
  $('phase').className = 'phase ' + phase;
  $('round').textContent = `round ${num(s.round)} · completed ${num(s.last_completed_round)}` + (rounds ? ` of ${rounds}` : '');
  $('members').textContent = `${num(s.members)} members · ${(s.participants || []).length} participants · ${num(s.queued)} queued`;
  $('detail').textContent = s.detail || '';

  const r = st.rounds;
  chart($('loss-chart'), [
    { name: 'train_loss', color: '#1d3557', points: r.map((x) => [x.round, x.train_loss]).filter((p) => p[1] !== null) },
    { name: 'test_loss', color: '#e76f51', points: r.filter((x) => x.evaluated).map((x) => [x.round, x.test_loss]).filter((p) => p[1] !== null) },
  ], { digits: 3 });
  chart($('accuracy-chart'), [
    { name: 'test_accuracy', color: '#2a9d8f', points: r.filter((x) => x.evaluated).map((x) => [x.round, x.test_accuracy]).filter((p) => p[1] !== null) },
  ], { digits: 2 });

  // Members first, then the departed (left, lost, finished, evicted); each by id.
  const departed = (w) => DEPARTED.has(w.state);
  const workers = (s.workers || []).slice().sort((a, b) =>
    (departed(a) - departed(b)) || String(a.id).localeCompare(String(b.id), 'en', { numeric: true }));
  let recv = 0, sent = 0;
  const rows = workers.map((w) => {
    if (!departed(w)) { recv += num(w.bytes_received); sent += num(w.bytes_sent); }
    const note = w.reason || w.missed_reason || (w.state === 'syncing' && num(w.sync_bytes_total) ? `sync ${bytes(w.sync_bytes_done)} / ${bytes(w.sync_bytes_total)}` : '');
    return `<tr data-worker="${esc(w.id)}"><td>${esc(w.id)}${w.name ? ` <span class="muted">${esc(w.name)}</span>` : ''}</td><td class="state-${esc(w.state)}">${esc(w.state)}</td>` +
      `<td>${esc(w.address)}</td><td class="num">${num(w.data_rank)}</td><td class="num">${num(w.rounds_completed)}</td>` +
      `<td class="num">${departed(w) ? '-' : ago(w.last_seen_ms_ago)}</td><td class="num">${fixed(w.train_loss, 4)}</td>` +
      `<td class="num">${num(w.metrics_round) ? fixed(w.test_accuracy, 4) : '-'}</td>` +
      `<td class="num">${bytes(w.bytes_received)}</td><td class="num">${bytes(w.bytes_sent)}</td>` +
      `<td class="num">${num(w.wire_round) || '-'}</td><td class="muted">${esc(note)}</td></tr>`;
  });
  $('workers').tBodies[0].innerHTML = rows.join('');
  $('bytes').textContent = `${workers.filter((w) => !departed(w)).length} members, ${workers.filter(departed).length} departed · members' latest exchange: ${bytes(recv)} received, ${bytes(sent)} sent`;

  // The zone tree (RunStatus.zones, pre-order), shown unless the run is flat.
  const zones = s.zones || [];
  const zoned = zones.some((z) => z.path || z.supernode);
  $('zones-section').hidden = !zoned;
  $('zones').tBodies[0].innerHTML = !zoned ? '' : zones.map((z) => {
    const depth = z.path ? z.path.split('/').length : 0;
    const name = z.path ? z.path.split('/').pop() : '(root)';
    const since = num(z.elected_unix_ms) ? new Date(num(z.elected_unix_ms)).toLocaleTimeString() : '';
    return `<tr data-zone="${esc(z.path)}"><td style="padding-left:${8 + 16 * depth}px">${esc(name)}</td>` +
      `<td class="num">${num(z.workers)} (${num(z.direct_members)} direct)</td><td>${esc(z.supernode || '-')}</td>` +
      `<td>${esc(z.standby || '-')}</td><td class="muted">${esc(z.reason)}</td>` +
      `<td class="muted">${esc(since)}${z.cause ? ' · ' + esc(z.cause) : ''}</td></tr>`;
  }).join('');

  $('store').textContent = (cfg.checkpoint_store ? `store ${cfg.checkpoint_store}` : 'no --checkpoint_store') +
    (s.checkpoint_pending ? ` · uploading ${s.checkpoint_pending}` : '');
  const cps = st.checkpoints.slice().reverse();
  $('checkpoints').tBodies[0].innerHTML = cps.length === 0 ? '<tr><td colspan="3" class="muted">none yet</td></tr>' :
    cps.map((c) => `<tr><td class="num">${c.round}</td><td>${esc(c.id)}</td><td>${new Date(c.seen_unix_ms).toLocaleTimeString()}</td></tr>`).join('');
}

async function getJson(url) {
  const resp = await fetch(url, { cache: 'no-store' });
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

async function poll() {
  try {
    const [s, h] = await Promise.all([getJson('/api/status'), getJson('/api/history?after=' + st.after)]);
    if (h.last_round < st.after) {  // another run (or a restarted coordinator): start over
      st.rounds = []; st.after = 0;
      return setTimeout(poll, 0);
    }
    for (const x of h.rounds) {
      if (x.round > st.after) { st.rounds.push(x); st.after = x.round; }
    }
    if (st.rounds.length > MAX_ROUNDS) st.rounds.splice(0, st.rounds.length - MAX_ROUNDS);
    st.checkpoints = h.checkpoints;
    render(s);
    $('error').textContent = '';
  } catch (e) {
    $('error').textContent = 'cannot reach the coordinator (' + e.message + ')';
  }
  setTimeout(poll, POLL_MS);
}
poll();
