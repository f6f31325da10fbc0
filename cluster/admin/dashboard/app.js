// twistmq dashboard: reads the admin API (/api/v1/) and draws it. No framework, no build step.
"use strict";
(function () {
  const API = "/api/v1/";
  const state = { page: "overview", token: sessionStorage.getItem("twistmq-token") || "" };
  const $ = (id) => document.getElementById(id);

  function api(method, path) {
    const headers = {};
    if (state.token) headers.Authorization = "Bearer " + state.token;
    return fetch(API + path, { method, headers }).then((r) => r.json().then((body) => {
      if (r.status === 401) { $("auth").hidden = false; }
      if (!r.ok) {
        const err = new Error(body.message || r.statusText);
        err.status = r.status;
        throw err;
      }
      $("error").hidden = true;
      return body;
    }));
  }

  function showError(e) { $("error").textContent = String(e.message || e); $("error").hidden = false; }

  // Every page of a list route, following "next" (bounded: 50 pages).
  async function all(path) {
    let items = [], cursor = null;
    for (let i = 0; i < 50; i++) {
      const sep = path.includes("?") ? "&" : "?";
      const page = await api("GET", path + sep + "limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      items = items.concat(page.items);
      if (!page.next) break;
      cursor = page.next;
    }
    return items;
  }

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return n.toFixed(i ? 1 : 0) + " " + units[i];
  }

  function cell(row, text) { const td = row.insertCell(); td.textContent = text; return td; }

  function fill(tableId, items, render) {
    const body = $(tableId).tBodies[0];
    body.textContent = "";
    for (const item of items) render(body.insertRow(), item);
  }

  // The msg/s chart, drawn on a canvas: two lines over the history the server keeps.
  function drawChart(series) {
    const canvas = $("rate-chart"), ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 36;
    ctx.clearRect(0, 0, w, h);
    const values = series.in.concat(series.out);
    const max = Math.max(1, ...values);
    ctx.strokeStyle = "#e3e7eb"; ctx.fillStyle = "#667"; ctx.font = "11px sans-serif";
    for (let i = 0; i <= 4; i++) {
      const y = h - pad / 2 - (h - pad) * i / 4;
      ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 8, y); ctx.stroke();
      ctx.fillText((max * i / 4).toFixed(max < 10 ? 1 : 0), 2, y + 4);
    }
    // x is time: the newest point at the right edge; the window grows from 1 to 5 minutes (what the server keeps).
    const n = series.t.length;
    const now = n ? series.t[n - 1] : 0;
    const span = Math.min(300, Math.max(60, n ? now - series.t[0] : 0));
    ctx.fillText("-" + Math.round(span) + " s", pad, h - 2); ctx.fillText("now", w - 30, h - 2);
    const line = (data, color, dash) => {
      if (!n) return;
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.setLineDash(dash); ctx.beginPath();
      data.forEach((v, i) => {
        const x = pad + (w - pad - 8) * Math.max(0, 1 - (now - series.t[i]) / span);
        const y = h - pad / 2 - (h - pad) * v / max;
        if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      });
      ctx.stroke(); ctx.lineWidth = 1; ctx.setLineDash([]);
    };
    line(series.in, "#2e7dd7", []);
    line(series.out, "#e8830c", [6, 5]);  // dashed: "in" shows through where the two are equal
    // What was drawn, for tests and curious operators: the newest points and the scale.
    canvas.dataset.points = String(n);
    canvas.dataset.lastIn = String(n ? series.in[n - 1] : 0);
    canvas.dataset.lastOut = String(n ? series.out[n - 1] : 0);
    canvas.dataset.maxIn = String(n ? Math.max(...series.in) : 0);
    canvas.dataset.maxOut = String(n ? Math.max(...series.out) : 0);
  }

  async function overview() {
    const s = await api("GET", "stats");
    $("member").textContent = s.member_id + " · twistmq " + s.version;
    $("stat-connections").textContent = s.connections;
    $("stat-sessions").textContent = s.sessions;
    $("stat-in").textContent = s.rate.in.toFixed(1);
    $("stat-out").textContent = s.rate.out.toFixed(1);
    $("stat-store").textContent = bytes(s.store_bytes);
    $("stat-lag").textContent = s.lag.total;
    $("stat-deliver").textContent = s.latency_ms.deliver_p99 + " ms";
    $("stat-rss").textContent = bytes(s.process.rss_bytes);
    drawChart(s.series);
    fill("listeners-table", Object.entries(s.listeners), (row, [name, n]) => { cell(row, name); cell(row, n); });
  }

  function kickButton(row, clientId, label, method, path) {
    const btn = document.createElement("button");
    btn.textContent = label;
    btn.className = label;
    btn.dataset.clientId = clientId;
    btn.addEventListener("click", () => api(method, path).then(refresh, showError));
    row.insertCell().appendChild(btn);
  }

  async function clients() {
    const like = $("clients-filter").value;
    const items = await all("clients" + (like ? "?like=" + encodeURIComponent(like) : ""));
    fill("clients-table", items, (row, c) => {
      row.dataset.clientId = c.client_id;
      row.dataset.connected = String(c.connected);
      cell(row, c.client_id); cell(row, c.connected ? "yes" : "no"); cell(row, c.peer || "");
      cell(row, c.protocol_level); cell(row, c.subscriptions); cell(row, c.inflight);
      if (c.connected) kickButton(row, c.client_id, "kick", "DELETE", "clients/" + encodeURIComponent(c.client_id));
      else row.insertCell();
    });
  }

  async function sessions() {
    const items = await all("sessions");
    fill("sessions-table", items, (row, c) => {
      row.dataset.clientId = c.client_id;
      const link = document.createElement("a");
      link.href = "#sessions"; link.textContent = c.client_id;
      link.addEventListener("click", () => api("GET", "sessions/" + encodeURIComponent(c.client_id))
        .then((d) => { $("session-detail").textContent = JSON.stringify(d, null, 2); }, showError));
      row.insertCell().appendChild(link);
      cell(row, c.connected ? "yes" : "no"); cell(row, c.subscriptions); cell(row, c.inflight);
      kickButton(row, c.client_id, "delete", "DELETE", "sessions/" + encodeURIComponent(c.client_id));
    });
  }

  async function queues() {
    const items = await all("queues");
    fill("queues-table", items, (row, q) => {
      cell(row, q.topic_filter); cell(row, q.depth); cell(row, q.subscribers); cell(row, q.lag);
      if (!q.subscribers) kickButton(row, q.name, "drop", "DELETE", "queues/" + encodeURIComponent(q.name));
      else row.insertCell();
    });
  }

  async function cluster() {
    const items = await all("cluster/members");
    fill("members-table", items, (row, m) => {
      for (const k of ["id", "role", "group", "active", "healthy", "leader"]) cell(row, m[k] === null ? "" : String(m[k]));
    });
  }

  const pages = { overview, clients, sessions, queues, cluster };

  // A page whose route this server does not serve (the admin role has no overview or queues of its own) is
  // taken out of the navigation, and the first page it does serve is shown instead.
  const unserved = new Set();

  function refresh() {
    const page = state.page;
    return pages[page]().catch((e) => {
      if (e.status === 404 && String(e.message).startsWith("no route")) {
        unserved.add(page);
        const link = document.querySelector('nav a[data-page="' + page + '"]');
        if (link) link.hidden = true;
        const next = Object.keys(pages).find((p) => !unserved.has(p));
        if (next) { show(next); return; }
      }
      showError(e);
    });
  }

  function show(page) {
    state.page = pages[page] && !unserved.has(page) ? page : Object.keys(pages).find((p) => !unserved.has(p));
    for (const name of Object.keys(pages)) $("page-" + name).hidden = name !== state.page;
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === state.page);
    refresh();
  }

  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  $("clients-filter").addEventListener("input", refresh);
  $("token-save").addEventListener("click", () => {
    state.token = $("token").value;
    sessionStorage.setItem("twistmq-token", state.token);
    $("auth").hidden = true;
    refresh();
  });
  show(location.hash.slice(1));
  // The overview every second (its chart moves); the lists, which walk every client, every 3 seconds.
  let tick = 0;
  setInterval(() => { if (state.page === "overview" || ++tick % 3 === 0) refresh(); }, 1000);
})();
