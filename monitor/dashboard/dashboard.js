// The megatrain dashboard: plots from /history (at load) and the `step` events of /events (server-sent
// events), actor bars and states from polling /status every second, the event log, and the control
// buttons (POST /control/..., bearer token asked once and kept in sessionStorage).
// Everything the page knows is in window.megatrainDashboard, so tests (and curious users) can read the
// page's own state instead of scraping pixels. URLs are relative: the page works behind a path prefix.
(function () {
  'use strict';

  const params = new URLSearchParams(location.search);
  // An actor in one handler this long is shown as stuck (?stuck_after=SECONDS); a watchdog event naming
  // an actor shows it at once.
  const STUCK_AFTER_S = Number(params.get('stuck_after') || 30);
  const POLL_MS = 1000;
  const MAX_POINTS = 5000;  // per series; older points are dropped in halves
  const MAX_LOG = 300;
  const TOKEN_KEY = 'megatrain.monitor.token';
  const EVENT_TYPES = ['step', 'checkpoint_saved', 'checkpoint_failed', 'actor_failed', 'actor_restarted', 'paused',
                       'resumed', 'stopping', 'stopped', 'control', 'watchdog'];

  const dash = {
    // Plot series: [step, value] pairs in step order.
    points: {loss: [], lr: [], tokens_per_s: [], h2d_gb_per_s: [], d2h_gb_per_s: []},
    lastStep: -1,          // highest step plotted (history and events overlap: each step is plotted once)
    historyLoaded: false,  // /history answered at least once
    historyRecords: 0,     // step records that came from /history
    sse: {open: false, opens: 0, events: 0, stepEvents: 0, lastId: null},
    status: null,          // the last /status reply
    statusPolls: 0,        // successful /status replies
    statusErrors: 0,
    events: [],            // every non-step event received, newest last (bounded)
    controls: {},          // control id -> {action, status, step, ...} from replies and `control` events
    stuck: [],             // actors shown as stuck: {name, handler, seconds, unit}
    watchdog: {},          // actor -> last watchdog event
  };
  window.megatrainDashboard = dash;

  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // ---- formatting -------------------------------------------------------------------------------
  function fmtNum(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return '-';
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return v.toFixed(digits === undefined ? (a >= 100 ? 0 : a >= 1 ? 3 : 4) : digits);
  }
  // An axis label: enough digits to tell the grid lines apart (span = the distance between two lines).
  function fmtAxis(v, span) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) {
      return v.toExponential(Math.min(6, Math.max(1, Math.ceil(Math.log10(a / span)))));
    }
    return v.toFixed(Math.min(8, Math.max(0, Math.ceil(-Math.log10(span)) + 1)));
  }
  function fmtBytes(b) {
    if (b === null || b === undefined || !isFinite(b)) return '-';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(b) >= 1024 && i < units.length - 1) { b /= 1024; ++i; }
    return b.toFixed(i ? 1 : 0) + ' ' + units[i];
  }
  function fmtDuration(s) {
    if (s === null || s === undefined || !isFinite(s) || s < 0) return '-';
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? `${h}h${String(m).padStart(2, '0')}m` : m ? `${m}m${String(r).padStart(2, '0')}s` : `${r}s`;
  }
  function fmtTime(t) {
    const d = t ? new Date(t * 1000) : new Date();
    return d.toTimeString().slice(0, 8);
  }

  // ---- plots: a small hand-written canvas line plot ----------------------------------------------
  const plots = [
    {canvas: 'plot-loss', series: [['loss', '#5fb3f9']]},
    {canvas: 'plot-lr', series: [['lr', '#5fb3f9']]},
    {canvas: 'plot-tokens', series: [['tokens_per_s', '#5fb3f9']]},
    {canvas: 'plot-link', series: [['h2d_gb_per_s', '#5fb3f9'], ['d2h_gb_per_s', '#f2a65a']]},
  ];

  function drawPlot(plot) {
    const canvas = $(plot.canvas);
    const w = canvas.clientWidth || 380, h = canvas.clientHeight || 170;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const all = plot.series.map(([name]) => dash.points[name]);
    const count = all.reduce((n, s) => n + s.length, 0);
    canvas.dataset.points = String(count);
    if (count === 0) {
      ctx.fillStyle = '#8a93a3';
      ctx.font = '12px sans-serif';
      ctx.fillText('no data yet', 8, 20);
      return;
    }
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of all) {
      for (const [x, y] of s) {
        if (!isFinite(y)) continue;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
    }
    if (x1 === x0) x1 = x0 + 1;
    // A constant series (up to float rounding, e.g. a constant learning rate read back as a double) is
    // drawn as a flat line in the middle, not as noise blown up to the full height.
    if (y1 - y0 <= 1e-6 * Math.max(Math.abs(y0), Math.abs(y1))) y1 = y0;
    if (y1 === y0) { y1 += Math.abs(y1) * 0.05 || 1; y0 -= Math.abs(y0) * 0.05 || 1; }
    const left = 58, right = 8, top = 6, bottom = 18;
    const sx = (x) => left + (x - x0) / (x1 - x0) * (w - left - right);
    const sy = (y) => top + (1 - (y - y0) / (y1 - y0)) * (h - top - bottom);
    ctx.strokeStyle = '#2a2f3a';
    ctx.fillStyle = '#8a93a3';
    ctx.font = '11px sans-serif';
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; ++i) {  // horizontal grid with value labels
      const y = y0 + (y1 - y0) * i / 4;
      ctx.beginPath(); ctx.moveTo(left, sy(y)); ctx.lineTo(w - right, sy(y)); ctx.stroke();
      ctx.fillText(fmtAxis(y, (y1 - y0) / 4), 2, sy(y) + 4);
    }
    ctx.fillText('step ' + x0, left, h - 4);
    const last = 'step ' + x1;
    ctx.fillText(last, w - right - ctx.measureText(last).width, h - 4);
    ctx.lineWidth = 1.5;
    plot.series.forEach(([name, color]) => {
      const s = dash.points[name];
      ctx.strokeStyle = color;
      ctx.beginPath();
      s.forEach(([x, y], i) => (i ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
      if (s.length === 1) ctx.arc(sx(s[0][0]), sy(s[0][1]), 2, 0, 2 * Math.PI);
      ctx.stroke();
    });
  }

  let redrawPending = false;
  function scheduleRedraw() {
    if (redrawPending) return;
    redrawPending = true;
    setTimeout(() => { redrawPending = false; plots.forEach(drawPlot); }, 100);
  }
  window.addEventListener('resize', scheduleRedraw);

  // ---- step records (from /history and `step` events) ---------------------------------------------
  let prevLink = null;  // the previous record's {t, h2d_bytes, d2h_bytes}: link rates are differences
  function push(name, step, value) {
    if (value === null || value === undefined || !isFinite(value)) return;
    const s = dash.points[name];
    s.push([step, value]);
    if (s.length > MAX_POINTS) s.splice(0, s.length / 2);
  }
  function addStep(rec) {
    if (typeof rec.step !== 'number' || rec.step <= dash.lastStep) return false;
    dash.lastStep = rec.step;
    push('loss', rec.step, rec.loss);
    push('lr', rec.step, rec.lr);
    push('tokens_per_s', rec.step, rec.tokens_per_s);
    if (typeof rec.t === 'number' && typeof rec.h2d_bytes === 'number') {
      if (prevLink && rec.t > prevLink.t) {
        const dt = rec.t - prevLink.t;
        push('h2d_gb_per_s', rec.step, (rec.h2d_bytes - prevLink.h2d_bytes) / dt / 1e9);
        push('d2h_gb_per_s', rec.step, ((rec.d2h_bytes || 0) - prevLink.d2h_bytes) / dt / 1e9);
      }
      prevLink = {t: rec.t, h2d_bytes: rec.h2d_bytes, d2h_bytes: rec.d2h_bytes || 0};
    }
    return true;
  }

  async function loadHistory() {
    try {
      const r = await fetch('history?since=' + Math.max(dash.lastStep, 0), {cache: 'no-store'});
      if (!r.ok) throw new Error('HTTP ' + r.status);
      const records = await r.json();
      for (const rec of records) if (addStep(rec)) ++dash.historyRecords;
      dash.historyLoaded = true;
      scheduleRedraw();
    } catch (e) {
      logLine('error', `history: ${e.message}`, 'bad');
    }
  }

  // ---- the event stream -------------------------------------------------------------------------
  function describe(type, d) {
    switch (type) {
      case 'checkpoint_saved':
        return `checkpoint step ${d.step} saved to ${d.path} (${fmtBytes(d.bytes)} in ${fmtNum(d.seconds, 2)} s)`;
      case 'checkpoint_failed': return `checkpoint step ${d.step} FAILED: ${d.error || ''}`;
      case 'actor_failed': return `${d.actor} failed: ${d.error || d.reason || ''}`;
      case 'actor_restarted': return `${d.actor} restarted${d.restarts !== undefined ? ' (' + d.restarts + ')' : ''}`;
      case 'control': {
        let s = `${d.id} ${d.action}${d.actor ? ' ' + d.actor : ''}: ${d.status}`;
        if (d.step !== undefined) s += ` at step ${d.step}`;
        if (d.path) s += ` -> ${d.path}`;
        if (d.error || d.message) s += ` (${d.error || d.message})`;
        return s;
      }
      case 'watchdog':
        return `watchdog ${d.level}: ${d.actor || ''}${d.handler ? ' in ' + d.handler : ''}` +
               `${d.seconds !== undefined ? ' for ' + Math.round(d.seconds) + ' s' : ''}${d.message ? ' ' + d.message : ''}`;
      default: return `${type}${d.step !== undefined ? ' at step ' + d.step : ''}`;
    }
  }
  function severity(type, d) {
    if (type === 'checkpoint_failed' || type === 'actor_failed' || (type === 'control' && d.status === 'failed')) return 'bad';
    if (type === 'watchdog' || type === 'paused' || type === 'stopping') return 'warn';
    if (type === 'checkpoint_saved' || type === 'actor_restarted' || (type === 'control' && d.status === 'durable')) return 'good';
    return '';
  }
  function logLine(type, text, cls, t) {
    const li = el('li', cls || '', `${fmtTime(t)}  ${type.padEnd(17)} ${text}`);
    const log = $('event-log');
    log.insertBefore(li, log.firstChild);
    while (log.childNodes.length > MAX_LOG) log.removeChild(log.lastChild);
  }

  let historyAsked = false;  // /history has been read (or failed) since the stream opened
  let pendingSteps = [];     // step events that arrived before that
  function onEvent(type, ev) {
    let d;
    try { d = JSON.parse(ev.data); } catch (e) { d = {raw: ev.data}; }
    ++dash.sse.events;
    dash.sse.lastId = ev.lastEventId || dash.sse.lastId;
    if (type === 'step') {
      ++dash.sse.stepEvents;
      if (!historyAsked) pendingSteps.push(d);
      else if (addStep(d)) scheduleRedraw();
      return;
    }
    dash.events.push({type, data: d, id: ev.lastEventId});
    if (dash.events.length > MAX_LOG) dash.events.splice(0, dash.events.length - MAX_LOG);
    if (type === 'control' && d.id) {
      dash.controls[d.id] = Object.assign(dash.controls[d.id] || {}, d);
      showControlProgress(d);
    }
    if (type === 'watchdog' && d.actor) dash.watchdog[d.actor] = Object.assign({received: Date.now()}, d);
    logLine(type, describe(type, d), severity(type, d), d.t);
  }

  function connectEvents() {
    const es = new EventSource('events');  // reconnects by itself, sending Last-Event-ID
    for (const type of EVENT_TYPES) es.addEventListener(type, (ev) => onEvent(type, ev));
    es.onopen = async () => {
      dash.sse.open = true;
      ++dash.sse.opens;
      $('sse-state').textContent = 'live';
      // Read the history once the stream is open, so no step falls between the two; after a
      // reconnection this fills whatever the stream's backlog no longer holds.
      await loadHistory();
      historyAsked = true;  // even if it failed: plot from the stream alone rather than queue forever
      for (const d of pendingSteps) addStep(d);
      pendingSteps = [];
      scheduleRedraw();
    };
    es.onerror = () => {
      dash.sse.open = false;
      historyAsked = false;  // after the reconnection, queue steps until /history has filled the gap
      $('sse-state').textContent = 'reconnecting...';
    };
  }

  // ---- /status polling --------------------------------------------------------------------------
  let prevBusy = null;  // {at, busy: {actor: busy_s}}: the busy bar is the share of the last interval
  function renderStatus(s) {
    const run = s.run || {};
    $('run-summary').textContent =
        `${run.model || run.arch || ''} ${run.layers !== undefined ? run.layers + ' layers, ' : ''}` +
        `${run.params ? (run.params / 1e6).toFixed(2) + 'M params, ' : ''}` +
        `${run.batch !== undefined ? run.batch + ' x ' + run.seq + ' x ' + run.micro_batches + ' tokens, ' : ''}` +
        `${run.backend || ''}${run.bf16 ? ' bf16' : ''}  ${run.output_dir || ''}  pid ${run.pid || ''}`;
    const st = $('run-state');
    st.textContent = s.state;
    st.dataset.state = s.state;
    const max = run.max_steps || 0;
    $('v-step').textContent = max ? `${s.step} / ${max}` : String(s.step);
    $('step-bar').style.width = max ? `${Math.min(100, 100 * s.step / max)}%` : '0';
    $('v-loss').textContent = fmtNum(s.loss, 4);
    $('v-lr').textContent = fmtNum(s.lr);
    $('v-grad-norm').textContent = fmtNum(s.grad_norm, 3);
    $('v-tokens-per-s').textContent = fmtNum(s.tokens_per_s, 0);
    $('v-eta').textContent = fmtDuration(s.eta_s);
    $('v-goodput').textContent = s.goodput === undefined || s.goodput === null ? '-' : (100 * s.goodput).toFixed(1) + '%';
    const a = s.arena || {};
    $('v-arena').textContent = `${fmtBytes(a.in_use)} (${fmtBytes(a.peak)}) / ${fmtBytes(a.budget)}`;
    const c = s.last_checkpoint;
    $('v-checkpoint').textContent = c ? `step ${c.step}: ${c.path} (${fmtBytes(c.bytes)}, ${fmtNum(c.seconds, 2)} s)` : 'none yet';
    const err = $('last-error');
    err.hidden = !s.last_error;
    err.textContent = s.last_error ? 'last error: ' + s.last_error : '';
    renderActors(s.actors || []);
  }

  function renderActors(actors) {
    const now = performance.now() / 1000;
    const busyNow = {};
    const maxMailbox = Math.max(8, ...actors.map((a) => a.mailbox || 0));
    dash.stuck = [];
    const rows = $('actor-rows');
    const select = $('restart-actor');
    const names = actors.map((a) => a.name);
    if (select.options.length !== names.length) {  // the actor set is fixed for a run
      select.replaceChildren(...names.map((n) => el('option', '', n)));
    }
    rows.replaceChildren(...actors.map((a) => {
      busyNow[a.name] = a.busy_s;
      let busy;
      if (prevBusy && prevBusy.busy[a.name] !== undefined && now > prevBusy.at) {
        busy = (a.busy_s - prevBusy.busy[a.name]) / (now - prevBusy.at);
      } else {
        busy = a.busy_s + a.wait_s > 0 ? a.busy_s / (a.busy_s + a.wait_s) : 0;
      }
      busy = Math.max(0, Math.min(1, busy));
      const wd = dash.watchdog[a.name];
      const inHandler = a.handler && a.handler !== 'idle';
      const stuck = inHandler && (a.in_handler_s >= STUCK_AFTER_S || (wd && Date.now() - wd.received < 60000));
      if (stuck) dash.stuck.push({name: a.name, handler: a.handler, seconds: a.in_handler_s, unit: a.last_unit});
      const tr = el('tr', stuck ? 'stuck' : '');
      tr.dataset.actor = a.name;
      tr.dataset.state = a.state;
      tr.dataset.busy = busy.toFixed(3);
      tr.appendChild(el('td', '', a.name));
      tr.appendChild(el('td', '', a.state));
      tr.appendChild(meter(busy, (100 * busy).toFixed(0) + '%', ''));
      tr.appendChild(meter((a.mailbox || 0) / maxMailbox, String(a.mailbox || 0), 'mailbox'));
      tr.appendChild(el('td', '', String(a.restarts || 0)));
      tr.appendChild(el('td', '', inHandler ? `${a.handler} for ${fmtNum(a.in_handler_s, 1)} s` : 'idle'));
      tr.appendChild(el('td', '', a.last_unit || ''));
      tr.appendChild(el('td', '', a.last_failure || ''));
      return tr;
    }));
    prevBusy = {at: now, busy: busyNow};
    const banner = $('stuck');
    banner.hidden = dash.stuck.length === 0;
    banner.textContent = dash.stuck.map((x) =>
        `${x.name} in ${x.handler} for ${Math.round(x.seconds)} s${x.unit ? ' (last: ' + x.unit + ')' : ''}`).join('; ');
  }
  function meter(fraction, label, cls) {
    const td = el('td', 'meter');
    const bar = el('div', 'bar ' + cls);
    const fill = el('div');
    fill.style.width = `${Math.round(100 * Math.max(0, Math.min(1, fraction)))}%`;
    bar.appendChild(fill);
    td.appendChild(bar);
    td.appendChild(el('span', '', label));
    return td;
  }

  async function pollStatus() {
    try {
      const r = await fetch('status', {cache: 'no-store'});
      if (!r.ok) throw new Error('HTTP ' + r.status);
      dash.status = await r.json();
      ++dash.statusPolls;
      renderStatus(dash.status);
    } catch (e) {
      ++dash.statusErrors;
      const st = $('run-state');
      st.textContent = 'unreachable';
      st.dataset.state = 'unreachable';
    } finally {
      setTimeout(pollStatus, POLL_MS);
    }
  }

  // ---- control ----------------------------------------------------------------------------------
  function token() {
    let t = sessionStorage.getItem(TOKEN_KEY);
    if (!t) {
      t = (prompt('Monitor token (the file monitor.token in the run\'s output_dir):') || '').trim();
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
    }
    return t;
  }
  function showControlProgress(d) {
    $('control-result').textContent = describe('control', d);
  }
  // Sends one control request; resolves to the reply's JSON (with .http = status code).
  async function control(action, actor) {
    const t = token();
    if (!t) return {http: 0, error: 'no token'};
    const url = 'control/' + action + (actor ? '?actor=' + encodeURIComponent(actor) : '');
    let reply;
    try {
      const r = await fetch(url, {method: 'POST', headers: {'Authorization': 'Bearer ' + t}});
      const text = await r.text();
      try { reply = JSON.parse(text); } catch (e) { reply = {error: text}; }
      reply.http = r.status;
      if (r.status === 401 || r.status === 403) sessionStorage.removeItem(TOKEN_KEY);  // ask again next time
    } catch (e) {
      reply = {http: 0, error: e.message};
    }
    if (reply.id) {
      dash.controls[reply.id] = Object.assign(dash.controls[reply.id] || {}, reply);
      showControlProgress(reply);
    } else {
      $('control-result').textContent = `${action}: HTTP ${reply.http} ${reply.error || reply.message || ''}`;
      logLine('control', `${action}${actor ? ' ' + actor : ''} refused: HTTP ${reply.http} ${reply.error || reply.message || ''}`, 'bad');
    }
    return reply;
  }
  dash.control = control;

  document.querySelectorAll('#controls button[data-action]').forEach((b) => {
    b.addEventListener('click', () => {
      const action = b.dataset.action;
      if (action === 'stop' && !confirm('Stop the run (final checkpoint, clean exit)?')) return;
      if (action === 'restart') {
        const actor = $('restart-actor').value;
        if (actor && confirm(`Restart ${actor}?`)) control('restart', actor);
        return;
      }
      control(action);
    });
  });
  $('forget-token').addEventListener('click', () => sessionStorage.removeItem(TOKEN_KEY));

  plots.forEach(drawPlot);
  connectEvents();
  pollStatus();
})();
