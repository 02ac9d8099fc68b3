// lb status page: polls /api/v1/page, keeps rate history and the timeline in this tab,
// renders with DOM nodes (server strings only ever become text, never markup).
'use strict';

const POLL_MS = 2000;
const HIDDEN_POLL_MS = 10000;
const HISTORY_S = 300;
const TIMELINE_S = 3600;
const SVG = 'http://www.w3.org/2000/svg';
const OPEN_FLOWS_TITLE = 'flows pinned to the server that are still open (nat: not closed; dsr: a ' +
  'packet within the idle timeout), counted every 5 s; 0 after a drain: the server carries nothing';

const tab = {
  since: null,        // time of the newest event held (the next poll asks from it)
  events: [],         // oldest first
  prev: null,         // {t, servers: Map, services: Map, counters: Map}
  history: new Map(), // "service|address" -> [{t, flows}]
  rates: new Map(),   // "service|address" -> {flows, bytes}
  svcRates: new Map(),
  counterRates: new Map(),
  timer: null,
  polls: 0,           // answers received (the browser test reads it from <html data-polls>)
};

function el(tag, attrs, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') n.className = v;
    else if (k === 'style') n.style.cssText = v; // CSSOM: allowed by the page's CSP
    else n.setAttribute(k, v);
  }
  for (const k of kids) {
    if (k === null || k === undefined) continue;
    n.append(k instanceof Node ? k : String(k));
  }
  return n;
}

function svg(tag, attrs, ...kids) {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
  for (const k of kids) n.append(k instanceof Node ? k : String(k));
  return n;
}

function si(value, unit = '') {
  const abs = Math.abs(value);
  const steps = [[1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
  for (const [f, p] of steps) if (abs >= f) return (value / f).toFixed(abs >= 10 * f ? 0 : 1) + ' ' + p + unit;
  const text = abs >= 10 || Number.isInteger(value) ? value.toFixed(0) : value.toFixed(1);
  return text + (unit ? ' ' + unit : '');
}

function clock(iso) {
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toTimeString().slice(0, 8);
}

function pill(state) {
  const known = ['up', 'checking', 'unhealthy', 'unavailable', 'draining', 'down'];
  return el('span', { class: 'pill s-' + (known.includes(state) ? state : 'note') }, state);
}

// ---- rates --------------------------------------------------------------------------

function rate(now, before, dt) {
  if (before === undefined || dt <= 0 || now < before) return null; // first look or reset
  return (now - before) / dt;
}

function updateRates(v) {
  const t = Date.parse(v.time) / 1000;
  const prev = tab.prev;
  const dt = prev ? t - prev.t : 0;
  const next = { t, servers: new Map(), services: new Map(), counters: new Map() };
  for (const s of v.services) {
    next.services.set(s.name, s.stats);
    const ps = prev && prev.services.get(s.name);
    tab.svcRates.set(s.name, ps ? {
      flows: rate(s.stats.flows, ps.flows, dt), bytes: rate(s.stats.bytes, ps.bytes, dt),
    } : null);
    for (const b of s.servers) {
      const key = s.name + '|' + b.address;
      next.servers.set(key, b.stats);
      const p = prev && prev.servers.get(key);
      const r = p ? { flows: rate(b.stats.flows, p.flows, dt), bytes: rate(b.stats.bytes, p.bytes, dt) } : null;
      tab.rates.set(key, r);
      if (r && r.flows !== null) {
        const h = tab.history.get(key) || [];
        h.push({ t, flows: r.flows });
        while (h.length && h[0].t < t - HISTORY_S) h.shift();
        tab.history.set(key, h);
      }
    }
  }
  for (const [name, value] of v.counters) {
    next.counters.set(name, value);
    const p = prev && prev.counters.get(name);
    tab.counterRates.set(name, p === undefined ? null : rate(value, p, dt));
  }
  // Servers that went away take their history with them.
  for (const key of tab.history.keys()) if (!next.servers.has(key)) tab.history.delete(key);
  tab.prev = next;
}

// ---- events -------------------------------------------------------------------------

function mergeEvents(v) {
  if (tab.since !== null) tab.events = tab.events.filter((e) => e.time < tab.since);
  tab.events.push(...v.events);
  const cutoff = new Date(Date.parse(v.time) - TIMELINE_S * 1000).toISOString();
  tab.events = tab.events.filter((e) => e.time >= cutoff);
  if (tab.events.length) tab.since = tab.events[tab.events.length - 1].time;
}

// ---- services -----------------------------------------------------------------------

function spark(points, max) {
  const w = 120, h = 26;
  const s = svg('svg', { class: 'spark', width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  s.append(svg('line', { class: 'base', x1: 0, y1: h - 0.5, x2: w, y2: h - 0.5 }));
  if (points.length >= 2) {
    const t1 = points[points.length - 1].t;
    // The window grows with what this tab has seen: a minute at least, five at most.
    const span = Math.min(HISTORY_S, Math.max(60, t1 - points[0].t));
    const coords = points.map((p) => {
      const x = w - ((t1 - p.t) / span) * w;
      const y = h - 1 - (max > 0 ? (p.flows / max) * (h - 3) : 0);
      return x.toFixed(1) + ',' + y.toFixed(1);
    });
    s.append(svg('polyline', { points: coords.join(' ') }));
  }
  s.append(svg('title', {}, `new flows/s, last ${HISTORY_S / 60} min (scale: ${si(max)}/s)`));
  return s;
}

function probeCell(b) {
  const td = el('td', { class: 'probes' });
  if (!b.probes.length) td.append(el('span', { class: 'muted' }, 'no probes'));
  for (const p of b.probes) {
    const title = [p.last ? 'last ' + clock(p.last) : 'not run yet',
      p.duration_ms ? p.duration_ms.toFixed(1) + ' ms' : null,
      p.fails ? p.fails + ' consecutive failures' : null].filter(Boolean).join(' · ');
    td.append(el('span', { class: 'probe ' + p.result, title, 'data-probe': p.name },
      p.name + ': ' + p.result + (p.fails > 1 ? ` (${p.fails}×)` : ''),
      p.detail ? el('span', { class: 'detail' }, ' — ' + p.detail) : null));
  }
  return td;
}

function serviceCard(s) {
  const r = tab.svcRates.get(s.name);
  const tags = [el('span', { class: 'tag' }, s.protocol), el('span', { class: 'tag' }, s.forwarding)];
  if (s.fail_open) tags.push(el('span', { class: 'tag warn', 'data-flag': 'fail-open' }, 'fail-open'));
  if (s.active_backup_level > 0) {
    tags.push(el('span', { class: 'tag warn', 'data-flag': 'backup' }, 'on backup level ' + s.active_backup_level));
  }
  if (s.spare_num > 0) tags.push(el('span', { class: 'tag info' }, s.spare_num + ' spare running'));
  const card = el('article', { class: 'service', 'data-service': s.name },
    el('h2', {}, s.name, el('span', { class: 'vip' }, s.vip), ...tags),
    el('p', { class: 'summary' },
      'active weight ', el('b', {}, s.active_weight), ' of ', el('b', {}, s.main_weight),
      ' · backup level ', el('b', {}, s.active_backup_level),
      ' · new flows ', el('b', {}, r && r.flows !== null ? si(r.flows, '/s') : '–'),
      ' · ', el('b', {}, r && r.bytes !== null ? si(r.bytes, 'B/s') : '–'),
      ' · ', si(s.stats.flows), ' flows, ', si(s.stats.bytes, 'B'), ' so far'));
  let max = 0;
  for (const b of s.servers) {
    for (const p of tab.history.get(s.name + '|' + b.address) || []) max = Math.max(max, p.flows);
  }
  const table = el('table', { class: 'servers' },
    el('thead', {}, el('tr', {}, ...['server', 'state', 'role', 'weight cfg / eff', 'Maglev share',
      'new flows/s', 'bytes/s', 'open flows', 'new flows/s, last minutes', 'probes'].map((h) => el('th', {}, h)))));
  const body = el('tbody');
  for (const b of s.servers) {
    const key = s.name + '|' + b.address;
    const br = tab.rates.get(key);
    const pct = (b.share * 100).toFixed(1) + ' %';
    body.append(el('tr', { 'data-server': b.address, 'data-state': b.state, 'data-role': b.role },
      el('td', { class: 'addr', title: b.mac ? 'MAC ' + b.mac : 'MAC unknown: not selectable' },
        b.address, b.differs_from_config.length ? el('span', { class: 'tag', title: 'changed at runtime: ' + b.differs_from_config.join(', ') }, 'runtime') : null),
      el('td', {}, pill(b.state)),
      el('td', { class: 'role' }, b.role),
      el('td', { class: 'num' }, b.weight + ' / ' + b.effective_weight),
      el('td', {}, el('div', { class: 'share' }, el('div', { class: 'bar' }, el('i', { style: `width:${(b.share * 100).toFixed(2)}%` })), el('span', { class: 'num' }, pct))),
      el('td', { class: 'num' }, br && br.flows !== null ? si(br.flows) : '–'),
      el('td', { class: 'num' }, br && br.bytes !== null ? si(br.bytes, 'B') : '–'),
      el('td', { class: 'num open', title: OPEN_FLOWS_TITLE }, b.active_flows === undefined ? '–' : si(b.active_flows)),
      el('td', {}, spark(tab.history.get(key) || [], max)),
      probeCell(b)));
  }
  table.append(body);
  card.append(table);
  return card;
}

// ---- timeline -----------------------------------------------------------------------

function describeEvent(e) {
  if (e.from === '-' && e.to === '-') return [el('span', { class: 'pill s-note' }, 'membership')];
  if (e.from === '-') return [el('span', { class: 'pill s-note' }, e.to)];
  return [pill(e.from), ' → ', pill(e.to)];
}

function strip(nowIso) {
  const now = Date.parse(nowIso);
  const w = Math.max(600, document.getElementById('strip').clientWidth || 1000), rowH = 14, pad = 16;
  const rows = [...new Set(tab.events.map((e) => e.service + ' ' + (e.server === '-' ? '(membership)' : e.server)))].sort();
  const h = pad + rows.length * rowH + 4;
  const s = svg('svg', { viewBox: `0 0 ${w} ${h}`, width: w, height: h });
  const labelW = 230;
  // The strip spans what there is to see: from 5 minutes to the full hour.
  const oldest = Math.min(...tab.events.map((e) => Date.parse(e.time)));
  const spanMin = Math.min(TIMELINE_S / 60, Math.max(5, Math.ceil(((now - oldest) / 60000) * 1.1)));
  const step = [1, 2, 5, 10, 15].find((m) => spanMin / m <= 6) || 10;
  const x = (t) => labelW + ((t - (now - spanMin * 60000)) / (spanMin * 60000)) * (w - labelW - 12);
  for (let m = 0; m <= spanMin; m += step) {
    const tx = x(now - m * 60000);
    s.append(svg('line', { x1: tx, y1: 10, x2: tx, y2: h, stroke: '#e2e5ea' }));
    s.append(svg('text', { x: tx, y: 9, 'text-anchor': m === 0 ? 'end' : 'middle' }, m === 0 ? 'now' : `-${m} min`));
  }
  rows.forEach((r, i) => s.append(svg('text', { x: 0, y: pad + i * rowH + 10 }, r)));
  const colour = { up: '#1f9d55', checking: '#2b6cb0', unhealthy: '#d64545', unavailable: '#dd6b20', draining: '#805ad5', down: '#4a5568' };
  for (const e of tab.events) {
    const i = rows.indexOf(e.service + ' ' + (e.server === '-' ? '(membership)' : e.server));
    const mark = svg('rect', { x: x(Date.parse(e.time)) - 2, y: pad + i * rowH + 1, width: 4, height: rowH - 3, fill: colour[e.to] || '#718096' });
    mark.append(svg('title', {}, `${clock(e.time)} ${e.server} ${e.from} → ${e.to}: ${e.cause}`));
    s.append(mark);
  }
  return s;
}

function renderTimeline(v) {
  const list = document.getElementById('timeline');
  list.replaceChildren(...tab.events.slice().reverse().map((e) => el('li',
    { 'data-server': e.server, 'data-service': e.service, 'data-to': e.to },
    el('span', { class: 'time', title: e.time }, clock(e.time)),
    el('span', {}, e.service),
    el('span', { class: 'server' }, e.server === '-' ? '' : e.server),
    el('span', {}, ...describeEvent(e)),
    el('span', { class: 'cause' }, e.cause))));
  document.getElementById('timeline-empty').hidden = tab.events.length > 0;
  document.getElementById('strip').replaceChildren(tab.events.length ? strip(v.time) : '');
}

// ---- data plane ---------------------------------------------------------------------

function renderCounters(v) {
  const rows = v.counters.filter(([name, value]) => value > 0 || name.startsWith('drop_'));
  document.getElementById('counters').replaceChildren(
    el('tr', {}, el('th', {}, 'counter'), el('th', {}, 'total'), el('th', {}, 'per second')),
    ...rows.map(([name, value]) => {
      const r = tab.counterRates.get(name);
      const cls = [name.startsWith('drop_') ? 'drop' : '', value === 0 ? 'zero' : ''].join(' ').trim();
      return el('tr', { class: cls || null, 'data-counter': name },
        el('td', {}, name), el('td', { class: 'num' }, si(value)),
        el('td', { class: 'num' }, r === null || r === undefined ? '–' : si(r)));
    }));
  const total = (name) => (v.counters.find(([n]) => n === name) || [name, 0])[1];
  const perSec = (name) => tab.counterRates.get(name);
  const refused = perSec('drop_nat_ports');
  const opened = perSec('flow_new');
  let pressure = 'no rate yet';
  if (refused !== null && refused !== undefined && opened !== null && opened !== undefined) {
    pressure = opened + refused > 0
      ? ((refused / (opened + refused)) * 100).toFixed(1) + ' % of the new flows now'
      : 'no new flows now';
  }
  document.getElementById('nat-pressure').replaceChildren(
    'nat source ports: ', el('b', {}, si(total('drop_nat_ports'))), ' flows refused for want of a port so far · ',
    pressure);
  document.getElementById('passive').replaceChildren(
    ...(v.passive_events.length ? v.passive_events : [['none yet', 0]]).map(([k, n]) =>
      el('tr', {}, el('td', {}, k), el('td', { class: 'num' }, si(n)))));
  const h = v.propagation;
  const max = Math.max(1, ...h.counts);
  const label = (b) => (b >= 1e-3 ? (b * 1e3) + ' ms' : (b * 1e6).toFixed(0) + ' µs');
  const quant = (q) => {
    if (!h.count) return '–';
    let seen = 0;
    for (let i = 0; i < h.counts.length; i++) {
      seen += h.counts[i];
      if (seen >= Math.ceil(q * h.count)) return i < h.bounds.length ? '≤ ' + label(h.bounds[i]) : '> ' + label(h.bounds[h.bounds.length - 1]);
    }
    return '–';
  };
  document.getElementById('propagation').replaceChildren(
    el('div', { class: 'hist' }, ...h.counts.map((c, i) => el('div', {
      style: `height:${((c / max) * 100).toFixed(1)}%`,
      title: `${i < h.bounds.length ? '≤ ' + label(h.bounds[i]) : '> ' + label(h.bounds[h.bounds.length - 1])}: ${c}`,
    }))),
    el('div', { class: 'hist-labels' }, ...h.counts.map((_, i) => el('span', {}, i < h.bounds.length ? label(h.bounds[i]) : '+∞'))),
    el('p', { class: 'muted' }, `${h.count} publications · p50 ${quant(0.5)} · p99 ${quant(0.99)}`));
}

// ---- cluster ------------------------------------------------------------------------

function renderCluster(v) {
  const panel = document.getElementById('cluster-panel');
  const c = v.cluster;
  panel.hidden = !c;
  if (!c) return;
  document.getElementById('cluster-node').textContent =
    `${c.node} (${c.index + 1} of ${c.members}) · resync ${c.resync_complete ? 'complete' : 'waiting'} · ${si(c.connections)} connections`;
  document.getElementById('cluster-peers').replaceChildren(
    el('tr', {}, ...['peer', 'address', 'state', 'sent', 'resent', 'received', 'lag', 'connects']
      .map((h) => el('th', {}, h))),
    ...c.peers.map((p) => el('tr', { 'data-peer': p.name },
      el('td', {}, p.name), el('td', {}, p.address), el('td', {}, pill(p.state)),
      el('td', { class: 'num' }, si(p.sent)), el('td', { class: 'num' }, si(p.resent)),
      el('td', { class: 'num' }, si(p.received)),
      el('td', { class: 'num' }, `${si(p.lag_records)} · ${p.lag_ms} ms`),
      el('td', { class: 'num' }, si(p.connects)))));
  const r = c.refused;
  document.getElementById('cluster-refused').textContent =
    `refused: wrong key ${r.wrong_key}, foreign node ${r.foreign_node}, member list ${r.fingerprint}, ` +
    `version ${r.version}, malformed ${r.malformed}, replayed ${r.replayed} · stray datagrams ${c.stray_datagrams}`;
}

// ---- loop ---------------------------------------------------------------------------

function render(v) {
  document.getElementById('where').textContent = `${v.interface || '?'} · xdp ${v.xdp_mode || '?'} · ${v.transitions} transitions`;
  document.getElementById('updated').textContent = 'updated ' + clock(v.time);
  document.getElementById('services').replaceChildren(...v.services.map(serviceCard));
  renderTimeline(v);
  renderCluster(v);
  renderCounters(v);
}

function setConn(state, why) {
  const c = document.getElementById('conn');
  c.dataset.conn = state;
  c.textContent = state === 'live' ? 'live' : 'stale' + (why ? ': ' + why : '');
}

async function poll() {
  tab.timer = null;
  let url = '/api/v1/page';
  if (tab.since !== null) url += '?events_since=' + encodeURIComponent(tab.since);
  try {
    const resp = await fetch(url, { cache: 'no-store' });
    if (!resp.ok) throw new Error('HTTP ' + resp.status);
    const v = await resp.json();
    updateRates(v);
    mergeEvents(v);
    render(v);
    setConn('live');
    document.documentElement.dataset.polls = ++tab.polls;
  } catch (err) {
    setConn('stale', err.message);
  }
  tab.timer = setTimeout(poll, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
}

document.addEventListener('visibilitychange', () => {
  if (!document.hidden && tab.timer !== null) {
    clearTimeout(tab.timer);
    poll();
  }
});

poll();
