/* rollwire web UI: a read-only, build-free single-page app (vanilla ES2020, no dependencies).
 *
 * Routes (location.pathname, History API): /ui, /ui/rollouts, /ui/rollouts/<id>,
 * /ui/collections, /ui/collections/<name>, /ui/evals/<name>[?compare=<name>], /ui/sessions.
 * Data comes from /ui/api/* (same origin,
 * cookie auth). All text from the API is inserted with textContent / createElement, never as HTML.
 * Large rollouts stay fast: the graph is plain SVG built once, turn rows fill in lazily as they
 * scroll into view, and the token strip renders only the rows near its viewport.
 */
'use strict';

(function () {
  const main = document.getElementById('app');
  const live = document.getElementById('live');
  const DASH = '\u2014';
  const LEVELS = { FATAL: 0, WARN: 1, INFO: 2 };
  const TERMINAL = new Set(['done', 'failed', 'cancelled']);

  // ---------------------------------------------------------------- DOM helpers

  /** createElement with attributes ("class", "text", on<event>, others via setAttribute). */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const k in attrs) {
        const v = attrs[k];
        if (v == null || v === false) continue;
        if (k === 'class') el.className = v;
        else if (k === 'text') el.textContent = v;
        else if (k.length > 2 && k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
        else el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    append(el, kids);
    return el;
  }

  function append(el, kids) {
    for (const c of kids) {
      if (c == null || c === false) continue;
      if (Array.isArray(c)) append(el, c);
      else el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  const SVGNS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    if (attrs) for (const k in attrs) if (attrs[k] != null) el.setAttribute(k, String(attrs[k]));
    for (const c of kids) if (c != null) el.append(c instanceof Node ? c : String(c));
    return el;
  }

  const show = (v) => (v == null || v === '' ? DASH : String(v));
  const enc = encodeURIComponent;
  const encPath = (name) => String(name).split('/').map(encodeURIComponent).join('/');
  const has = (o, k) => o != null && Object.prototype.hasOwnProperty.call(o, k);

  function json(v) {
    try {
      return JSON.stringify(v);
    } catch (e) {
      return String(v);
    }
  }

  function fmtDur(s) {
    if (s == null || !isFinite(s)) return DASH;
    if (s < 60) return s.toFixed(1) + ' s';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
    return Math.floor(m / 60) + 'h ' + String(m % 60).padStart(2, '0') + 'm';
  }

  const p2 = (x) => (x < 10 ? '0' : '') + x;
  const hms = (d) => `${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}`;
  const today = new Date();

  /** Local time of a unix timestamp: HH:MM:SS today, else with the date (no Intl: it is slow). */
  function fmtTime(ts) {
    if (ts == null || !isFinite(ts)) return DASH;
    const d = new Date(ts * 1000);
    if (d.getDate() === today.getDate() && d.getMonth() === today.getMonth() && d.getFullYear() === today.getFullYear()) {
      return hms(d);
    }
    return `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ${hms(d)}`;
  }

  function fmtAge(ts) {
    if (ts == null || !isFinite(ts)) return DASH;
    return fmtDur(Math.max(0, Date.now() / 1000 - ts)) + ' ago';
  }

  /** A token piece with whitespace made visible (for the one-line token cells). */
  function visible(p) {
    if (p === '') return '\u2205';
    return p.replace(/[\n\r\t \u00a0\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/g, (c) => {
      switch (c) {
        case '\n': return '\u23ce';
        case '\r': return '\u240d';
        case '\t': return '\u21e5';
        case ' ': return '\u00b7';
        case '\u00a0': return '\u2423';
        default: return '\\x' + c.charCodeAt(0).toString(16).padStart(2, '0');
      }
    });
  }

  /** A float as a JSON encoder writes it (0.0 stays "0.0"); used where no source text is kept. */
  function fmtFloat(v) {
    if (typeof v !== 'number') return show(v);
    if (Object.is(v, -0)) return '-0.0';
    if (Number.isInteger(v) && Math.abs(v) < 1e16) return v.toFixed(1);
    return String(v);
  }

  /** The source text of each element of a flat numeric array `key` in a JSON text, or null
   * when it cannot be matched to the parsed values (shown "as given", at no parse cost). */
  function arraySource(text, key, values) {
    if (typeof text !== 'string') return null;
    const k = text.indexOf('"' + key + '":');
    if (k < 0) return null;
    const a = text.indexOf('[', k);
    const b = a < 0 ? -1 : text.indexOf(']', a);
    if (b < 0) return null;
    const inner = text.slice(a + 1, b);
    const parts = inner.trim() === '' ? [] : inner.split(',');
    const n = values.length;
    if (parts.length !== n) return null;
    for (const i of [0, n >> 1, n - 1]) {
      if (n && Number(parts[i]) !== values[i]) return null;
    }
    return parts;
  }

  function lpColor(lp) {
    if (typeof lp !== 'number' || !isFinite(lp)) return '';
    const f = Math.min(1, Math.max(0, 1 + lp / 5));
    return `hsl(${Math.round(120 * f)}, 60%, 80%)`;
  }

  function badge(text, cls) {
    return h('span', { class: 'badge ' + (cls || '') }, text);
  }

  function statusBadge(status) {
    return badge(show(status), 'st-' + String(status || 'none').replace(/[^a-z]/gi, ''));
  }

  function kv(label, value, field, cls) {
    return h('div', { class: 'kv ' + (cls || '') },
      h('span', { class: 'k' }, label),
      h('span', { class: 'v', 'data-field': field || null }, value));
  }

  function findingEl(f, nodeId) {
    const level = String(f.level || 'INFO');
    return h('div', {
      class: 'finding lvl-' + level,
      'data-testid': 'finding',
      'data-level': level,
      'data-code': f.code == null ? '' : String(f.code),
      'data-node-id': nodeId == null ? '' : String(nodeId),
    },
    h('span', { class: 'flevel' }, level),
    h('span', { class: 'fcode' }, show(f.code)),
    h('span', { class: 'fmsg' }, f.message == null ? '' : String(f.message)));
  }

  function sortFindings(list) {
    return list.slice().sort((a, b) => (LEVELS[a.level] ?? 3) - (LEVELS[b.level] ?? 3));
  }

  function worstLevel(list) {
    let best = null;
    for (const f of list || []) if (best == null || (LEVELS[f.level] ?? 3) < (LEVELS[best] ?? 3)) best = f.level;
    return best;
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  function keepRewardSource(key, value, ctx) {
    if (key === 'reward' && typeof value === 'number' && ctx && typeof ctx.source === 'string') {
      this.reward_source = ctx.source;
    }
    return value;
  }

  /** Without a reviver (big bodies): the first `"reward":` whose number equals the parsed one. */
  function rewardSource(text, holder) {
    if (typeof holder.reward !== 'number') return;
    const re = /"reward":\s*(-?[0-9][0-9.eE+-]*)/g;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (Number(m[1]) === holder.reward) {
        holder.reward_source = m[1];
        return;
      }
    }
  }

  /** A reward for display: the number as the server wrote it, or an em dash for null. */
  function showReward(holder) {
    if (!holder || holder.reward == null) return DASH;
    return typeof holder.reward_source === 'string' ? holder.reward_source : String(holder.reward);
  }

  async function request(path, opts, signal) {
    const init = { credentials: 'same-origin', signal, headers: { Accept: 'application/json' } };
    if (opts && opts.body !== undefined) {
      init.method = 'POST';
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(opts.body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      if (e && e.name === 'AbortError') throw e;
      throw new ApiError('network error: ' + (e && e.message ? e.message : String(e)), 0);
    }
    const text = await resp.text();
    let data;
    try {
      // Rewards are shown "as given": where the browser exposes the source text of numbers
      // (JSON.parse source text access), keep it (1.0 stays "1.0"). Never for the big arrays.
      const revive = !(opts && opts.raw === false) && text.length < 200000;
      data = text ? (revive ? JSON.parse(text, keepRewardSource) : JSON.parse(text)) : null;
      if (data && !revive && !(opts && opts.raw === false) && data.summary) rewardSource(text, data.summary);
    } catch (e) {
      data = undefined;
    }
    if (!resp.ok) {
      const msg = data && typeof data.error === 'string' && data.error
        ? data.error
        : `HTTP ${resp.status} ${resp.statusText}` + (text && data === undefined ? ': ' + text.slice(0, 300) : '');
      throw new ApiError(msg, resp.status);
    }
    if (data === undefined) throw new ApiError('the server sent invalid JSON for ' + path, resp.status);
    if (opts && opts.keepText && data && typeof data === 'object') {
      Object.defineProperty(data, 'sourceText', { value: text, enumerable: false });
    }
    return data;
  }

  // ---------------------------------------------------------------- page lifecycle

  /** One rendered page: its fetches, timers, listeners and errors end when it is left. */
  class Page {
    constructor(root) {
      this.root = root;
      this.alive = true;
      this.ctrl = new AbortController();
      this.pollers = [];
      this.cleanups = [];
      this.errors = new Map();
      this.errEl = null;
    }

    get(path, opts) {
      return request('/ui/api' + path, opts || null, this.ctrl.signal);
    }

    post(path, body) {
      return request('/ui/api' + path, { body, raw: false }, this.ctrl.signal);
    }

    on(target, type, fn, opts) {
      target.addEventListener(type, fn, opts);
      this.cleanups.push(() => target.removeEventListener(type, fn, opts));
    }

    /** Run fn now, then ms after each completion, until stopped or the page is left. */
    poll(fn, ms) {
      const self = this;
      const p = { stopped: false, timer: null, running: false, again: false };
      async function tick() {
        p.timer = null;
        if (!self.alive || p.stopped) return;
        if (p.running) {
          p.again = true;
          return;
        }
        p.running = true;
        try {
          await fn(p);
        } catch (e) {
          self.error('poll', e);
        } finally {
          p.running = false;
        }
        if (!self.alive || p.stopped) return;
        if (p.again) {
          p.again = false;
          tick();
          return;
        }
        p.timer = setTimeout(tick, ms);
      }
      p.now = () => {
        if (p.timer) clearTimeout(p.timer);
        p.timer = null;
        tick();
      };
      p.stop = () => {
        p.stopped = true;
        if (p.timer) clearTimeout(p.timer);
        p.timer = null;
        self.updateLive();
      };
      this.pollers.push(p);
      this.updateLive();
      tick();
      return p;
    }

    updateLive() {
      const on = this.alive && this.pollers.some((p) => !p.stopped);
      live.textContent = on ? 'live' : '';
      live.classList.toggle('on', on);
    }

    error(key, err) {
      if (!this.alive || (err && err.name === 'AbortError')) return;
      this.errors.set(key, err && err.message ? err.message : String(err));
      this.renderErrors();
    }

    clearError(key) {
      if (this.errors.delete(key)) this.renderErrors();
    }

    renderErrors() {
      if (!this.errors.size) {
        if (this.errEl) this.errEl.remove();
        this.errEl = null;
        return;
      }
      if (!this.errEl) {
        this.errEl = h('div', { class: 'error', 'data-testid': 'error', role: 'alert' });
        this.root.prepend(this.errEl);
      }
      this.errEl.textContent = Array.from(this.errors.values()).join('\n');
    }

    destroy() {
      this.alive = false;
      for (const p of this.pollers) {
        p.stopped = true;
        if (p.timer) clearTimeout(p.timer);
      }
      this.ctrl.abort();
      for (const fn of this.cleanups.splice(0)) {
        try {
          fn();
        } catch (e) {
          /* ignore */
        }
      }
      live.textContent = '';
      live.classList.remove('on');
    }
  }

  // ---------------------------------------------------------------- router

  let current = null;

  function routeOf(pathname) {
    let p = pathname.replace(/\/+$/, '');
    if (p === '' || p === '/ui' || p === '/ui/rollouts') return [pageRollouts, null, 'rollouts'];
    let m = p.match(/^\/ui\/rollouts\/(.+)$/);
    if (m) return [pageRollout, safeDecode(m[1]), 'rollouts'];
    if (p === '/ui/collections') return [pageCollections, null, 'collections'];
    m = p.match(/^\/ui\/collections\/(.+)$/);
    if (m) return [pageCollection, m[1].split('/').map(safeDecode).join('/'), 'collections'];
    m = p.match(/^\/ui\/evals\/(.+)$/);
    if (m) return [pageEval, m[1].split('/').map(safeDecode).join('/'), 'collections'];
    if (p === '/ui/sessions') return [pageSessions, null, 'sessions'];
    return [pageNotFound, pathname, null];
  }

  function safeDecode(s) {
    try {
      return decodeURIComponent(s);
    } catch (e) {
      return s;
    }
  }

  function render() {
    if (current) current.destroy();
    const root = h('div', { class: 'page' });
    main.replaceChildren(root);
    const page = new Page(root);
    current = page;
    const [fn, arg, nav] = routeOf(location.pathname);
    for (const a of document.querySelectorAll('nav a[data-nav]')) {
      const on = a.getAttribute('data-nav') === nav;
      a.classList.toggle('active', on);
      if (on) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    try {
      fn(page, arg);
    } catch (e) {
      page.error('render', e);
    }
  }

  function navigate(href) {
    history.pushState(null, '', href);
    render();
    window.scrollTo(0, 0);
  }

  document.addEventListener('click', (e) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const a = e.target && e.target.closest ? e.target.closest('a[href]') : null;
    if (!a || (a.target && a.target !== '_self') || a.hasAttribute('download')) return;
    const url = new URL(a.getAttribute('href'), location.href);
    if (url.origin !== location.origin) return;
    const p = url.pathname;
    if (!(p === '/ui' || p.startsWith('/ui/')) || p.startsWith('/ui/api/') || p.startsWith('/ui/static/')) return;
    e.preventDefault();
    if (url.pathname + url.search === location.pathname + location.search) return;
    navigate(url.pathname + url.search + url.hash);
  });
  window.addEventListener('popstate', render);

  function pageNotFound(page, path) {
    document.title = 'not found · rollwire';
    page.root.append(h('h1', null, 'Not found'), h('p', { class: 'muted' }, 'No page at ', h('code', null, path), '.'));
  }

  // ---------------------------------------------------------------- keyed table rows

  /** Keep tbody rows keyed by id in the order of items; update only rows whose data changed. */
  function syncRows(tbody, items, keyOf, make, update) {
    const old = tbody._rows || new Map();
    const next = new Map();
    let i = 0;
    for (const item of items) {
      const key = keyOf(item);
      if (next.has(key)) continue;
      let rec = old.get(key);
      const sig = json(item);
      if (!rec) {
        rec = make(item);
        rec.sig = null;
      }
      if (rec.sig !== sig) {
        update(rec, item);
        rec.sig = sig;
      }
      next.set(key, rec);
      const at = tbody.children[i];
      if (at !== rec.tr) tbody.insertBefore(rec.tr, at || null);
      i++;
    }
    for (const [key, rec] of old) if (!next.has(key)) rec.tr.remove();
    tbody._rows = next;
  }

  function table(testid, columns, cls) {
    const tbody = h('tbody');
    const t = h('table', { class: 'grid ' + (cls || ''), 'data-testid': testid },
      h('thead', null, h('tr', null, columns.map(([f, label, c]) => h('th', { class: c || null, 'data-col': f }, label)))),
      tbody);
    return { table: t, tbody };
  }

  // ---------------------------------------------------------------- rollouts list

  const listState = { status: '', task: '' };
  const STATUSES = ['running', 'done', 'failed', 'cancelled'];
  const RCOLS = [
    ['rollout_id', 'rollout'], ['status', 'status'], ['phase', 'phase'], ['task', 'task'],
    ['harness', 'harness'], ['reward', 'reward', 'num'], ['tier', 'tier'], ['turns', 'turns', 'num'],
    ['trainable_tokens', 'trainable tok', 'num'], ['elapsed', 'elapsed', 'num'], ['started_at', 'started'],
    ['note', 'stop / error'],
  ];

  function phaseText(pr) {
    if (!pr) return DASH;
    const parts = [];
    if (pr.message) parts.push(String(pr.message));
    if (pr.total != null && pr.total !== 0) parts.push(`${show(pr.done)}/${pr.total}`);
    else if (pr.done != null) parts.push(String(pr.done));
    return parts.length ? parts.join(' \u00b7 ') : DASH;
  }

  function pageRollouts(page) {
    document.title = 'rollouts \u00b7 rollwire';
    const sel = h('select', { 'data-testid': 'status-filter', 'aria-label': 'status' },
      ['', ...STATUSES].map((s) => h('option', { value: s }, s || 'all statuses')));
    sel.value = listState.status;
    const inp = h('input', {
      'data-testid': 'task-filter', type: 'search', placeholder: 'task contains\u2026',
      'aria-label': 'task filter', spellcheck: 'false', autocomplete: 'off',
    });
    inp.value = listState.task;
    const counts = h('div', { class: 'counts', 'data-testid': 'status-counts' });
    const { table: t, tbody } = table('rollouts', RCOLS, 'rollouts');
    const empty = h('div', { class: 'empty', hidden: true }, 'No rollouts match.');
    const meta = h('span', { class: 'muted small' });
    page.root.append(
      h('div', { class: 'toolbar' }, h('h1', null, 'Rollouts'), sel, inp, counts, h('span', { class: 'spacer' }), meta),
      h('div', { class: 'tablewrap' }, t), empty);

    let seq = 0;
    const poller = page.poll(async () => {
      const q = new URLSearchParams();
      if (listState.status) q.set('status', listState.status);
      if (listState.task) q.set('task', listState.task);
      const my = ++seq;
      const qs = q.toString();
      let data;
      try {
        data = await page.get('/rollouts' + (qs ? '?' + qs : ''));
      } catch (e) {
        if (my === seq) page.error('list', e);
        return;
      }
      if (my !== seq || !page.alive) return;
      page.clearError('list');
      const rows = Array.isArray(data.rollouts) ? data.rollouts : [];
      syncRows(tbody, rows, (r) => String(r.rollout_id), makeRolloutRow, updateRolloutRow);
      empty.hidden = rows.length > 0;
      renderCounts(counts, data.counts || {});
      meta.textContent = `${rows.length} shown \u00b7 updated ${hms(new Date())}`;
    }, 1000);

    sel.addEventListener('change', () => {
      listState.status = sel.value;
      poller.now();
    });
    let deb = null;
    inp.addEventListener('input', () => {
      clearTimeout(deb);
      deb = setTimeout(() => {
        listState.task = inp.value;
        poller.now();
      }, 200);
    });
    page.cleanups.push(() => clearTimeout(deb));
    counts.addEventListener('click', (e) => {
      const b = e.target.closest('button[data-status]');
      if (!b) return;
      const s = b.getAttribute('data-status');
      listState.status = listState.status === s ? '' : s;
      sel.value = listState.status;
      poller.now();
    });
  }

  function renderCounts(el, counts) {
    const keys = STATUSES.concat(Object.keys(counts).filter((k) => !STATUSES.includes(k)));
    let total = 0;
    for (const k of keys) total += Number(counts[k]) || 0;
    const kids = [h('span', { class: 'count-total' }, `${total} total`)];
    for (const k of keys) {
      const n = Number(counts[k]) || 0;
      kids.push(h('button', {
        type: 'button', class: 'count st-' + k.replace(/[^a-z]/gi, '') + (listState.status === k ? ' on' : ''),
        'data-status': k, 'data-count': n, title: `filter: ${k}`,
      }, `${k} ${n}`));
    }
    el.replaceChildren(...kids);
  }

  function makeRolloutRow(r) {
    const tr = h('tr', { 'data-rollout-id': String(r.rollout_id) });
    const cells = {};
    for (const [f, , c] of RCOLS) {
      cells[f] = h('td', { 'data-field': f, class: c || null });
      tr.append(cells[f]);
    }
    const link = h('a', { class: 'mono', href: '/ui/rollouts/' + enc(String(r.rollout_id)) }, String(r.rollout_id));
    cells.rollout_id.append(link);
    return { tr, cells };
  }

  function updateRolloutRow(rec, r) {
    const c = rec.cells;
    const counts = r.counts || {};
    c.status.replaceChildren(statusBadge(r.status));
    const pr = r.progress || null;
    c.phase.replaceChildren(phaseCell(pr, r.status));
    c.task.replaceChildren(h('span', { class: 'clip', title: r.task == null ? null : String(r.task) }, show(r.task)));
    c.harness.textContent = show(r.harness);
    c.reward.textContent = showReward(r);
    c.tier.textContent = show(r.tier);
    c.turns.textContent = show(counts.turns);
    c.trainable_tokens.textContent = show(counts.trainable_tokens);
    c.elapsed.textContent = fmtDur(r.elapsed_s);
    c.started_at.textContent = fmtTime(r.started_at);
    c.note.replaceChildren();
    if (r.error) c.note.append(h('span', { class: 'clip err-text', title: String(r.error) }, String(r.error)));
    else if (r.stop_reason) c.note.append(h('span', { class: 'clip' }, String(r.stop_reason)));
    else c.note.append(DASH);
    rec.tr.classList.toggle('is-failed', r.status === 'failed' || r.ok === false);
  }

  function phaseCell(pr, status) {
    const text = h('span', { class: 'phase-text' }, phaseText(pr));
    if (!pr || !pr.total) return text;
    const frac = Math.max(0, Math.min(1, (Number(pr.done) || 0) / Number(pr.total)));
    const bar = h('span', { class: 'minibar' + (status === 'running' ? ' running' : '') }, h('span', { class: 'minibar-fill' }));
    bar.firstChild.style.width = (frac * 100).toFixed(1) + '%';
    return h('span', { class: 'phase' }, bar, text);
  }

  // ---------------------------------------------------------------- one rollout

  function pageRollout(page, rid) {
    document.title = rid + ' \u00b7 rollwire';
    const header = h('section', { class: 'rheader', 'data-testid': 'rollout-header' });
    const findingsBox = h('section', { class: 'rfindings' });
    const docBox = h('div', { class: 'docbox' });
    page.root.append(
      h('div', { class: 'crumbs' }, h('a', { href: '/ui' }, 'Rollouts'), h('span', { class: 'sep' }, '/'), h('span', { class: 'mono' }, rid)),
      header, findingsBox, docBox);

    let view = null;
    let viewLive = false;
    let findSig = null;
    page.cleanups.push(() => view && view.destroy());

    page.poll(async (p) => {
      let data;
      try {
        data = await page.get('/rollouts/' + enc(rid));
      } catch (e) {
        page.error('rollout', e);
        if (e.status >= 400 && e.status < 500) p.stop();
        if (!header.firstChild) header.append(h('h1', { class: 'mono' }, rid));
        return;
      }
      if (!page.alive) return;
      page.clearError('rollout');
      const isLive = !TERMINAL.has(String(data.status));
      renderRolloutHeader(header, data);

      const summary = data.summary || null;
      const doc = data.document || null;
      const all = [];
      const seen = new Set();
      const add = (f) => {
        const key = `${f.level}|${f.code}|${f.message}|${f.node_id == null ? '' : f.node_id}`;
        if (seen.has(key)) return;
        seen.add(key);
        all.push(f);
      };
      const turnIds = new Set(((doc && doc.turns) || []).map((t) => String(t.node_id)));
      for (const f of (doc && doc.findings) || []) add(f);
      // node-level findings are shown at their turn; those naming no turn of the document stay here
      for (const f of (summary && summary.findings) || []) if (f.node_id == null || !turnIds.has(String(f.node_id))) add(f);
      const sig = json(all);
      if (sig !== findSig) {
        findSig = sig;
        findingsBox.replaceChildren();
        if (all.length) {
          findingsBox.append(h('h2', null, 'Findings ', h('span', { class: 'muted' }, `(${all.length})`)),
            h('div', { class: 'flist' }, sortFindings(all).map((f) => findingEl(f, f.node_id))));
        }
      }

      if (doc && (!view || (viewLive && !isLive))) {
        if (view) view.destroy();
        docBox.replaceChildren();
        view = documentView(page, rid, doc, summary, docBox);
        viewLive = isLive;
      } else if (!doc && !view) {
        docBox.replaceChildren(h('div', { class: 'empty' }, isLive
          ? 'Running \u2014 the graph, turns and token strip appear when the rollout finishes.'
          : 'No document: this rollout captured no model call.'));
      }
      if (!isLive) p.stop();
    }, 1000);
  }

  function renderRolloutHeader(el, data) {
    const s = data.summary || {};
    const doc = data.document || null;
    const counts = s.counts || null;
    const title = h('div', { class: 'rtitle' },
      h('h1', { class: 'mono' }, String(data.rollout_id != null ? data.rollout_id : '')),
      h('span', { 'data-field': 'status' }, statusBadge(data.status)),
      h('span', { class: 'rtask', 'data-field': 'task', title: data.task == null ? '' : String(data.task) }, show(data.task)),
      h('span', { class: 'spacer' }),
      data.document_url ? h('a', { class: 'btn', 'data-testid': 'raw-document', href: String(data.document_url) }, 'raw document JSON') : null);

    const grid = h('div', { class: 'kvgrid' },
      kv('reward', showReward(s), 'reward', 'strong'),
      kv('tier', show(s.tier), 'tier'),
      kv('ok', s.ok == null ? DASH : (s.ok ? 'yes' : 'no'), 'ok', s.ok === false ? 'bad' : (s.ok ? 'good' : '')),
      kv('stop reason', show(s.stop_reason), 'stop_reason'),
      kv('harness', show(s.harness), 'harness'),
      kv('type', show(s.rollout_type || (doc && doc.rollout_type)), 'rollout_type'),
      s.sandbox != null ? kv('sandbox', String(s.sandbox), 'sandbox') : null,
      s.seed != null ? kv('seed', String(s.seed), 'seed') : null,
      s.answer_mode != null ? kv('answer mode', String(s.answer_mode), 'answer_mode') : null,
      doc ? kv('capture', show(doc.capture_level), 'capture_level') : null,
      kv('phase', phaseText(data.progress), 'phase'),
      s.timings && s.timings.total_s != null ? kv('total', fmtDur(Number(s.timings.total_s)), 'total_s') : null);
    const kids = [title, grid];
    if (s.error) {
      kids.push(h('div', { class: 'rerror' }, h('span', { class: 'k' }, 'error'), h('pre', { 'data-field': 'error' }, String(s.error))));
    }
    const chips = [];
    if (s.rewards && typeof s.rewards === 'object' && Object.keys(s.rewards).length) {
      chips.push(chipRow('rewards', Object.entries(s.rewards), 'rewards'));
    }
    const st = doc && doc.stats;
    if (st) {
      const order = ['turns', 'roots', 'leaves', 'forks', 'discarded', 'retokenized', 'unlinked', 'sequences', 'trainable_sequences', 'trainable_tokens'];
      chips.push(chipRow('stats', order.filter((k) => has(st, k)).map((k) => [k.replace(/_/g, ' '), st[k]]), 'stats'));
      if (st.token_in && Object.keys(st.token_in).length) {
        chips.push(chipRow('token in', Object.entries(st.token_in), 'token_in', (k) => (String(k).startsWith('fallback') ? 'warn' : '')));
      }
    } else if (counts) {
      chips.push(chipRow('counts', Object.entries(counts).map(([k, v]) => [k.replace(/_/g, ' '), v]), 'stats'));
    }
    if (s.timings && Object.keys(s.timings).length) {
      chips.push(chipRow('timings', Object.entries(s.timings).map(([k, v]) => [k, typeof v === 'number' ? fmtDur(v) : v]), 'timings'));
    }
    kids.push(...chips);
    el.replaceChildren(...kids);
  }

  function chipRow(label, entries, field, clsOf) {
    return h('div', { class: 'chiprow', 'data-field': field },
      h('span', { class: 'k' }, label),
      entries.map(([k, v]) => h('span', { class: 'chip ' + (clsOf ? clsOf(k) : '') }, h('span', { class: 'ck' }, String(k)), h('span', { class: 'cv' }, show(v)))));
  }

  function turnKind(t) {
    if (t.role === 'discarded') return 'discarded';
    if (t.role === 'auxiliary' || t.auxiliary) return 'aux';
    if (t.trainable) return 'train';
    return 'agent';
  }
  const KIND_LABEL = { train: 'trainable', agent: 'agent, untrainable', aux: 'auxiliary', discarded: 'discarded' };

  /** Graph, turns and sequences of a rollout document. */
  const findingKey = (f) => `${f.level}|${f.code}|${f.message}`;

  /** The document's turns, each with every finding that names it: its own, and the node-level
   * ones of the rollout (the document view keeps only rollout-level findings at its top). */
  function turnsWithFindings(doc, summary) {
    const turns = Array.isArray(doc.turns) ? doc.turns : [];
    const extra = new Map();
    for (const f of (summary && summary.findings) || []) {
      if (f == null || f.node_id == null) continue;
      const id = String(f.node_id);
      if (!extra.has(id)) extra.set(id, []);
      extra.get(id).push(f);
    }
    if (!extra.size) return turns;
    return turns.map((t) => {
      const add = extra.get(String(t.node_id));
      if (!add) return t;
      const own = Array.isArray(t.findings) ? t.findings : [];
      const seen = new Set(own.map(findingKey));
      const merged = own.slice();
      for (const f of add) {
        if (!seen.has(findingKey(f))) {
          seen.add(findingKey(f));
          merged.push(f);
        }
      }
      return Object.assign({}, t, { findings: merged });
    });
  }

  function documentView(page, rid, doc, summary, host) {
    const turns = turnsWithFindings(doc, summary);
    const sequences = Array.isArray(doc.sequences) ? doc.sequences : [];
    const disposers = [];
    const on = (t, ty, fn, o) => {
      t.addEventListener(ty, fn, o);
      disposers.push(() => t.removeEventListener(ty, fn, o));
    };
    const pieces = new PieceStore(page, rid);
    let selected = null;

    // The sequence arrays are fetched once per sequence; the default one is requested first,
    // so that it downloads while the graph and the turn list are being built.
    const seqFetches = new Map(); // sid -> promise
    const seqData = new Map(); // sid -> resolved arrays
    function fetchSequence(sid) {
      let pr = seqFetches.get(sid);
      if (!pr) {
        pr = page.get(`/rollouts/${enc(rid)}/sequences/${enc(sid)}`, { raw: false, keepText: true }).then((d) => {
          seqData.set(sid, d);
          return d;
        }, (e) => {
          seqFetches.delete(sid);
          throw e;
        });
        seqFetches.set(sid, pr);
      }
      return pr;
    }
    const firstSeq = sequences.find((s) => s.trainable) || sequences[0];
    if (firstSeq) fetchSequence(String(firstSeq.sequence_id)).catch(() => {});

    const graph = buildGraph(turns, (id) => select(id, 'graph'));
    const list = buildTurns(page, rid, turns, (id) => select(id, 'turns'));
    disposers.push(() => list.destroy());

    const graphPanel = h('section', { class: 'panel graph-panel' },
      h('div', { class: 'panel-head' }, h('h2', null, 'Graph'), h('span', { class: 'muted small' }, `${turns.length} calls`)),
      graph.legend, graph.box);
    graphPanel.style.width = Math.max(300, graph.width + 24) + 'px';
    const turnsPanel = h('section', { class: 'panel turns-panel' },
      h('div', { class: 'panel-head' }, h('h2', null, 'Turns'), h('span', { class: 'muted small' }, 'click a turn for its messages')),
      list.box);

    // sequences
    const seqSel = h('select', { 'data-testid': 'sequence-select', 'aria-label': 'sequence' },
      sequences.map((s) => h('option', { value: String(s.sequence_id) },
        `${s.sequence_id} \u00b7 ${s.role}${s.trainable ? '' : ' (not trainable)'} \u00b7 ${s.length} tok \u00b7 ${s.n_trainable_tokens} trained \u00b7 ${(s.node_ids || []).length} turns`)));
    const seqInfo = h('div', { class: 'seqinfo' });
    const stripHost = h('div', { class: 'striphost' });
    const seqPanel = h('section', { class: 'panel seq-panel' },
      h('div', { class: 'panel-head' }, h('h2', null, 'Sequences'), seqSel, h('span', { class: 'spacer' }), h('span', { class: 'muted small' }, `${sequences.length} sequence${sequences.length === 1 ? '' : 's'}`)),
      seqInfo, stripHost);
    if (!sequences.length) {
      seqSel.disabled = true;
      stripHost.append(h('div', { class: 'empty' }, 'This document has no sequences.'));
    }

    host.append(h('div', { class: 'twocol' }, graphPanel, turnsPanel), seqPanel);

    let strip = null;
    let loadTok = 0;
    disposers.push(() => strip && strip.destroy());

    function seqMeta(sid) {
      return sequences.find((s) => String(s.sequence_id) === sid);
    }

    async function loadSequence(sid) {
      const meta = seqMeta(sid);
      if (!meta) return;
      const my = ++loadTok;
      seqSel.value = sid;
      seqInfo.replaceChildren();
      append(seqInfo, [
        h('span', { class: 'muted' }, 'path '),
        h('span', { class: 'mono small' }, pathText(meta.node_ids || [])),
        (meta.findings || []).length ? h('div', { class: 'flist compact' }, sortFindings(meta.findings).map((f) =>
          h('div', { class: 'finding lvl-' + f.level, 'data-testid': 'sequence-finding', 'data-level': String(f.level), 'data-code': String(f.code) },
            h('span', { class: 'flevel' }, String(f.level)), h('span', { class: 'fcode' }, show(f.code)),
            h('span', { class: 'fmsg' }, (f.node_id ? f.node_id + ': ' : '') + (f.message || ''))))) : null]);
      let data = seqData.get(sid);
      if (!data) {
        if (strip) {
          strip.destroy();
          strip = null;
        }
        stripHost.replaceChildren(h('div', { class: 'empty' }, `Loading ${meta.length} tokens\u2026`));
        try {
          data = await fetchSequence(sid);
        } catch (e) {
          if (my === loadTok) {
            page.error('sequence', e);
            stripHost.replaceChildren(h('div', { class: 'empty' }, 'Could not load the sequence.'));
          }
          return;
        }
        page.clearError('sequence');
      }
      if (my !== loadTok || !page.alive) return;
      if (strip) strip.destroy();
      strip = createStrip(page, meta, data, pieces, selected);
      stripHost.replaceChildren(strip.el);
      strip.start();
      if (selected) strip.highlight(selected, true);
    }

    on(seqSel, 'change', () => loadSequence(seqSel.value));

    function sequenceFor(id) {
      const cur = seqMeta(seqSel.value);
      if (cur && (cur.node_ids || []).includes(id)) return cur;
      return sequences.find((s) => s.trainable && (s.node_ids || []).includes(id)) ||
        sequences.find((s) => (s.node_ids || []).includes(id)) || null;
    }

    function select(id, from) {
      selected = id;
      graph.select(id, from !== 'graph');
      list.select(id, from !== 'turns', from === 'graph');
      const s = sequenceFor(id);
      if (s && String(s.sequence_id) !== seqSel.value) loadSequence(String(s.sequence_id));
      else if (strip) strip.highlight(id, true);
    }

    if (firstSeq) loadSequence(String(firstSeq.sequence_id));

    return {
      destroy() {
        for (const d of disposers.splice(0)) d();
      },
    };
  }

  function pathText(ids) {
    if (ids.length <= 8) return ids.join(' \u2192 ');
    return ids.slice(0, 3).join(' \u2192 ') + ` \u2192 \u2026 (${ids.length - 6} more) \u2192 ` + ids.slice(-3).join(' \u2192 ');
  }

  // ---------------------------------------------------------------- graph (plain SVG, built once)

  function buildGraph(turns, onSelect) {
    const NW = 170, NH = 28, GX = 20, GY = 12, PAD = 8;
    const byId = new Map();
    for (const t of turns) byId.set(String(t.node_id), t);
    const kids = new Map();
    const roots = [];
    for (const t of turns) {
      const p = t.parent_id == null ? null : String(t.parent_id);
      if (p != null && byId.has(p) && p !== String(t.node_id)) {
        if (!kids.has(p)) kids.set(p, []);
        kids.get(p).push(t);
      } else {
        roots.push(t);
      }
    }
    // Depth = rank along parent edges; x = column of the node's first leaf (depth-first order).
    const pos = new Map();
    let col = 0, maxDepth = 0;
    const visit = (root) => {
      const stack = [[root, 0]];
      while (stack.length) {
        const [t, d] = stack.pop();
        const id = String(t.node_id);
        if (pos.has(id)) continue;
        pos.set(id, { col, depth: d });
        if (d > maxDepth) maxDepth = d;
        const ch = (kids.get(id) || []).filter((c) => !pos.has(String(c.node_id)));
        if (!ch.length) col++;
        else for (let i = ch.length - 1; i >= 0; i--) stack.push([ch[i], d + 1]);
      }
    };
    for (const r of roots) visit(r);
    for (const t of turns) if (!pos.has(String(t.node_id))) visit(t); // cycles: never expected

    const W = PAD * 2 + Math.max(1, col) * (NW + GX) - GX;
    const H = PAD * 2 + (maxDepth + 1) * (NH + GY) - GY;
    const cx = (id) => PAD + pos.get(id).col * (NW + GX) + NW / 2;
    const cy = (id) => PAD + pos.get(id).depth * (NH + GY) + NH / 2;

    const root = svg('svg', {
      'data-testid': 'graph', class: 'graph', width: W, height: H, viewBox: `0 0 ${W} ${H}`,
      role: 'img', 'aria-label': `rollout graph, ${turns.length} calls`,
    });
    const gE = svg('g', { class: 'edges' });
    const gN = svg('g', { class: 'nodes' });
    const nodes = new Map();
    for (const t of turns) {
      const id = String(t.node_id);
      const p = t.parent_id == null ? null : String(t.parent_id);
      if (p != null && pos.has(p) && p !== id) {
        const x1 = cx(p), y1 = cy(p), x2 = cx(id), y2 = cy(id);
        const d = x1 === x2 ? `M${x1} ${y1}V${y2}` : `M${x1} ${y1}V${y2 - NH / 2 - GY / 2}H${x2}V${y2}`;
        gE.append(svg('path', { d, class: 'edge parent', 'data-edge-kind': 'parent', 'data-source': p, 'data-target': id }));
      }
      const rf = t.retokenized_from == null ? null : String(t.retokenized_from);
      if (rf != null && pos.has(rf)) {
        const x1 = cx(rf), y1 = cy(rf), x2 = cx(id), y2 = cy(id);
        const my = (y1 + y2) / 2;
        const d = `M${x1} ${y1}C${x1 + NW * 0.6} ${my} ${x2 - NW * 0.6} ${my} ${x2} ${y2}`;
        gE.append(svg('path', { d, class: 'edge retok', 'data-edge-kind': 'retokenized', 'data-source': rf, 'data-target': id }));
      }
      const kind = turnKind(t);
      const x = PAD + pos.get(id).col * (NW + GX), y = PAD + pos.get(id).depth * (NH + GY);
      const g = svg('g', { class: 'node k-' + kind, 'data-node-id': id, transform: `translate(${x},${y})`, tabindex: 0 });
      const pl = t.prompt_len == null ? '?' : t.prompt_len;
      const cl = t.completion_len == null ? '?' : t.completion_len;
      g.append(
        svg('title', null, `${id} \u00b7 ${t.role}${t.trainable ? ' \u00b7 trainable' : ''}${t.retokenized_from ? ' \u00b7 retokenized from ' + t.retokenized_from : ''}\nprompt ${pl} + completion ${cl} tokens\nfinish ${show(t.finish_reason)} \u00b7 token in ${show(t.token_in_mode)}`),
        svg('rect', { width: NW, height: NH, rx: 4 }),
        svg('text', { x: 6, y: 11.5, class: 'n1' }, svg('tspan', { class: 'nid' }, id), ' ' + String(t.role) + (t.retokenized_from ? ' \u27f2' : '')),
        svg('text', { x: 6, y: 23, class: 'n2' }, `${pl} + ${cl} tok \u00b7 ${String(t.token_in_mode || 'rendered').split(':')[0]}`));
      const worst = worstLevel(t.findings);
      if (worst) g.append(svg('circle', { cx: NW - 7, cy: 7, r: 3.5, class: 'fdot lvl-' + worst }));
      gN.append(g);
      nodes.set(id, g);
    }
    root.append(gE, gN);

    const box = h('div', { class: 'scrollbox graph-box' }, root);
    if (!turns.length) box.replaceChildren(h('div', { class: 'empty' }, 'No model calls.'));
    root.addEventListener('click', (e) => {
      const g = e.target.closest('g[data-node-id]');
      if (g) onSelect(g.getAttribute('data-node-id'));
    });
    root.addEventListener('keydown', (e) => {
      if (e.key !== 'Enter' && e.key !== ' ') return;
      const g = e.target.closest('g[data-node-id]');
      if (g) {
        e.preventDefault();
        onSelect(g.getAttribute('data-node-id'));
      }
    });

    const sw = (cls, label) => h('span', { class: 'lg' }, h('span', { class: 'sw ' + cls }), label);
    const legend = h('div', { class: 'legend' },
      sw('k-train', 'trainable'), sw('k-agent', 'agent, untrainable'), sw('k-aux', 'auxiliary'), sw('k-discarded', 'discarded'),
      sw('e-parent', 'parent'), sw('e-retok', 'retokenized'));

    let sel = null;
    return {
      box,
      legend,
      width: W,
      select(id, scroll) {
        if (sel) sel.classList.remove('sel');
        sel = nodes.get(id) || null;
        if (!sel) return;
        sel.classList.add('sel');
        if (scroll) {
          const x = cx(id), y = cy(id);
          box.scrollTop = Math.max(0, y - box.clientHeight / 2);
          box.scrollLeft = Math.max(0, x - box.clientWidth / 2);
        }
      },
    };
  }

  // ---------------------------------------------------------------- turns list (lazy rows)

  function buildTurns(page, rid, turns, onSelect) {
    const box = h('div', { class: 'scrollbox turns', 'data-testid': 'turns' });
    const els = new Map();
    const byId = new Map();
    const details = new Map();
    const frag = document.createDocumentFragment();
    for (const t of turns) {
      const id = String(t.node_id);
      byId.set(id, t);
      const el = h('div', { class: 'turn pending k-' + turnKind(t), 'data-testid': 'turn', 'data-node-id': id });
      els.set(id, el);
      frag.append(el);
    }
    box.append(frag);
    if (!turns.length) box.append(h('div', { class: 'empty' }, 'No turns.'));

    const io = new IntersectionObserver((entries) => {
      for (const en of entries) {
        if (en.isIntersecting) {
          fill(en.target);
          io.unobserve(en.target);
        }
      }
    }, { root: box, rootMargin: '400px 0px' });
    for (const el of els.values()) io.observe(el);
    // the rows that are on screen at once are drawn now (no flash of empty rows)
    let eager = 0;
    for (const el of els.values()) {
      if (eager++ >= 24) break;
      fill(el);
    }

    function fill(el) {
      if (!el.classList.contains('pending')) return;
      el.classList.remove('pending');
      const t = byId.get(el.getAttribute('data-node-id'));
      const id = String(t.node_id);
      const kind = turnKind(t);
      const mode = String(t.token_in_mode || '');
      const head = h('div', { class: 'turn-head', role: 'button', tabindex: 0, 'aria-expanded': 'false' },
        h('span', { class: 'caret' }, '\u25b8'),
        h('span', { class: 'nid mono' }, id),
        h('span', { class: 'badge k-' + kind, title: KIND_LABEL[kind], 'data-field': 'role' }, String(t.role) + (t.trainable ? ' \u00b7 trainable' : '')),
        h('span', { class: 'ttok', 'data-field': 'tokens', title: 'prompt + completion tokens' }, `${show(t.prompt_len)} + ${show(t.completion_len)} tok`),
        h('span', { class: 'badge mode' + (mode.startsWith('fallback') ? ' warn' : ''), 'data-field': 'token_in_mode' }, show(t.token_in_mode)),
        mode === 'spliced' ? h('span', { class: 'small muted', 'data-field': 'splice' },
          `path ${show(t.token_in_path)} \u00b7 parent ${show(t.parent_call_id)} \u00b7 carried ${show(t.carried_len)}`) : null,
        h('span', { class: 'small', 'data-field': 'finish_reason' }, 'finish ', h('b', null, show(t.finish_reason))),
        t.parent_id != null ? h('span', { class: 'small muted' }, '\u2190 ', h('span', { class: 'mono' }, String(t.parent_id))) : h('span', { class: 'small muted' }, 'root'),
        t.retokenized_from != null ? h('span', { class: 'small retok-note' }, '\u27f2 retokenized from ', h('span', { class: 'mono' }, String(t.retokenized_from))) : null,
        t.has_top_logprobs ? h('span', { class: 'small muted', title: 'top candidates captured' }, 'top\u2713') : null,
        h('span', { class: 'spacer' }),
        h('span', { class: 'small muted', title: [t.model, t.dialect].filter(Boolean).join(' \u00b7 ') }, fmtTime(t.created_at)));
      el.append(head);
      const fs = t.findings || [];
      if (fs.length) el.append(h('div', { class: 'flist compact' }, sortFindings(fs).map((f) => findingEl(f, id))));
    }

    async function expand(el, open) {
      fill(el);
      const id = el.getAttribute('data-node-id');
      const head = el.querySelector('.turn-head');
      let body = el.querySelector('.turn-body');
      if (!open) {
        el.classList.remove('open');
        head.setAttribute('aria-expanded', 'false');
        if (body) body.hidden = true;
        return;
      }
      el.classList.add('open');
      head.setAttribute('aria-expanded', 'true');
      if (body && !body.classList.contains('failed')) {
        body.hidden = false;
        return;
      }
      if (body) body.remove();
      body = h('div', { class: 'turn-body', 'data-testid': 'turn-body' }, h('div', { class: 'muted small' }, 'Loading\u2026'));
      el.append(body);
      let d = details.get(id);
      if (!d) {
        try {
          d = await page.get(`/rollouts/${enc(rid)}/turns/${enc(id)}`);
        } catch (e) {
          page.error('turn', e);
          body.classList.add('failed');
          body.replaceChildren(h('div', { class: 'err-text' }, 'Could not load this turn (collapse and reopen to retry).'));
          return;
        }
        details.set(id, d);
        page.clearError('turn');
      }
      renderTurnBody(body, d);
    }

    box.addEventListener('click', (e) => {
      const el = e.target.closest('[data-testid=turn]');
      if (!el || e.target.closest('.turn-body, .finding')) return;
      const wasOpen = el.classList.contains('open');
      onSelect(el.getAttribute('data-node-id'));
      expand(el, !wasOpen);
    });
    box.addEventListener('keydown', (e) => {
      if ((e.key === 'Enter' || e.key === ' ') && e.target.classList.contains('turn-head')) {
        e.preventDefault();
        e.target.click();
      }
    });

    let sel = null;
    return {
      box,
      select(id, scroll, open) {
        if (sel) sel.classList.remove('sel');
        sel = els.get(id) || null;
        if (!sel) return;
        fill(sel);
        sel.classList.add('sel');
        if (scroll) box.scrollTop = Math.max(0, sel.offsetTop - 8);
        if (open && !sel.classList.contains('open')) expand(sel, true);
      },
      destroy() {
        io.disconnect();
      },
    };
  }

  const MSG_TAIL = 6;

  function renderTurnBody(body, d) {
    const kids = [];
    const msgs = Array.isArray(d.messages) ? d.messages : null;
    if (msgs === null) {
      kids.push(h('div', { class: 'muted small note' }, 'Request messages are not kept at the tokens tier.'));
    } else {
      const box = h('div', { class: 'msgs' });
      const renderFrom = (k) => {
        box.replaceChildren();
        if (k > 0) {
          box.append(h('button', { type: 'button', class: 'linkish', onclick: () => renderFrom(0) },
            `show ${k} earlier message${k === 1 ? '' : 's'}`));
        }
        for (let i = k; i < msgs.length; i++) box.append(messageEl(msgs[i], ''));
      };
      renderFrom(Math.max(0, msgs.length - MSG_TAIL));
      kids.push(h('div', { class: 'sub' }, `request \u00b7 ${msgs.length} message${msgs.length === 1 ? '' : 's'}`), box);
    }
    kids.push(h('div', { class: 'sub' }, 'reply', d.finish_reason ? ` \u00b7 finish ${d.finish_reason}` : ''));
    kids.push(d.reply ? messageEl(d.reply, ' reply') : h('div', { class: 'muted small note' }, 'No reply recorded.'));
    const extra = [];
    if (Array.isArray(d.completion_token_ids)) extra.push(`${d.completion_token_ids.length} completion ids`);
    if (Array.isArray(d.logprobs)) extra.push(`${d.logprobs.length} logprobs`);
    const params = h('details', { class: 'params' },
      h('summary', null, 'params & usage', extra.length ? ' \u00b7 ' + extra.join(' \u00b7 ') : ''),
      h('div', { class: 'paramgrid' },
        h('div', null, h('div', { class: 'sub' }, 'requested'), h('pre', null, JSON.stringify(d.requested_params ?? null, null, 1))),
        h('div', null, h('div', { class: 'sub' }, 'applied'), h('pre', null, JSON.stringify(d.applied_params ?? null, null, 1))),
        h('div', null, h('div', { class: 'sub' }, 'usage'), h('pre', null, JSON.stringify(d.usage ?? null, null, 1)))));
    kids.push(params);
    body.replaceChildren(...kids);
  }

  function messageEl(m, extraCls) {
    if (m == null || typeof m !== 'object') return h('pre', { class: 'msg-text' }, json(m));
    const role = String(m.role || 'message');
    const el = h('div', { class: 'msg r-' + role.replace(/[^a-z]/gi, '') + extraCls });
    el.append(h('div', { class: 'msg-role' }, role,
      m.name ? h('span', { class: 'muted' }, ' \u00b7 ' + m.name) : null,
      m.tool_call_id ? h('span', { class: 'muted mono' }, ' \u00b7 ' + m.tool_call_id) : null));
    const reasoning = m.reasoning_content || m.reasoning;
    if (typeof reasoning === 'string' && reasoning) el.append(h('pre', { class: 'msg-text reasoning' }, reasoning));
    const c = m.content;
    if (typeof c === 'string') el.append(h('pre', { class: 'msg-text' }, c));
    else if (Array.isArray(c)) {
      for (const part of c) {
        if (part && part.type === 'text' && typeof part.text === 'string') el.append(h('pre', { class: 'msg-text' }, part.text));
        else if (part && (part.type === 'image_url' || part.type === 'image')) el.append(h('div', { class: 'muted small' }, '[image]'));
        else el.append(h('pre', { class: 'msg-text' }, json(part)));
      }
    } else if (c != null) el.append(h('pre', { class: 'msg-text' }, json(c)));
    else if (!Array.isArray(m.tool_calls) || !m.tool_calls.length) el.append(h('div', { class: 'muted small' }, '(no content)'));
    if (Array.isArray(m.tool_calls)) {
      for (const tc of m.tool_calls) {
        const fn = (tc && tc.function) || {};
        let args = fn.arguments;
        if (typeof args === 'string') {
          try {
            args = JSON.stringify(JSON.parse(args), null, 1);
          } catch (e) {
            /* keep as sent */
          }
        } else args = json(args);
        el.append(h('div', { class: 'toolcall' },
          h('span', { class: 'tc-name mono' }, '\u2192 ' + show(fn.name || (tc && tc.type))),
          tc && tc.id ? h('span', { class: 'muted mono small' }, ' ' + tc.id) : null,
          h('pre', { class: 'msg-text' }, args == null ? '' : String(args))));
      }
    }
    return el;
  }

  // ---------------------------------------------------------------- token pieces (batched, cached)

  class PieceStore {
    constructor(page, rid) {
      this.page = page;
      this.rid = rid;
      this.map = new Map(); // id -> text | null (unavailable)
      this.sources = new Set(); // functions returning iterables of wanted ids, most urgent first
      this.listeners = new Set();
      this.busy = false;
      this.error = null;
      this.scheduled = false;
    }

    want() {
      if (this.scheduled) return;
      this.scheduled = true;
      Promise.resolve().then(() => {
        this.scheduled = false;
        this.flush();
      });
    }

    flush() {
      if (this.busy || !this.page.alive) return;
      const batch = [];
      const seen = new Set();
      outer: for (const src of this.sources) {
        for (const id of src()) {
          if (batch.length >= 4096) break outer;
          if (typeof id !== 'number' || this.map.has(id) || seen.has(id)) continue;
          seen.add(id);
          batch.push(id);
        }
      }
      if (!batch.length) return;
      this.busy = true;
      this.page.post(`/rollouts/${enc(this.rid)}/pieces`, { ids: batch }).then((res) => {
        const got = (res && res.pieces) || {};
        for (const id of batch) this.map.set(id, has(got, String(id)) && typeof got[id] === 'string' ? got[id] : null);
        this.error = res && res.error ? String(res.error) : null;
        this.page.clearError('pieces');
      }, (e) => {
        if (e && e.name === 'AbortError') return;
        for (const id of batch) this.map.set(id, null);
        this.error = e && e.message ? e.message : String(e);
        this.page.error('pieces', e);
      }).finally(() => {
        this.busy = false;
        if (!this.page.alive) return;
        for (const fn of this.listeners) fn();
        this.flush();
      });
    }
  }

  // ---------------------------------------------------------------- token strip (virtualised rows)

  const CELL_W = 58, CELL_H = 20, GUTTER = 58, OVERSCAN = 6, STRIP_H = 480;

  function createStrip(page, meta, seq, store, selected) {
    const ids = Array.isArray(seq.input_ids) ? seq.input_ids : [];
    const mask = Array.isArray(seq.loss_mask) ? seq.loss_mask : [];
    const lps = Array.isArray(seq.logprobs) ? seq.logprobs : [];
    const top = seq.top && typeof seq.top === 'object' ? seq.top : {};
    const spans = Array.isArray(seq.turn_spans) ? seq.turn_spans : (meta.turn_spans || []);
    const n = ids.length;
    let trained = 0;
    for (let i = 0; i < n; i++) trained += Number(mask[i]) || 0;
    const spanOf = new Int32Array(n).fill(-1);
    spans.forEach((sp, k) => {
      const a = Math.max(0, sp.start | 0), b = Math.min(n, sp.end | 0);
      for (let i = a; i < b; i++) spanOf[i] = k;
    });
    const sid = String(seq.sequence_id != null ? seq.sequence_id : meta.sequence_id);

    const status = h('span', { class: 'strip-status small' });
    const goto = h('input', { type: 'number', min: 0, max: Math.max(0, n - 1), placeholder: 'go to pos', class: 'goto', 'aria-label': 'go to position' });
    const legend = h('div', { class: 'legend strip-legend' },
      h('span', { class: 'lg' }, h('span', { class: 'lp-scale' }), h('span', { class: 'small' }, 'trained: logprob \u2264\u22125 \u2192 0')),
      h('span', { class: 'lg' }, h('span', { class: 'sw tok-ctx' }), 'context (loss 0)'),
      h('span', { class: 'lg' }, h('span', { class: 'sw tok-start' }), 'turn start'),
      h('span', { class: 'lg' }, h('span', { class: 'sw tok-sp0' }), h('span', { class: 'sw tok-sp1' }), 'alternate turns'),
      h('span', { class: 'lg muted' }, '\u23ce newline \u00b7 space \u21e5 tab'));
    // The strip is its own scroll container: a sticky caption, then a spacer of the full
    // height in which only the rows near the viewport exist.
    const spacer = h('div', { class: 'strip-spacer' });
    const view = h('div', {
      class: 'strip strip-view', 'data-testid': 'strip', 'data-scroll': '', tabindex: 0, 'aria-label': 'tokens',
      'data-sequence-id': sid, 'data-length': n, 'data-trained': trained,
    },
    h('div', { class: 'strip-caption' },
      h('span', { class: 'strip-count', 'data-testid': 'strip-count' }, `${trained} trained / ${n} tokens`),
      h('span', { class: 'muted small' }, ` \u00b7 sequence ${sid}`)),
    spacer);
    const tip = h('div', { class: 'token-tip', 'data-testid': 'token-tip', role: 'tooltip', hidden: true });
    const el = h('div', { class: 'strip-wrap' },
      h('div', { class: 'strip-bar' }, legend, h('span', { class: 'spacer' }), status, goto),
      view, tip);

    let cols = 0, rows = 0, raf = 0, selNode = selected || null, tipPos = -1, tipCell = null;
    const rendered = new Map(); // row -> div
    const disposers = [];
    const on = (t, ty, fn, o) => {
      t.addEventListener(ty, fn, o);
      disposers.push(() => t.removeEventListener(ty, fn, o));
    };

    function* visibleIds() {
      const keys = Array.from(rendered.keys());
      const first = Math.floor((view.scrollTop - spacer.offsetTop) / CELL_H);
      keys.sort((a, b) => Math.abs(a - first) - Math.abs(b - first));
      for (const r of keys) {
        const end = Math.min(n, (r + 1) * cols);
        for (let i = r * cols; i < end; i++) yield ids[i];
      }
    }
    function* tipIds() {
      if (tipPos < 0) return;
      yield ids[tipPos];
      const cands = top[String(tipPos)];
      if (Array.isArray(cands)) for (const c of cands) if (Array.isArray(c)) yield c[0];
    }

    function setText(cell, i) {
      const p = store.map.get(ids[i]);
      if (p === undefined) {
        cell.textContent = String(ids[i]);
        cell.classList.add('raw');
      } else if (p === null) {
        cell.textContent = '#' + ids[i];
        cell.classList.remove('raw');
        cell.classList.add('idonly');
      } else {
        cell.textContent = visible(p);
        cell.classList.remove('raw');
      }
    }

    function buildRow(r) {
      const row = document.createElement('div');
      row.className = 'srow';
      row.style.top = r * CELL_H + 'px';
      const g = document.createElement('span');
      g.className = 'gut';
      g.textContent = String(r * cols);
      row.appendChild(g);
      const end = Math.min(n, (r + 1) * cols);
      for (let i = r * cols; i < end; i++) {
        const c = document.createElement('span');
        const isTrained = Number(mask[i]) === 1;
        let cls = isTrained ? 'tok trained' : 'tok context';
        const k = spanOf[i];
        if (k >= 0) {
          const sp = spans[k];
          cls += (k & 1) ? ' sp1' : ' sp0';
          if (i === (sp.start | 0)) cls += ' sstart';
          if (selNode != null && String(sp.node_id) === selNode) cls += ' hl';
          c.setAttribute('data-node-id', String(sp.node_id));
        }
        c.className = cls;
        c.setAttribute('data-testid', 'token');
        c.setAttribute('data-pos', String(i));
        if (isTrained) c.style.backgroundColor = lpColor(lps[i]);
        setText(c, i);
        row.appendChild(c);
      }
      return row;
    }

    function update() {
      raf = 0;
      if (!cols) return;
      const st = view.scrollTop - spacer.offsetTop, vh = view.clientHeight || 400;
      const r0 = Math.max(0, Math.floor(st / CELL_H) - OVERSCAN);
      const r1 = Math.min(rows - 1, Math.ceil((st + vh) / CELL_H) + OVERSCAN);
      for (const [r, d] of rendered) {
        if (r < r0 || r > r1) {
          d.remove();
          rendered.delete(r);
        }
      }
      const frag = document.createDocumentFragment();
      for (let r = r0; r <= r1; r++) {
        if (!rendered.has(r)) {
          const d = buildRow(r);
          rendered.set(r, d);
          frag.appendChild(d);
        }
      }
      spacer.appendChild(frag);
      store.want();
      if (tipCell) {
        // keep the tip on its cell while that cell stays in view, else hide it
        const r = tipCell.isConnected ? tipCell.getBoundingClientRect() : null;
        const vr = view.getBoundingClientRect();
        if (!r || r.bottom <= vr.top || r.top >= vr.bottom) hideTip();
        else placeTip(r);
      }
    }

    function layout() {
      const w = view.clientWidth - GUTTER - 4;
      const c = Math.max(8, Math.floor(w / CELL_W));
      spacer.style.setProperty('--cw', Math.max(CELL_W, Math.floor(w / c)) + 'px');
      if (c === cols) return;
      const anchor = cols ? Math.floor(Math.max(0, view.scrollTop - spacer.offsetTop) / CELL_H) * cols : 0;
      cols = c;
      rows = Math.ceil(n / cols);
      spacer.style.height = rows * CELL_H + 'px';
      view.style.height = Math.min(STRIP_H, spacer.offsetTop + rows * CELL_H + 18) + 'px';
      for (const d of rendered.values()) d.remove();
      rendered.clear();
      if (anchor) view.scrollTop = spacer.offsetTop + Math.floor(anchor / cols) * CELL_H;
      update();
    }

    function refreshText() {
      for (const d of rendered.values()) {
        for (let c = d.firstChild.nextSibling; c; c = c.nextSibling) {
          if (c.classList.contains('raw')) {
            const i = +c.getAttribute('data-pos');
            if (store.map.has(ids[i])) setText(c, i);
          }
        }
      }
      if (!tip.hidden && tipPos >= 0) fillTip(tipPos);
      status.textContent = store.error ? 'token text unavailable: ' + store.error : '';
      status.classList.toggle('err-text', !!store.error);
    }

    let lpSource; // source text of each logprob, computed on the first tooltip
    function lpText(i) {
      if (lps[i] === undefined) return DASH;
      if (lpSource === undefined) lpSource = arraySource(seq.sourceText, 'logprobs', lps);
      return lpSource ? lpSource[i].trim() : fmtFloat(lps[i]);
    }

    function pieceText(id) {
      const p = store.map.get(id);
      if (p === undefined) return '(loading\u2026)';
      if (p === null) return '(text unavailable)';
      return JSON.stringify(p);
    }

    function fillTip(i) {
      const k = spanOf[i];
      const isTrained = Number(mask[i]) === 1;
      const row = (label, value, cls) => h('div', { class: 'tt-row' }, h('span', { class: 'tt-k' }, label), ' ', h('span', { class: 'tt-v ' + (cls || '') }, value));
      const kids = [
        row('position', String(i)),
        row('token id', String(ids[i]), 'mono'),
        row('text', pieceText(ids[i]), 'mono'),
        row('logprob', lpText(i), 'mono'),
        row('loss', isTrained ? 'trained' : 'context', isTrained ? 'good' : 'muted'),
        row('turn', k >= 0 ? String(spans[k].node_id) : DASH, 'mono'),
      ];
      const cands = top[String(i)];
      if (Array.isArray(cands) && cands.length) {
        kids.push(h('div', { class: 'tt-sub' }, 'top candidates'));
        const tb = h('table', { class: 'tt-top' }, h('tr', null, h('th', null, 'id'), h('th', null, 'text'), h('th', null, 'logprob')));
        for (const c of cands) {
          if (!Array.isArray(c)) continue;
          tb.append(h('tr', { class: c[0] === ids[i] ? 'chosen' : null },
            h('td', { class: 'mono' }, String(c[0])), h('td', { class: 'mono' }, pieceText(c[0])), h('td', { class: 'mono' }, fmtFloat(c[1]))));
        }
        kids.push(tb);
      } else {
        kids.push(h('div', { class: 'tt-sub muted' }, 'top candidates: not captured'));
      }
      tip.replaceChildren(...kids);
    }

    function showTip(cell) {
      const i = +cell.getAttribute('data-pos');
      if (!(i >= 0 && i < n)) return;
      if (tipCell) tipCell.classList.remove('tipped');
      tipCell = cell;
      cell.classList.add('tipped');
      tipPos = i;
      fillTip(i);
      tip.hidden = false;
      placeTip(cell.getBoundingClientRect());
      store.want();
    }

    function placeTip(r) {
      const tw = tip.offsetWidth, th = tip.offsetHeight;
      const x = Math.min(r.left, window.innerWidth - tw - 8);
      let y = r.bottom + 6;
      if (y + th > window.innerHeight - 4) y = Math.max(4, r.top - th - 6);
      tip.style.left = Math.max(4, x) + 'px';
      tip.style.top = y + 'px';
    }

    function hideTip() {
      if (tip.hidden) return;
      tip.hidden = true;
      tipPos = -1;
      if (tipCell) tipCell.classList.remove('tipped');
      tipCell = null;
    }

    on(view, 'scroll', () => {
      if (!raf) raf = requestAnimationFrame(update);
    }, { passive: true });
    on(window, 'scroll', () => {
      if (tipCell) placeTip(tipCell.getBoundingClientRect());
    }, { passive: true });
    const onHover = (e) => {
      const c = e.target.closest('[data-testid=token]');
      if (c && c !== tipCell) showTip(c);
    };
    on(view, 'mouseover', onHover);
    on(view, 'mousemove', onHover, { passive: true });
    on(view, 'click', (e) => {
      const c = e.target.closest('[data-testid=token]');
      if (c) showTip(c);
    });
    on(view, 'mouseleave', hideTip);
    on(document, 'keydown', (e) => {
      if (e.key === 'Escape') hideTip();
    });
    on(goto, 'keydown', (e) => {
      if (e.key !== 'Enter') return;
      const i = parseInt(goto.value, 10);
      if (i >= 0 && i < n) scrollToPos(i, true);
    });

    function scrollToPos(i, flash) {
      if (!cols) return;
      view.scrollTop = Math.max(0, spacer.offsetTop + (Math.floor(i / cols) - 2) * CELL_H);
      update();
      if (flash) {
        const c = spacer.querySelector(`[data-pos="${i}"]`);
        if (c) {
          c.classList.add('flash');
          setTimeout(() => c.classList.remove('flash'), 1200);
        }
      }
    }

    const ro = new ResizeObserver(() => layout());
    const src = visibleIds, tsrc = tipIds;
    const listener = () => refreshText();

    return {
      el,
      start() {
        store.sources.add(tsrc);
        store.sources.add(src);
        store.listeners.add(listener);
        layout();
        ro.observe(view);
        refreshText();
      },
      highlight(id, scroll) {
        selNode = id == null ? null : String(id);
        for (const d of rendered.values()) {
          for (let c = d.firstChild.nextSibling; c; c = c.nextSibling) {
            c.classList.toggle('hl', selNode != null && c.getAttribute('data-node-id') === selNode);
          }
        }
        if (scroll && selNode != null) {
          const sp = spans.find((s) => String(s.node_id) === selNode);
          if (sp) scrollToPos(sp.start | 0, false);
        }
      },
      destroy() {
        ro.disconnect();
        if (raf) cancelAnimationFrame(raf);
        store.sources.delete(src);
        store.sources.delete(tsrc);
        store.listeners.delete(listener);
        for (const d of disposers.splice(0)) d();
      },
    };
  }

  // ---------------------------------------------------------------- collections

  const CCOLS = [
    ['name', 'collection'], ['model', 'model'], ['engine_tier', 'tier'], ['progress', 'progress'],
    ['collected', 'collected', 'num'], ['filtered', 'filtered', 'num'], ['failed', 'failed', 'num'],
    ['reward_mean', 'reward mean', 'num'], ['updated_at', 'updated'],
  ];

  function progressBar(done, total) {
    const frac = total ? Math.max(0, Math.min(1, (Number(done) || 0) / Number(total))) : 0;
    const fill = h('span', { class: 'bar-fill' });
    fill.style.width = (frac * 100).toFixed(1) + '%';
    return h('span', { class: 'bar', role: 'progressbar', 'aria-valuenow': Number(done) || 0, 'aria-valuemax': Number(total) || 0 }, fill);
  }

  function pageCollections(page) {
    document.title = 'collections \u00b7 rollwire';
    const dir = h('span', { class: 'muted small mono' });
    const { table: t, tbody } = table('collections', CCOLS);
    const empty = h('div', { class: 'empty', hidden: true }, 'No collections in this data directory.');
    page.root.append(h('div', { class: 'toolbar' }, h('h1', null, 'Collections'), dir), h('div', { class: 'tablewrap' }, t), empty);
    (async () => {
      let data;
      try {
        data = await page.get('/collections');
      } catch (e) {
        page.error('collections', e);
        return;
      }
      if (!page.alive) return;
      dir.textContent = data.data_dir ? 'data dir ' + data.data_dir : '';
      const list = Array.isArray(data.collections) ? data.collections : [];
      empty.hidden = list.length > 0;
      syncRows(tbody, list, (c) => String(c.name), (c) => {
        const tr = h('tr', { 'data-collection': String(c.name) });
        const cells = {};
        for (const [f, , cls] of CCOLS) tr.append(cells[f] = h('td', { 'data-field': f, class: cls || null }));
        return { tr, cells };
      }, (rec, c) => {
        const x = rec.cells;
        x.name.replaceChildren(h('a', { class: 'mono', href: '/ui/collections/' + encPath(c.name) }, String(c.name)),
          c.eval ? h('a', { class: 'badge k-eval', 'data-testid': 'eval-link', href: '/ui/evals/' + encPath(c.name), title: 'the eval: per family, pass@k, comparison' }, 'eval') : null);
        rec.tr.classList.toggle('is-eval', !!c.eval);
        x.model.textContent = show(c.model);
        x.engine_tier.textContent = show(c.engine_tier);
        x.progress.replaceChildren(h('span', { class: 'phase' }, progressBar(c.done, c.episodes), h('span', { class: 'phase-text' }, `${show(c.done)}/${show(c.episodes)}`)));
        x.collected.textContent = show(c.collected);
        x.filtered.textContent = show(c.filtered);
        x.failed.textContent = show(c.failed);
        x.reward_mean.textContent = c.reward_mean == null ? DASH : fmtNum(c.reward_mean);
        x.updated_at.textContent = fmtAge(c.updated_at);
        x.updated_at.title = fmtTime(c.updated_at);
      });
    })();
  }

  function fmtNum(v) {
    if (typeof v !== 'number') return show(v);
    return Number.isInteger(v) ? String(v) : String(Math.round(v * 1000) / 1000);
  }

  function pageCollection(page, name) {
    document.title = name + ' \u00b7 rollwire';
    const progText = h('span', { class: 'prog-text' });
    const progBar = h('span', { class: 'bar big' }, h('span', { class: 'bar-fill' }));
    const progress = h('div', { class: 'cprogress', 'data-testid': 'collection-progress' }, progBar, progText);
    const hist = h('div', { class: 'hist', 'data-testid': 'reward-histogram' });
    const histNone = h('div', { class: 'small muted', 'data-testid': 'reward-none' });
    const manifest = h('pre', { class: 'manifest' });
    const tasksT = table('task-success', [['task', 'task'], ['episodes', 'episodes', 'num'], ['successes', 'successes', 'num'], ['rate', 'success rate', 'num'], ['mean_reward', 'mean reward', 'num']]);
    const failT = table('failures', [['created_at', 'when'], ['episode_id', 'episode'], ['task', 'task'], ['sample_index', 'sample', 'num'], ['exception_type', 'exception'], ['error', 'error'], ['engine', 'engine'], ['node', 'node']]);
    const failCount = h('span', { 'data-testid': 'failure-count', class: 'mono' });
    const failNote = h('span', { class: 'muted small' });
    const dir = h('span', { class: 'muted small mono' });
    const evalLink = h('a', { class: 'btn', 'data-testid': 'eval-link', href: '/ui/evals/' + encPath(name), hidden: true }, 'eval report');

    page.root.append(
      h('div', { class: 'toolbar' }, h('h1', { class: 'mono' }, name), evalLink, dir),
      h('div', { class: 'twocol even' },
        h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Progress')), progress,
          h('div', { class: 'panel-head' }, h('h2', null, 'Reward histogram')), hist, histNone),
        h('section', { class: 'panel' }, h('details', { class: 'mdetails', open: true }, h('summary', null, 'manifest.json'), manifest))),
      h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Per task')), h('div', { class: 'tablewrap inner' }, tasksT.table)),
      h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Failures '), h('span', null, failCount, ' total'), failNote),
        h('div', { class: 'tablewrap inner' }, failT.table)));

    const sigs = {};
    const changed = (k, v) => {
      const s = json(v);
      if (sigs[k] === s) return false;
      sigs[k] = s;
      return true;
    };

    page.poll(async () => {
      let d;
      try {
        d = await page.get('/collections/' + encPath(name));
      } catch (e) {
        page.error('collection', e);
        return;
      }
      if (!page.alive) return;
      page.clearError('collection');
      dir.textContent = d.data_dir ? 'data dir ' + d.data_dir : '';
      evalLink.hidden = !d.eval;
      const pr = d.progress || {};
      progText.textContent = `${show(pr.done)} / ${show(pr.total)} episodes` + (pr.total ? ` (${Math.round((100 * (Number(pr.done) || 0)) / Number(pr.total))}%)` : '');
      progBar.firstChild.style.width = (pr.total ? Math.min(100, (100 * (Number(pr.done) || 0)) / Number(pr.total)) : 0).toFixed(1) + '%';
      if (changed('manifest', d.manifest)) manifest.textContent = JSON.stringify(d.manifest ?? null, null, 2);
      const rh = d.reward_histogram || { bins: [], none: 0 };
      if (changed('hist', rh)) renderHistogram(hist, histNone, rh);
      if (changed('tasks', d.tasks)) {
        syncRows(tasksT.tbody, d.tasks || [], (t) => String(t.task), (t) => {
          const tr = h('tr', { 'data-task': String(t.task) });
          const cells = {};
          for (const f of ['task', 'episodes', 'successes', 'rate', 'mean_reward']) tr.append(cells[f] = h('td', { 'data-field': f, class: f === 'task' ? 'mono' : 'num' }));
          return { tr, cells };
        }, (rec, t) => {
          const x = rec.cells;
          x.task.textContent = String(t.task);
          x.episodes.textContent = show(t.episodes);
          x.successes.textContent = show(t.successes);
          const rate = t.episodes ? (Number(t.successes) || 0) / Number(t.episodes) : null;
          x.rate.replaceChildren(rate == null ? DASH : h('span', { class: 'phase' }, progressBar(t.successes, t.episodes), h('span', { class: 'phase-text' }, (rate * 100).toFixed(0) + '%')));
          x.mean_reward.textContent = t.mean_reward == null ? DASH : fmtNum(t.mean_reward);
        });
      }
      failCount.textContent = show(d.failure_count);
      const fails = d.failures || [];
      failNote.textContent = d.failure_count > fails.length ? ` \u00b7 newest ${fails.length} shown` : '';
      if (changed('fails', fails)) {
        syncRows(failT.tbody, fails, (f) => `${f.episode_id}|${f.sample_index}|${f.created_at}`, () => {
          const tr = h('tr');
          const cells = {};
          for (const f of ['created_at', 'episode_id', 'task', 'sample_index', 'exception_type', 'error', 'engine', 'node']) {
            tr.append(cells[f] = h('td', { 'data-field': f, class: f === 'error' ? 'errcell' : (f === 'sample_index' ? 'num' : null) }));
          }
          return { tr, cells };
        }, (rec, f) => {
          const x = rec.cells;
          rec.tr.setAttribute('data-episode-id', String(f.episode_id));
          x.created_at.textContent = fmtTime(f.created_at);
          x.episode_id.replaceChildren(h('span', { class: 'mono' }, show(f.episode_id)));
          x.task.textContent = show(f.task);
          x.sample_index.textContent = show(f.sample_index);
          x.exception_type.textContent = show(f.exception_type);
          x.error.textContent = show(f.error);
          x.engine.textContent = show(f.engine);
          x.node.textContent = show(f.node);
        });
      }
    }, 2000);
  }

  function renderHistogram(el, noneEl, rh) {
    const bins = Array.isArray(rh.bins) ? rh.bins : [];
    let max = 0;
    for (const b of bins) max = Math.max(max, Number(b.count) || 0);
    el.replaceChildren(...bins.map((b, i) => {
      const cnt = Number(b.count) || 0;
      const bar = h('div', { class: 'hbar' });
      bar.style.height = (max ? Math.max(cnt ? 2 : 0, (100 * cnt) / max) : 0).toFixed(1) + '%';
      return h('div', {
        class: 'hbin', 'data-bin': i, 'data-lo': String(b.lo), 'data-hi': String(b.hi), 'data-count': cnt,
        title: `[${b.lo}, ${b.hi}): ${cnt}`,
      }, h('div', { class: 'hcount' }, String(cnt)), h('div', { class: 'hcol' }, bar), h('div', { class: 'hlabel' }, fmtNum(b.lo)));
    }));
    if (!bins.length) el.append(h('div', { class: 'empty' }, 'No rewards yet.'));
    noneEl.textContent = `no reward (verifier never ran): ${show(rh.none)}`;
  }

  // ---------------------------------------------------------------- evals

  /** x.xxx, as `rollwire eval` prints it; an em dash for null. */
  const f3 = (v) => (typeof v === 'number' && isFinite(v) ? v.toFixed(3) : DASH);
  /** estimate ± standard error (no "±" when there is no standard error: one problem). */
  const pm = (v, se) => (typeof v !== 'number' ? DASH : f3(v) + (typeof se === 'number' ? ' \u00b1 ' + f3(se) : ''));
  /** a difference with its sign: +1.000, -0.250 (-0 keeps its sign, as Python's "+.3f"). */
  const signed = (v) => (typeof v !== 'number' || !isFinite(v) ? DASH : ((v < 0 || Object.is(v, -0)) ? '-' : '+') + Math.abs(v).toFixed(3));
  const SERIES = 8;

  /** A command line as a shell would take it back (single quotes where needed). */
  function shellLine(argv) {
    return (argv || []).map((a) => {
      const t = String(a);
      return /^[\w@%+=:,./-]+$/.test(t) ? t : "'" + t.replace(/'/g, "'\\''") + "'";
    }).join(' ');
  }

  function pageEval(page, name) {
    document.title = name + ' \u00b7 eval \u00b7 rollwire';
    const wanted = new URLSearchParams(location.search).get('compare') || '';
    const dir = h('span', { class: 'muted small mono' });
    const header = h('section', { class: 'rheader', 'data-testid': 'eval-header' }, h('h1', { class: 'mono' }, name));
    const famHost = h('div', { class: 'tablewrap inner' });
    const note = h('span', { class: 'muted small', 'data-testid': 'eval-note' });
    const chartHost = h('div', { class: 'charthost' });
    const legendHost = h('div', { class: 'legend' });
    const causesHost = h('div');
    const causesCount = h('span', { class: 'muted', 'data-testid': 'eval-failed-count' });
    const cmp = compareBox(page, name, wanted);

    page.root.append(
      h('div', { class: 'crumbs' }, h('a', { href: '/ui/collections' }, 'Collections'), h('span', { class: 'sep' }, '/'),
        h('a', { class: 'mono', href: '/ui/collections/' + encPath(name) }, name), h('span', { class: 'sep' }, '/'), h('span', null, 'eval'), dir),
      header,
      h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Per task family'), note), famHost),
      h('div', { class: 'twocol even' },
        h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'pass@k against k'),
          h('span', { class: 'muted small' }, 'mean over problems; bars \u00b11 standard error')), chartHost, legendHost),
        h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Failed attempts by cause'), causesCount), causesHost)),
      cmp.el);

    let sig = null;
    page.poll(async (p) => {
      let d;
      try {
        d = await page.get('/evals/' + encPath(name));
      } catch (e) {
        page.error('eval', e);
        if (e.status >= 400 && e.status < 500) p.stop();
        return;
      }
      if (!page.alive) return;
      page.clearError('eval');
      dir.textContent = d.data_dir ? ' \u00b7 data dir ' + d.data_dir : '';
      const r = d.report || {};
      // an eval still running (no eval.json yet) is summarised from its folder: follow it to the end
      if (r.complete || d.source === 'eval.json') p.stop();
      const s = json(d);
      if (s === sig) return;
      sig = s;
      const m = r.metrics || {};
      renderEvalHeader(header, name, d);
      const fams = [...(Array.isArray(m.families) ? m.families : []), ...(m.overall ? [m.overall] : [])];
      const ks = Array.isArray(m.ks) ? m.ks : [];
      famHost.replaceChildren(familyTable(fams, ks));
      note.textContent = `\u00b1 is the standard error over problems; a sample passes at reward \u2265 ${show(m.pass_threshold)}; a failed or never-scored sample scores ${show(m.failed_reward)}`;
      const chart = passkChart(fams, ks);
      chartHost.replaceChildren(chart.svg);
      legendHost.replaceChildren(...chart.legend);
      const causes = m.causes && typeof m.causes === 'object' ? Object.entries(m.causes) : [];
      causesCount.textContent = `${show(m.overall ? m.overall.failed : null)} failed of ${show(m.overall ? m.overall.samples : null)} samples`;
      if (!causes.length) {
        causesHost.replaceChildren(h('div', { class: 'empty', 'data-testid': 'eval-no-causes' }, 'No failed attempts.'));
      } else {
        const t = table('eval-causes', [['count', 'attempts', 'num'], ['cause', 'cause']]);
        for (const [cause, n] of causes) {
          t.tbody.append(h('tr', { 'data-cause': cause }, h('td', { class: 'num', 'data-field': 'count' }, show(n)), h('td', { class: 'errcell', 'data-field': 'cause' }, cause)));
        }
        causesHost.replaceChildren(h('div', { class: 'tablewrap inner' }, t.table));
      }
    }, 3000);
    cmp.start();
  }

  function renderEvalHeader(el, name, d) {
    const r = d.report || {};
    const m = r.metrics || {};
    const o = m.overall || {};
    const complete = !!r.complete;
    const title = h('div', { class: 'rtitle' },
      h('h1', { class: 'mono' }, name),
      h('span', { 'data-field': 'complete' }, complete ? badge('complete', 'st-done') : badge('incomplete', 'st-failed')),
      h('span', { class: 'muted small', 'data-field': 'source' }, d.source === 'eval.json' ? 'eval.json' : 'no eval.json: summarised from the folder (pass@1)'),
      h('span', { class: 'spacer' }),
      h('a', { class: 'btn', href: '/ui/collections/' + encPath(name) }, 'collection files'));
    const grid = h('div', { class: 'kvgrid' },
      kv('model', show(r.model), 'model', 'strong'),
      kv('engine tier', show(r.engine_tier), 'engine_tier'),
      kv('problems', show(o.problems), 'problems'),
      kv('samples', show(o.samples), 'samples'),
      kv('per problem', show(r.samples), 'samples_per_problem'),
      kv('tasks', show(Array.isArray(r.tasks) ? r.tasks.length : null), 'tasks'),
      kv('seed', show(r.seed), 'seed'),
      kv('missing', `${show(r.missing)} of ${show(r.planned)}`, 'missing', r.missing ? 'bad' : ''),
      r.halted ? kv('halted', String(r.halted), 'halted', 'bad') : null,
      kv('rollwire', show(r.rollwire_version), 'rollwire_version'),
      kv('created', show(r.created_at), 'created_at'));
    const kids = [title, grid];
    if (Array.isArray(r.command) && r.command.length) {
      kids.push(h('div', { class: 'cmdline' }, h('span', { class: 'k' }, 'command'), h('pre', { 'data-field': 'command' }, shellLine(r.command))));
    }
    if (Array.isArray(r.engines) && r.engines.length) kids.push(chipRow('engines', r.engines.map((u, i) => [String(i + 1), u]), 'engines'));
    el.replaceChildren(...kids);
  }

  function familyTable(fams, ks) {
    const cols = [['family', 'family'], ['problems', 'problems', 'num'], ['samples', 'samples', 'num'], ['passed', 'passed', 'num'],
      ['failed', 'failed', 'num'], ['reward', 'mean reward', 'num'], ...ks.map((k) => [`pass@${k}`, `pass@${k}`, 'num'])];
    const t = table('eval-families', cols);
    for (const f of fams) {
      const byK = new Map((f.pass_at || []).map((p) => [p.k, p]));
      const tr = h('tr', { 'data-family': String(f.family), class: f.family === 'overall' ? 'total' : null },
        h('td', { 'data-field': 'family', class: 'mono' }, String(f.family)),
        h('td', { 'data-field': 'problems', class: 'num' }, show(f.problems)),
        h('td', { 'data-field': 'samples', class: 'num' }, show(f.samples)),
        h('td', { 'data-field': 'passed', class: 'num' }, show(f.passed)),
        h('td', { 'data-field': 'failed', class: 'num' + (f.failed ? ' bad' : '') }, show(f.failed)),
        h('td', { 'data-field': 'reward', class: 'num mono' }, pm(f.reward_mean, f.reward_se)),
        ks.map((k) => {
          const p = byK.get(k);
          return h('td', { 'data-field': `pass@${k}`, class: 'num mono', title: p ? `over ${p.problems} problems with at least ${k} samples` : null }, p ? pm(p.estimate, p.se) : DASH);
        }));
      t.tbody.append(tr);
    }
    return t.table;
  }

  /** pass@k against k (log scale when several k): a line per family and overall, each point
   * with a bar of \u00b11 standard error (clipped to [0, 1] where drawn; the data attributes keep
   * the numbers). Series side by side a few pixels apart so equal ones stay visible. */
  function passkChart(fams, ks) {
    const W = 560, H = 280, L = 56, R = 16, T = 12, B = 40, PAD = 26;
    const x0 = L + PAD, x1 = W - R - PAD;
    const lk = ks.map((k) => Math.log(k));
    const lo = Math.min(...lk), hi = Math.max(...lk);
    const xOf = (k) => (ks.length < 2 || hi === lo ? (x0 + x1) / 2 : x0 + ((Math.log(k) - lo) / (hi - lo)) * (x1 - x0));
    const yOf = (v) => T + (1 - Math.max(0, Math.min(1, v))) * (H - T - B);
    const root = svg('svg', { class: 'chart', 'data-testid': 'passk-chart', viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-label': 'pass@k against k' });
    const axes = svg('g', { class: 'axes' });
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      axes.append(svg('line', { class: v === 0 ? 'axis' : 'grid', x1: L, x2: W - R, y1: yOf(v), y2: yOf(v) }),
        svg('text', { class: 'tick', x: L - 6, y: yOf(v) + 3.5, 'text-anchor': 'end' }, v.toFixed(2)));
    }
    axes.append(svg('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B }));
    for (const k of ks) {
      axes.append(svg('line', { class: 'axis', x1: xOf(k), x2: xOf(k), y1: H - B, y2: H - B + 4 }),
        svg('text', { class: 'tick', x: xOf(k), y: H - B + 15, 'text-anchor': 'middle', 'data-k': k }, String(k)));
    }
    axes.append(svg('text', { class: 'atitle', x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle' }, ks.length > 2 ? 'k (log scale)' : 'k'),
      svg('text', { class: 'atitle', x: 11, y: (T + H - B) / 2, 'text-anchor': 'middle', transform: `rotate(-90 11 ${(T + H - B) / 2})` }, 'pass@k'));
    root.append(axes);
    const n = fams.length;
    const step = n > 1 ? Math.min(7, 36 / (n - 1)) : 0;
    const legend = [];
    fams.forEach((f, i) => {
      const overall = f.family === 'overall';
      const cls = 'series ' + (overall ? 'overall' : 's' + (i % SERIES));
      const dx = (i - (n - 1) / 2) * step;
      const g = svg('g', { class: cls, 'data-series': String(f.family) });
      const pts = [];
      for (const p of f.pass_at || []) {
        if (typeof p.estimate !== 'number' || !ks.includes(p.k)) continue;
        const x = xOf(p.k) + dx;
        const y = yOf(p.estimate);
        pts.push([x, y]);
        const pg = svg('g', {
          class: 'pt', 'data-testid': 'passk-point', 'data-k': p.k, 'data-estimate': p.estimate,
          'data-se': typeof p.se === 'number' ? p.se : '', 'data-problems': p.problems,
        }, svg('title', null, `${f.family} pass@${p.k} = ${pm(p.estimate, p.se)} (${p.problems} problems)`));
        if (typeof p.se === 'number') {
          const ylo = yOf(p.estimate - p.se), yhi = yOf(p.estimate + p.se);
          pg.append(
            svg('line', { class: 'ebar', 'data-testid': 'passk-errbar', 'data-lo': p.estimate - p.se, 'data-hi': p.estimate + p.se, x1: x, x2: x, y1: ylo, y2: yhi }),
            svg('line', { class: 'ecap', x1: x - 3.5, x2: x + 3.5, y1: ylo, y2: ylo }),
            svg('line', { class: 'ecap', x1: x - 3.5, x2: x + 3.5, y1: yhi, y2: yhi }));
        }
        pg.append(svg('circle', { class: 'dot', cx: x, cy: y, r: overall ? 4 : 3.2 }));
        g.append(pg);
      }
      if (pts.length > 1) g.prepend(svg('path', { class: 'sline', d: pts.map(([x, y], j) => `${j ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)}`).join(' ') }));
      root.append(g);
      legend.push(h('span', { class: 'lg', 'data-series': String(f.family) }, h('span', { class: 'sw ' + cls.replace('series ', 'c-') }), h('span', { class: 'mono' }, String(f.family))));
    });
    if (!ks.length || !n) root.append(svg('text', { class: 'tick', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no pass@k in this eval'));
    return { svg: root, legend };
  }

  /** The comparison of this eval (A) with another (B) picked from the evals of the data dir. */
  function compareBox(page, name, wanted) {
    const sel = h('select', { 'data-testid': 'compare-select', 'aria-label': 'eval to compare with' },
      h('option', { value: '' }, 'compare with\u2026'));
    const status = h('span', { class: 'muted small', 'data-testid': 'compare-status' });
    const errEl = h('div', { class: 'error', 'data-testid': 'compare-error', role: 'alert', hidden: true });
    const body = h('div', { 'data-testid': 'compare-result' });
    const el = h('section', { class: 'panel', 'data-testid': 'eval-compare' },
      h('div', { class: 'panel-head' }, h('h2', null, 'Compare'), h('span', { class: 'mono' }, 'A = ' + name), h('span', null, 'B ='), sel, status),
      errEl, body);
    let seq = 0;

    async function run(other) {
      const mine = ++seq;
      history.replaceState(null, '', '/ui/evals/' + encPath(name) + (other ? '?compare=' + enc(other) : ''));
      errEl.hidden = true;
      body.replaceChildren();
      if (!other) {
        status.textContent = '';
        return;
      }
      status.textContent = 'comparing\u2026';
      let c;
      try {
        c = await page.get(`/compare?a=${enc(name)}&b=${enc(other)}`);
      } catch (e) {
        if (mine !== seq || !page.alive || (e && e.name === 'AbortError')) return;
        status.textContent = '';
        errEl.textContent = e && e.message ? e.message : String(e);
        errEl.hidden = false;
        return;
      }
      if (mine !== seq || !page.alive) return;
      status.textContent = '';
      body.replaceChildren(...comparisonView(c));
    }

    page.on(sel, 'change', () => run(sel.value));
    return {
      el,
      start: async () => {
        let list;
        try {
          list = await page.get('/collections');
        } catch (e) {
          page.error('evals', e);
          return;
        }
        if (!page.alive) return;
        const names = (list.collections || []).filter((c) => c.eval && c.name !== name).map((c) => String(c.name));
        if (wanted && !names.includes(wanted)) names.push(wanted);
        append(sel, names.map((n) => h('option', { value: n }, n)));
        if (!names.length) status.textContent = 'no other eval in this data directory';
        if (wanted) {
          sel.value = wanted;
          run(wanted);
        }
      },
    };
  }

  function comparisonView(c) {
    const fams = [...(Array.isArray(c.families) ? c.families : []), ...(c.overall ? [c.overall] : [])];
    const conf = typeof c.confidence === 'number' ? Math.round(c.confidence * 100) + '%' : '95%';
    const o = c.overall || {};
    const note = h('p', { class: 'small', 'data-testid': 'compare-note' },
      h('span', { class: 'mono' }, `A: ${c.a}`), ' \u00b7 ', h('span', { class: 'mono' }, `B: ${c.b}`), h('br'),
      `B \u2212 A, paired by problem: ${show(o.problems)} problems; ${conf} interval from a paired bootstrap over problems `
      + `(${typeof c.resamples === 'number' ? c.resamples.toLocaleString('en-US') : DASH} resamples, seed ${show(c.seed)}); `
      + `p from a paired permutation test (${show(o.permutation)})`);
    const t = table('compare-table', [['family', 'family'], ['metric', 'metric'], ['a', 'A', 'num'], ['b', 'B', 'num'],
      ['diff', 'B \u2212 A', 'num'], ['ci', conf + ' CI', 'num'], ['p', 'p', 'num']]);
    const rows = [];
    for (const f of fams) {
      for (const d of f.differences || []) {
        rows.push([f, d]);
        const excl = d.ci_low > 0 || d.ci_high < 0;
        t.tbody.append(h('tr', { 'data-family': String(f.family), 'data-metric': String(d.metric), class: f.family === 'overall' ? 'total' : null },
          h('td', { 'data-field': 'family', class: 'mono' }, String(f.family)),
          h('td', { 'data-field': 'metric', class: 'mono' }, String(d.metric)),
          h('td', { 'data-field': 'a', class: 'num mono' }, f3(d.a)),
          h('td', { 'data-field': 'b', class: 'num mono' }, f3(d.b)),
          h('td', { 'data-field': 'diff', class: 'num mono' + (excl ? (d.diff > 0 ? ' up' : ' down') : '') }, signed(d.diff)),
          h('td', { 'data-field': 'ci', class: 'num mono' }, `[${signed(d.ci_low)}, ${signed(d.ci_high)}]`),
          h('td', { 'data-field': 'p', class: 'num mono' }, typeof d.p_value === 'number' ? d.p_value.toFixed(4) : DASH)));
      }
    }
    const w = table('compare-wins', [['family', 'family'], ['wins', 'wins', 'num'], ['losses', 'losses', 'num'], ['ties', 'ties', 'num']]);
    for (const f of fams) {
      w.tbody.append(h('tr', { 'data-family': String(f.family), class: f.family === 'overall' ? 'total' : null },
        h('td', { 'data-field': 'family', class: 'mono' }, String(f.family)),
        h('td', { 'data-field': 'wins', class: 'num' }, show(f.wins)),
        h('td', { 'data-field': 'losses', class: 'num' }, show(f.losses)),
        h('td', { 'data-field': 'ties', class: 'num' }, show(f.ties))));
    }
    return [note,
      h('div', { class: 'tablewrap inner' }, t.table),
      h('div', { class: 'twocol cmp-charts' },
        h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Differences'), h('span', { class: 'muted small' }, `B \u2212 A with its ${conf} interval; the line is no difference`)), diffChart(rows)),
        h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'Per problem, mean reward'), h('span', { class: 'muted small' }, 'B against A')), h('div', { class: 'tablewrap inner' }, w.table)))];
  }

  /** The smallest of 1, 2, 2.5, 5 times a power of ten at or above v (1 for nothing). */
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const f of [1, 2, 2.5, 5, 10]) if (f * p >= v * (1 - 1e-9)) return f * p;
    return 10 * p;
  }

  /** Each difference as a point with its interval, against a line at zero (a symmetric axis). */
  function diffChart(rows) {
    const W = 640, LBL = 270, R = 28, PAD = 10, T = 8, RH = 20, B = 30;
    const H = T + rows.length * RH + B;
    let top = 0;
    for (const [, d] of rows) for (const v of [d.diff, d.ci_low, d.ci_high]) if (typeof v === 'number' && isFinite(v)) top = Math.max(top, Math.abs(v));
    const m = niceCeil(top);
    const xOf = (v) => LBL + PAD + ((v + m) / (2 * m)) * (W - LBL - R - 2 * PAD);
    const root = svg('svg', { class: 'chart', 'data-testid': 'compare-chart', viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-label': 'differences B minus A' });
    const yEnd = T + rows.length * RH;
    for (const v of [-m, -m / 2, m / 2, m]) {
      root.append(svg('line', { class: 'grid', x1: xOf(v), x2: xOf(v), y1: T, y2: yEnd }),
        svg('text', { class: 'tick', x: xOf(v), y: yEnd + 14, 'text-anchor': 'middle' }, signed(v)));
    }
    root.append(svg('line', { class: 'zero', 'data-testid': 'compare-zero', x1: xOf(0), x2: xOf(0), y1: T - 4, y2: yEnd }),
      svg('text', { class: 'tick', x: xOf(0), y: yEnd + 14, 'text-anchor': 'middle' }, '0'),
      svg('line', { class: 'axis', x1: LBL, x2: W - R, y1: yEnd, y2: yEnd }));
    rows.forEach(([f, d], i) => {
      const y = T + i * RH + RH / 2;
      const excl = d.ci_low > 0 || d.ci_high < 0;
      const label = `${f.family} \u00b7 ${d.metric}`;
      const g = svg('g', {
        class: 'dpt' + (excl ? (d.diff > 0 ? ' up' : ' down') : '') + (f.family === 'overall' ? ' overall' : ''),
        'data-testid': 'compare-point', 'data-family': String(f.family), 'data-metric': String(d.metric),
        'data-diff': d.diff, 'data-ci-low': d.ci_low, 'data-ci-high': d.ci_high,
      },
      svg('title', null, `${label}: ${signed(d.diff)} [${signed(d.ci_low)}, ${signed(d.ci_high)}], p ${typeof d.p_value === 'number' ? d.p_value.toFixed(4) : DASH}`),
      svg('text', { class: 'rlabel', x: LBL - 8, y: y + 3.5, 'text-anchor': 'end' }, label.length > 44 ? '\u2026' + label.slice(-43) : label),
      svg('line', { class: 'ci', x1: xOf(d.ci_low), x2: xOf(d.ci_high), y1: y, y2: y }),
      svg('line', { class: 'ecap', x1: xOf(d.ci_low), x2: xOf(d.ci_low), y1: y - 4, y2: y + 4 }),
      svg('line', { class: 'ecap', x1: xOf(d.ci_high), x2: xOf(d.ci_high), y1: y - 4, y2: y + 4 }),
      svg('circle', { class: 'dot', cx: xOf(d.diff), cy: y, r: 3.8 }));
      root.append(g);
    });
    return root;
  }

  // ---------------------------------------------------------------- sessions

  const SCOLS = [
    ['session', 'session'], ['endpoint', 'endpoint'], ['capture_level', 'capture'], ['calls', 'calls', 'num'],
    ['max_model_calls', 'max calls', 'num'],
    ['turns', 'turns', 'num'], ['roots', 'roots', 'num'], ['errors', 'errors', 'num'], ['seconds_since_last_call', 'idle', 'num'],
    ['created_at', 'created'], ['metadata', 'metadata'],
  ];

  function pageSessions(page) {
    document.title = 'sessions \u00b7 rollwire';
    const { table: t, tbody } = table('sessions', SCOLS);
    const empty = h('div', { class: 'empty', hidden: true }, 'No live capture sessions.');
    const meta = h('span', { class: 'muted small' });
    page.root.append(h('div', { class: 'toolbar' }, h('h1', null, 'Capture sessions'), h('span', { class: 'spacer' }), meta),
      h('div', { class: 'tablewrap' }, t), empty);
    page.poll(async () => {
      let d;
      try {
        d = await page.get('/sessions');
      } catch (e) {
        page.error('sessions', e);
        return;
      }
      if (!page.alive) return;
      page.clearError('sessions');
      const list = Array.isArray(d.sessions) ? d.sessions : [];
      empty.hidden = list.length > 0;
      meta.textContent = `${list.length} session${list.length === 1 ? '' : 's'} \u00b7 updated ${hms(new Date())}`;
      syncRows(tbody, list, (s) => `${s.endpoint}|${s.session}`, (s) => {
        const tr = h('tr', { 'data-session': String(s.session) });
        const cells = {};
        for (const [f, , cls] of SCOLS) tr.append(cells[f] = h('td', { 'data-field': f, class: cls || null }));
        return { tr, cells };
      }, (rec, s) => {
        const x = rec.cells;
        x.session.replaceChildren(h('span', { class: 'mono' }, show(s.session)));
        x.endpoint.replaceChildren(h('span', { class: 'mono small' }, show(s.endpoint)));
        x.capture_level.textContent = show(s.capture_level);
        x.calls.textContent = show(s.calls);
        x.max_model_calls.textContent = show(s.max_model_calls);
        x.turns.textContent = show(s.turns);
        x.roots.textContent = show(s.roots);
        x.errors.textContent = show(s.errors);
        x.errors.classList.toggle('bad', Number(s.errors) > 0);
        const idle = s.seconds_since_last_call;
        x.seconds_since_last_call.textContent = idle == null ? DASH : `${idle} s`;
        x.seconds_since_last_call.title = idle == null ? '' : fmtDur(Number(idle));
        x.created_at.textContent = fmtTime(s.created_at);
        const md = s.metadata && typeof s.metadata === 'object' ? Object.entries(s.metadata) : [];
        x.metadata.replaceChildren(...(md.length ? md.map(([k, v]) => h('span', { class: 'chip' }, h('span', { class: 'ck' }, k), h('span', { class: 'cv' }, typeof v === 'string' ? v : json(v)))) : [DASH]));
      });
    }, 1000);
  }

  // ---------------------------------------------------------------- start

  render();
})();
