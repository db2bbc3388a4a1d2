'use strict';
// Polls /api/status and /api/history every 2 s and redraws. No library:
// the charts are SVG drawn here; every point is a <circle class="pt"
// data-series=... data-round=...> and every axis label a <text
// class="ytick|xtick" data-value=...> (the e2e test counts and checks them).
const POLL_MS = 2000;
// WorkerStatus.state of a worker that is no longer a member
// (common/worker_state.h). "finished" is not among them: after the run's
// last round every member is finished, and they are the run's members.
const DEPARTED = new Set(['left', 'lost', 'evicted']);
const MAX_ROUNDS = 10000;
// The header's and the time panel's medians are over this many rounds.
const RECENT = 20;
// serverNow: the coordinator's clock (the answer's Date header), for the
// elapsed time and the ETA; skewMs = serverNow - the browser's clock.
// drawn: what the charts were drawn from (they are redrawn when it changes).
const st = { rounds: [], checkpoints: [], after: 0, skewMs: 0, drawn: '' };

const num = (v) => (v === undefined || v === null || v === '' ? 0 : Number(v));
const esc = (s) => String(s === undefined || s === null ? '' : s).replace(/[&<>"']/g,
  (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
const $ = (id) => document.getElementById(id);
function bytes(n) {
  n = num(n);
  if (n < 1024) return Math.round(n) + ' B';
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
// A duration in seconds: "0.42 s", "12.3 s", "4m 05s", "2h 03m", "3d 04h".
function dur(s) {
  if (s === null || s === undefined || !isFinite(s) || s < 0) return '-';
  const p = (n) => String(n).padStart(2, '0');
  if (s < 10) return s.toFixed(2) + ' s';
  if (s < 60) return s.toFixed(1) + ' s';
  s = Math.round(s);
  if (s < 3600) return `${Math.floor(s / 60)}m ${p(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${p(Math.floor(s / 60) % 60)}m`;
  return `${Math.floor(s / 86400)}d ${p(Math.floor(s / 3600) % 24)}h`;
}
// A rate with an SI prefix: "830", "12.4 k", "3.10 M".
function si(v) {
  if (v === null || v === undefined || !isFinite(v)) return '-';
  const a = Math.abs(v);
  for (const [u, m] of [['G', 1e9], ['M', 1e6], ['k', 1e3]]) {
    if (a >= m) return (v / m).toFixed(v / m < 10 ? 2 : 1) + ' ' + u;
  }
  return v.toFixed(a < 10 ? 2 : 0);
}
// Date, time and zone of ms since the epoch, in the browser's zone:
// "2026-11-28 17:31:26 UTC" or "2026-11-28 18:31:26 UTC+01:00".
function when(ms) {
  ms = num(ms);
  if (!ms) return '-';
  const d = new Date(ms);
  const p = (n) => String(n).padStart(2, '0');
  const off = -d.getTimezoneOffset();
  const zone = off === 0 ? 'UTC' :
    `UTC${off > 0 ? '+' : '-'}${p(Math.floor(Math.abs(off) / 60))}:${p(Math.abs(off) % 60)}`;
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
    `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())} ${zone}`;
}
const timeTag = (ms) => (num(ms) ? `<time datetime="${new Date(num(ms)).toISOString()}">${when(ms)}</time>` : '-');
function median(xs) {
  const v = xs.filter((x) => x !== null && x !== undefined && isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return null;
  const n = v.length;
  return n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Axis ticks at round numbers: a step of 1, 2 or 5 x 10^k giving at most
// about `n` intervals over [lo, hi]; `integer` keeps the step >= 1 (rounds).
// Returns {ticks, step, dec}: the ticks from the multiple of step at or
// below lo to the one at or above hi, and the decimals the step needs.
function niceTicks(lo, hi, n, integer) {
  if (!(hi > lo)) { const d = Math.abs(lo) || 1; lo -= d / 2; hi += d / 2; }
  const raw = (hi - lo) / Math.max(1, n);
  const k = Math.floor(Math.log10(raw));
  const p = Math.pow(10, k);
  const m = raw / p;
  let step = Number(((m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p).toPrecision(6));
  if (integer && step < 1) step = 1;
  const dec = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const a = Math.floor(lo / step + 1e-9), b = Math.ceil(hi / step - 1e-9);
  const ticks = [];
  for (let i = a; i <= b; i++) ticks.push(Number((i * step).toFixed(dec)));
  return { ticks, step, dec };
}
// A tick's label: its value with the step's decimals, or with a k/M/G
// prefix when the ticks reach 10,000 ("20k", "1.5M").
function tickLabel(v, step, dec, top) {
  for (const [u, m] of [['G', 1e9], ['M', 1e6], ['k', 1e3]]) {
    if (top >= 10 * m || (m > 1e3 && top >= m)) {
      const d = Math.max(0, -Math.floor(Math.log10(step / m) + 1e-9));
      return v === 0 ? '0' : (v / m).toFixed(d) + u;
    }
  }
  return v.toFixed(dec);
}

// series: [{name, color, points: [[round, value], ...]}]. opts: w, h (the
// viewBox), zero (the y axis starts at 0), min/max (fixed y range).
function chart(el, series, opts) {
  const W = opts.w || 560, H = opts.h || 230, L = 48, R = 12, T = 10, B = 30;
  series = series.map((s) => ({ ...s, points: s.points.filter((p) => p[1] !== null && p[1] !== undefined && isFinite(p[1])) }));
  const all = series.flatMap((s) => s.points);
  let svg = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${W} ${H}" width="100%" data-points="${all.length}">`;
  if (all.length === 0) {
    el.innerHTML = svg + `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">no completed round yet</text></svg>`;
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let lo = opts.min !== undefined ? opts.min : opts.zero ? 0 : Math.min(...all.map((p) => p[1]));
  let hi = opts.max !== undefined ? opts.max : Math.max(...all.map((p) => p[1]));
  if (opts.zero && hi <= 0) hi = 1;
  const yt = niceTicks(lo, hi, 4, false);
  const y0 = yt.ticks[0], y1 = yt.ticks[yt.ticks.length - 1];
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const top = Math.max(Math.abs(y0), Math.abs(y1));
  for (const v of yt.ticks) {
    svg += `<line class="grid" x1="${L}" x2="${W - R}" y1="${Y(v)}" y2="${Y(v)}"/>` +
      `<text class="ytick" data-value="${v}" x="${L - 4}" y="${Y(v) + 4}" text-anchor="end">${tickLabel(v, yt.step, yt.dec, top)}</text>`;
  }
  const xt = niceTicks(x0, x1, Math.min(6, Math.max(1, Math.round(x1 - x0))), true);
  for (const r of xt.ticks) {
    if (r < x0 || r > x1) continue;
    svg += `<text class="xtick" data-value="${r}" x="${X(r)}" y="${H - B + 14}" text-anchor="middle">${r}</text>`;
  }
  svg += `<line class="axis" x1="${L}" x2="${L}" y1="${T}" y2="${H - B}"/>` +
    `<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>` +
    `<text x="${(L + W - R) / 2}" y="${H - 2}" text-anchor="middle">round</text>`;
  const dots = all.length <= 400;  // beyond that the dots hide the line
  for (const s of series) {
    if (s.points.length === 0) continue;
    svg += `<polyline class="line" stroke="${s.color}" points="${s.points.map((p) => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' ')}"/>`;
    for (const p of s.points) {
      svg += `<circle class="pt" data-series="${s.name}" data-round="${p[0]}" data-value="${p[1]}" cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="${dots ? 3 : 0}" fill="${s.color}"><title>round ${p[0]}: ${s.label ? s.label(p[1]) : p[1]}</title></circle>`;
    }
  }
  el.innerHTML = svg + '</svg>';
}

// Samples a round trained: every participant runs local_steps steps of
// batch_size samples (TrainingConfig), so local_steps x batch_size x
// RoundSummary.participants; over RoundSummary.seconds. The status has no
// samples counter of sync rounds (late work folded into a later round is
// not counted); a gossip run has no rounds (null).
function samplesPerSecond(cfg, r) {
  const t = cfg.training || {};
  const samples = num(t.local_steps) * num(t.batch_size) * num(r.participants);
  return samples > 0 && r.seconds > 0 ? samples / r.seconds : null;
}
// RoundSummary lacks the exchange's bytes: /api/history's wire_bytes is what
// the round's participants received (WorkerStatus.bytes_received of that
// wire_round when the coordinator saw the round complete); null = unknown.
const wirePerSecond = (r) => (r.wire_bytes !== null && r.wire_bytes !== undefined && r.seconds > 0 ? r.wire_bytes / r.seconds : null);

// Workers evicted for a hash mismatch, by round ("model hash mismatch in
// round N", services/coordinator/core/sync_rounds.cc): the minority of
// that round; its participants (the summary's count) agreed.
function mismatches(workers) {
  const out = new Map();
  for (const w of workers) {
    const m = /model hash mismatch in round (\d+)/.exec(w.reason || '');
    if (w.state === 'evicted' && m) {
      const r = Number(m[1]);
      if (!out.has(r)) out.set(r, []);
      out.get(r).push(w.id);
    }
  }
  return out;
}

// "eu/paris" -> its depth and last segment; "" is the root.
const zoneName = (p) => (p ? p.split('/').pop() : '(root)');

function renderHeader(s, cfg, members, departed) {
  const rounds = num((cfg.sync || {}).rounds);
  $('run').textContent = `run ${s.run_id || '?'} · model ${(cfg.model || {}).name || '?'}` + (cfg.gossip ? ' · gossip' : '') + (s.replica_role ? ` · ${s.replica_role}` : '');
  const phase = s.phase || 'PHASE_UNSPECIFIED';
  $('phase').textContent = phase;
  $('phase').className = 'phase ' + phase;
  $('round').textContent = `round ${num(s.round)} · completed ${num(s.last_completed_round)}` + (rounds ? ` of ${rounds}` : '');
  $('members').textContent = `${num(s.members)} members · ${(s.participants || []).length} participants · ${num(s.queued)} queued` + (departed.length ? ` · ${departed.length} departed` : '');
  $('detail').textContent = s.detail || '';

  const set = (id, html, title) => {
    $(id).querySelector('.v').innerHTML = html;
    if (title) $(id).querySelector('.v').title = title;
  };
  const now = Date.now() + st.skewMs;
  const started = num(s.started_unix_ms);
  const r = st.rounds;
  const last = r.length ? r[r.length - 1] : null;
  const recent = r.slice(-RECENT);
  const med = median(recent.map((x) => x.seconds));
  const finished = phase === 'FINISHED';
  set('stat-started', started ? timeTag(started) : '-');
  // A finished run: until its last round completed, when this coordinator saw it.
  const end = finished && last && num(last.unix_ms) ? num(last.unix_ms) : now;
  set('stat-elapsed', started ? dur((end - started) / 1000) + (finished ? ' (finished)' : '') : '-');
  set('stat-round-time', last ? `last ${dur(last.seconds)} · median ${dur(med)}` : '-');
  const sps = last ? samplesPerSecond(cfg, last) : null;
  set('stat-samples', sps === null ? '-' : `${si(sps)}` + (recent.length > 1 ? ` · median ${si(median(recent.map((x) => samplesPerSecond(cfg, x))))}` : ''));
  // Members only: their latest exchange's bytes over that round's seconds.
  let wr = 0;
  for (const w of members) wr = Math.max(wr, num(w.wire_round));
  const inWr = members.filter((w) => num(w.wire_round) === wr && wr > 0);
  const recv = inWr.reduce((a, w) => a + num(w.bytes_received), 0);
  const wrRound = r.find((x) => x.round === wr);
  set('stat-bytes', wrRound && wrRound.seconds > 0 ? `${bytes(recv / wrRound.seconds)}/s` : '-',
    wr ? `round ${wr}: ${bytes(recv)} received by ${inWr.length} members in ${wrRound ? dur(wrRound.seconds) : '?'}` : '');
  let eta = '-';
  if (finished) eta = 'done';
  else if (!rounds) eta = 'no last round (--rounds=0)';
  else if (med !== null) {
    const left = Math.max(0, rounds - num(s.last_completed_round));
    const secs = left * med;
    eta = `${dur(secs)} · ${left} rounds left · at ${timeTag(now + secs * 1000)}`;
  }
  set('stat-eta', eta);
  // Hash of the last completed round: the workers that reported it.
  const lcr = num(s.last_completed_round);
  const reported = (s.workers || []).filter((w) => num(w.model_round) === lcr && w.state !== 'evicted');
  const agree = reported.filter((w) => w.model_hash === s.model_hash).length;
  const bad = (mismatches(s.workers || []).get(lcr) || []).length + reported.length - agree;
  const h = $('stat-hash').querySelector('.v');
  if (!lcr || !s.model_hash) {
    h.textContent = '-';
    h.className = 'v';
  } else {
    h.textContent = `round ${lcr}: ${agree} of ${agree + bad} agree (${s.model_hash.slice(0, 12)})`;
    h.className = 'v ' + (bad ? 'bad' : 'good');
    h.dataset.agree = String(agree);
    h.dataset.disagree = String(bad);
  }
}

function renderCharts(cfg) {
  const r = st.rounds;
  chart($('loss-chart'), [
    { name: 'train_loss', color: '#1d3557', points: r.map((x) => [x.round, x.train_loss]) },
    { name: 'test_loss', color: '#e76f51', points: r.filter((x) => x.evaluated).map((x) => [x.round, x.test_loss]) },
  ], {});
  chart($('accuracy-chart'), [
    { name: 'test_accuracy', color: '#2a9d8f', points: r.filter((x) => x.evaluated).map((x) => [x.round, x.test_accuracy]) },
  ], {});
  const small = { w: 380, h: 210, zero: true };
  chart($('duration-chart'), [
    { name: 'round_seconds', color: '#1d3557', points: r.map((x) => [x.round, x.seconds]), label: dur },
    { name: 'exchange_seconds', color: '#2a9d8f', points: r.map((x) => [x.round, x.exchange_seconds]), label: dur },
  ], small);
  chart($('samples-chart'), [
    { name: 'samples_per_second', color: '#457b9d', points: r.map((x) => [x.round, samplesPerSecond(cfg, x)]), label: si },
  ], small);
  // In the binary unit of the largest value, so the ticks are round
  // numbers of KiB/s, MiB/s, ...
  const wire = r.map((x) => [x.round, wirePerSecond(x)]).filter((p) => p[1] !== null);
  const top = Math.max(0, ...wire.map((p) => p[1]));
  let unit = 1, name = 'B/s';
  for (const [n, m] of [['KiB/s', 1024], ['MiB/s', 1 << 20], ['GiB/s', 1 << 30]]) if (top >= m) { unit = m; name = n; }
  $('bytes-unit').textContent = name;
  chart($('bytes-chart'), [
    { name: 'wire_bytes_per_second', color: '#e76f51', points: wire.map((p) => [p[0], p[1] / unit]), label: (v) => bytes(v * unit) + '/s' },
  ], small);
}

// Per member: training, to ready after training, waiting, exchanging, in
// a median round. The status has each worker's median train time
// (train_seconds_median, what it reports) and median ready time
// (ready_seconds_median: from its RoundStart to its ReportReady, as the
// coordinator measured it), both over the last 5 rounds it completed (more
// with --adaptive_deadline_rounds), but the exchange time of rounds only
// (RoundSummary.exchange_seconds, the participants' mean): the round's
// median and the exchange's are over the last TIME_WINDOW rounds, and the
// waiting part is what is left of the median round.
const TIME_WINDOW = 5;
// WorkerStatus.train_share and the others (issue 27): shares of the
// worker's recent rounds' wall time, as the coordinator sums them.
const pct = (v) => `${Math.round(100 * num(v))}%`;
function renderTime(members, cfg) {
  const recent = st.rounds.slice(-TIME_WINDOW);
  const round = median(recent.map((x) => x.seconds));
  const exch = median(recent.map((x) => x.exchange_seconds)) || 0;
  const rows = members.filter((w) => num(w.train_seconds_median) > 0 || num(w.ready_seconds_median) > 0).map((w) => {
    const train = num(w.train_seconds_median);
    const ready = Math.max(train, num(w.ready_seconds_median));
    const parts = { train, prep: ready - train, wait: round === null ? 0 : Math.max(0, round - ready - exch), exchange: round === null ? 0 : exch };
    return { w, ready, parts, total: parts.train + parts.prep + parts.wait + parts.exchange };
  });
  if (rows.length === 0 || round === null) {
    $('why').innerHTML = `<span class="muted">${cfg.gossip ? 'a gossip run has no rounds' : 'no member has completed a round yet'}</span>`;
    $('time-bars').innerHTML = '';
    return;
  }
  const scale = Math.max(round, ...rows.map((x) => x.total)) || 1;
  const slow = rows.reduce((a, b) => (b.ready > a.ready ? b : a));
  const others = median(rows.filter((x) => x !== slow).map((x) => x.ready));
  const rest = Math.max(0, round - slow.ready - exch);
  const biggest = [['waiting for the slowest participant to be ready', slow.ready], ['the exchange', exch],
    ['the rest (plan, connections, hash reports)', rest]].reduce((a, b) => (b[1] > a[1] ? b : a));
  $('why').innerHTML = `Median round <b>${dur(round)}</b> (last ${recent.length} rounds). ` +
    (rows.length > 1 ? `Slowest participant <b>${esc(slow.w.id)}</b>: ready after <b>${dur(slow.ready)}</b> (the others ${dur(others)}). ` :
      `Ready after <b>${dur(slow.ready)}</b>. `) +
    `Exchange <b>${dur(exch)}</b>` + (rest > 0 ? `; the rest <b>${dur(rest)}</b>` : '') +
    `. Most of the round: <b>${biggest[0]}</b>.`;
  const seg = (part, v) => `<i class="seg seg-${part}" data-part="${part}" data-seconds="${v.toFixed(3)}" style="width:${(100 * v / scale).toFixed(2)}%" title="${part} ${dur(v)}"></i>`;
  $('time-bars').innerHTML = rows.map((x) =>
    `<div class="trow" data-worker-time="${esc(x.w.id)}"><span class="tid">${esc(x.w.id)}${x === slow && rows.length > 1 ? ' <span class="bad">slowest</span>' : ''}</span>` +
    `<span class="bar">${seg('train', x.parts.train)}${seg('prep', x.parts.prep)}${seg('wait', x.parts.wait)}${seg('exchange', x.parts.exchange)}</span>` +
    `<span class="tnum muted">train ${dur(x.parts.train)} · ready ${dur(x.ready)} · wait ${dur(x.parts.wait)} · exchange ${dur(x.parts.exchange)}` +
    (num(x.w.train_share) + num(x.w.exchange_share) + num(x.w.idle_share) > 0
      ? ` · <span data-shares="${esc(x.w.id)}">time: training ${pct(x.w.train_share)}, exchange ${pct(x.w.exchange_share)}, idle ${pct(x.w.idle_share)}${num(x.w.rounds_in_flight) > 1 ? `, ${num(x.w.rounds_in_flight)} rounds in flight (overlapped)` : ''}</span>`
      : '') + slicePart(x.w) + `</span></div>`).join('');
}

// WorkerStatus.exchange_rate_bytes_per_second and slice_share (issue 49,
// --slice_sizing): the member's measured rate, smoothed, and the fraction
// of the model its slice held in the latest plan.
function slicePart(w) {
  const rate = num(w.exchange_rate_bytes_per_second);
  const share = num(w.slice_share);
  if (rate <= 0 && share <= 0) return '';
  return ` · <span data-slice="${esc(w.id)}">rate ${rate > 0 ? `${(rate / 1e6).toFixed(2)} MB/s` : 'not measured'}, slice ${(100 * share).toFixed(1)}%</span>`;
}

function route(w) {
  const bits = [];
  if (w.zone) bits.push(esc(w.zone));
  if (w.role === 'supernode') bits.push('<b>★ supernode</b>');
  else if (w.role === 'standby') bits.push('☆ standby');
  if (w.relayed_by) bits.push(`<span class="relay">→ via ${esc(w.relayed_by)}</span>`);
  if (w.outbound_only) bits.push(`<span class="muted" title="${esc(w.outbound_reason)}">NAT</span>`);
  return bits.join(' · ');
}
const wireCell = (w) => (num(w.wire_round) ? `${bytes(w.bytes_received)} / ${bytes(w.bytes_sent)} (${num(w.wire_round)})` : '-');
const byId = (a, b) => String(a.id).localeCompare(String(b.id), 'en', { numeric: true });

// Scores, audits and bans (issue 28, docs/SECURITY.md "Audits, scores and
// bans"): each member's score with why it moved last (the title lists the
// newest reasons), and the run's audit counts and bans under the table.
function scoreCell(w) {
  const reasons = w.score_reasons || [];
  const score = w.score === undefined ? 1 : num(w.score);
  const audited = num(w.audits_passed) + num(w.audits_failed);
  return `<td class="num${score < 1 ? ' bad' : ''}" data-score="${esc(w.id)}" title="${esc(reasons.join('\n'))}">` +
    `${score.toFixed(2)}${audited ? ` <span class="muted">(${audited} audited, ${num(w.audits_failed)} failed)</span>` : ''}` +
    `${reasons.length ? `<br><span class="muted">${esc(reasons[0])}</span>` : ''}</td>`;
}
function renderTrust(s, members) {
  const rate = num(((s.config || {}).trust || {}).audit_rate);
  const bans = s.bans || [];
  $('trust').hidden = !rate && bans.length === 0;
  if ($('trust').hidden) return;
  $('trust').innerHTML = (rate ? `Audits (rate ${rate}): <b>${num(s.audits_performed)}</b> performed, ` +
    `<b class="${num(s.audits_failed) ? 'bad' : ''}">${num(s.audits_failed)}</b> failed, ${num(s.audits_dropped)} dropped. ` : '') +
    bans.map((b) => `<span class="bad" data-ban="${esc(b.worker_id)}">banned ${esc(b.worker_id)}${b.name ? ` (${esc(b.name)})` : ''}</span>: ${esc(b.reason)}`).join(' · ');
}

function renderWorkers(s, members, departed) {
  const rows = members.map((w) => {
    const note = w.reason || w.missed_reason || (w.state === 'syncing' && num(w.sync_bytes_total) ? `sync ${bytes(w.sync_bytes_done)} / ${bytes(w.sync_bytes_total)}` : '');
    return `<tr data-worker="${esc(w.id)}"><td>${esc(w.id)}${w.name ? ` <span class="muted">${esc(w.name)}</span>` : ''}</td><td class="state-${esc(w.state)}">${esc(w.state)}</td>` +
      `<td>${esc(w.address)}</td><td>${route(w)}</td><td class="num">${num(w.data_rank)}</td><td class="num">${num(w.rounds_completed)}</td>` +
      `<td class="num">${w.state === 'finished' ? '-' : ago(w.last_seen_ms_ago)}</td><td class="num">${fixed(w.train_loss, 4)}</td>` +
      `<td class="num">${num(w.metrics_round) ? fixed(w.test_accuracy, 4) : '-'}</td>` +
      `<td class="num">${num(w.train_seconds_median) ? dur(num(w.train_seconds_median)) : '-'}</td>` +
      `<td class="num">${num(w.ready_seconds_median) ? dur(num(w.ready_seconds_median)) : '-'}</td>` +
      `<td class="num">${wireCell(w)}</td>${scoreCell(w)}<td class="muted wrap">${esc(note)}</td></tr>`;
  });
  $('workers').tBodies[0].innerHTML = rows.join('') || '<tr><td colspan="14" class="muted">no member</td></tr>';
  renderTrust(s, members);
  let recv = 0, sent = 0;
  for (const w of members) { recv += num(w.bytes_received); sent += num(w.bytes_sent); }
  $('bytes').textContent = `${members.length} members` + (departed.length ? `, ${departed.length} departed (below)` : '') +
    ` · members' latest exchange: ${bytes(recv)} received, ${bytes(sent)} sent`;

  $('departed-section').hidden = departed.length === 0;
  const count = (st) => departed.filter((w) => w.state === st).length;
  $('departed-summary').textContent = `Departed: ${departed.length} (` +
    ['left', 'lost', 'evicted'].filter((x) => count(x)).map((x) => `${count(x)} ${x}`).join(', ') + ')';
  $('departed').tBodies[0].innerHTML = departed.map((w) =>
    `<tr data-departed="${esc(w.id)}"><td>${esc(w.id)}${w.name ? ` <span class="muted">${esc(w.name)}</span>` : ''}</td><td class="state-${esc(w.state)}">${esc(w.state)}</td>` +
    `<td class="wrap">${esc(w.reason)}</td><td>${esc(w.address)}</td><td>${esc(w.zone)}</td><td class="num">${num(w.rounds_completed)}</td>` +
    `<td class="num">${wireCell(w)}</td></tr>`).join('');
}

// The zone tree (RunStatus.zones, pre-order), shown unless the run is flat.
function renderZones(s, cfg, members) {
  const zones = s.zones || [];
  const zoned = zones.some((z) => z.path || z.supernode);
  $('zones-section').hidden = !zoned;
  const topo = cfg.topology || {};
  const relayed = members.filter((w) => w.relayed_by).length;
  $('zones-mode').textContent = `supernode and standby per zone (docs/SUPERNODES.md) · relay ${topo.relay ? `on: ${relayed} members relayed` : 'off'} · hierarchy ${topo.hierarchy ? 'on' : 'off'}`;
  $('zones').tBodies[0].innerHTML = !zoned ? '' : zones.map((z) => {
    const depth = z.path ? z.path.split('/').length : 0;
    const direct = members.filter((w) => (w.zone || '') === (z.path || '')).map((w) =>
      `<span class="zm" data-zone-member="${esc(w.id)}">${esc(w.id)}` +
      (w.id === z.supernode ? ' ★' : w.id === z.standby ? ' ☆' : '') +
      (w.relayed_by ? ` <span class="relay">→ ${esc(w.relayed_by)}</span>` : '') +
      (w.outbound_only ? ' <span class="muted">NAT</span>' : '') + '</span>');
    const why = [z.reason, z.standby_reason ? 'standby ' + z.standby_reason : '',
      z.challenger ? `challenger ${z.challenger} (${num(z.challenger_rounds)} rounds)` : ''].filter((x) => x);
    return `<tr data-zone="${esc(z.path)}"><td style="padding-left:${8 + 16 * depth}px">${esc(zoneName(z.path))}</td>` +
      `<td class="num">${num(z.workers)} (${num(z.direct_members)} direct)</td><td class="zs">${esc(z.supernode || '-')}</td>` +
      `<td class="zb">${esc(z.standby || '-')}</td><td>${direct.join(' ') || '<span class="muted">-</span>'}</td>` +
      `<td class="muted wrap">${why.map(esc).join('<br>')}</td>` +
      `<td class="muted wrap">${num(z.elected_unix_ms) ? timeTag(z.elected_unix_ms) : ''}${z.cause ? ' · ' + esc(z.cause) : ''}` +
      `${num(z.changes) ? ` · ${num(z.changes)} changes` : ''}</td></tr>`;
  }).join('');
}

function renderRounds(s, cfg) {
  const bad = mismatches(s.workers || []);
  const agreement = (x) => {
    const m = bad.get(x.round) || [];
    return { ok: m.length === 0, text: m.length ? `✗ ${x.participants} of ${x.participants + m.length} (${m.join(', ')} evicted)` : `✓ ${x.participants} of ${x.participants}` };
  };
  const marks = st.rounds.slice(-200);
  $('hash-marks').innerHTML = marks.length === 0 ? '<span class="muted">no completed round yet</span>' :
    `<span class="muted">rounds ${marks[0].round}–${marks[marks.length - 1].round}: </span>` + marks.map((x) => {
      const a = agreement(x);
      return `<i class="${a.ok ? 'ok' : 'bad'}" data-hash-round="${x.round}" data-agreed="${a.ok}" title="round ${x.round}: ${esc(a.text)} · ${esc(x.model_hash || '')}"></i>`;
    }).join('');
  const rows = st.rounds.slice(-10).reverse().map((x) => {
    const a = agreement(x);
    const sps = samplesPerSecond(cfg, x), bps = wirePerSecond(x);
    return `<tr data-round="${x.round}"><td class="num">${x.round}</td><td>${timeTag(x.unix_ms)}</td><td class="num">${x.participants}</td>` +
      `<td class="num">${fixed(x.seconds, 2)}</td><td class="num">${fixed(x.exchange_seconds, 3)}</td><td class="num">${si(sps)}</td>` +
      `<td class="num">${x.wire_bytes === null || x.wire_bytes === undefined ? '-' : bytes(x.wire_bytes)}</td><td class="num">${bps === null ? '-' : bytes(bps) + '/s'}</td>` +
      `<td><code>${esc(x.model_hash || '-')}</code></td><td class="${a.ok ? 'good' : 'bad'}" data-agreed="${a.ok}">${esc(a.text)}</td></tr>`;
  });
  $('rounds').tBodies[0].innerHTML = rows.join('') || '<tr><td colspan="10" class="muted">none yet</td></tr>';
}

// The effective config (RunStatus.config) as dotted keys, and as JSON.
function flatten(o, prefix, out) {
  for (const [k, v] of Object.entries(o || {})) {
    const key = prefix ? prefix + '.' + k : k;
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) flatten(v, key, out);
    else out.push([key, Array.isArray(v) ? v.join(',') : v]);
  }
  return out;
}
function renderConfig(cfg) {
  const t = cfg.training || {}, sync = cfg.sync || {}, ex = cfg.exchange || {};
  const bits = [`model ${(cfg.model || {}).name || '?'}`];
  if (cfg.gossip) bits.push('gossip');
  else bits.push(`${num(sync.rounds) || '∞'} rounds, min ${num(sync.min_participants)} participants`);
  bits.push(`${num(t.local_steps)} local steps × batch ${num(t.batch_size)}`, `${t.optimizer || 'sgd'} lr ${t.learning_rate}`, `codec ${ex.codec || 'fp32'}`);
  if ((cfg.topology || {}).relay) bits.push('relay');
  if ((cfg.topology || {}).hierarchy) bits.push('hierarchy');
  $('config-summary').textContent = bits.join(' · ');
  $('config').innerHTML = flatten(cfg, '', []).map(([k, v]) =>
    `<div class="kv" data-key="${esc(k)}"><span class="k">${esc(k)}</span> <span class="v">${esc(v === '' ? '""' : v)}</span></div>`).join('');
  $('config-json').textContent = JSON.stringify(cfg, null, 2);
}

function render(s) {
  const cfg = s.config || {};
  const workers = (s.workers || []).slice().sort(byId);
  const departed = workers.filter((w) => DEPARTED.has(w.state));
  const members = workers.filter((w) => !DEPARTED.has(w.state));
  renderHeader(s, cfg, members, departed);
  // The curves change with the rounds only (up to 10,000 points each).
  const drawn = `${st.rounds.length}:${st.after}:${JSON.stringify(cfg.training || {})}`;
  if (drawn !== st.drawn) { renderCharts(cfg); st.drawn = drawn; }
  renderTime(members, cfg);
  renderWorkers(s, members, departed);
  renderZones(s, cfg, members);
  renderRounds(s, cfg);
  const cps = cfg.checkpoints || {};
  $('store').textContent = (cps.store ? `store ${cps.store}` + (num(cps.every) ? ` · every ${num(cps.every)} rounds` : '') : 'no --checkpoint_store') +
    (s.checkpoint_pending ? ` · uploading ${s.checkpoint_pending}` : '');
  const list = st.checkpoints.slice().reverse();
  $('checkpoints').tBodies[0].innerHTML = list.length === 0 ? '<tr><td colspan="3" class="muted">none yet</td></tr>' :
    list.map((c) => `<tr><td class="num">${c.round}</td><td>${esc(c.id)}</td><td>${timeTag(c.seen_unix_ms)}</td></tr>`).join('');
  renderConfig(cfg);
}

async function getJson(url) {
  const resp = await fetch(url, { cache: 'no-store' });
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  // The coordinator's clock (1 s resolution), for the elapsed time.
  const date = Date.parse(resp.headers.get('Date') || '');
  if (isFinite(date)) st.skewMs = date - Date.now();
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
