// The gpuprof dashboard: a single page on hash routes, talking to the team server's API
// (docs/server.md). app.js checks the session, shows the login (or the "open the printed URL"
// page of the in-process dashboard), and mounts the view of the current route:
//   #/runs                  runs list              views/runs.js
//   #/runs/ID[?w=|from=&to=] one run, live         views/run.js
//   #/compare?runs=1,2      2–4 runs side by side  views/compare.js
//   #/groups/NAME           a multi-rank job       views/group.js
// Tests and benches: body[data-ready="1"] and body[data-view] once a view's first render is
// done (performance mark "gpuprof:render"), window.__gpuprof (charts, sync, view, session).
import { el } from "/lib/dom.js";
import { ApiError, api, cookie, isAbort, onUnauthorized } from "./api.js";
import { matchRoute, parseHash } from "./route.js";
import { errorBox, pageHeader } from "./ui.js";
import { mountRuns } from "./views/runs.js";
import { mountRun } from "./views/run.js";
import { mountCompare } from "./views/compare.js";
import { mountGroup } from "./views/group.js";
import { mountLogin, mountTokenNeeded, mountViewingOff } from "./views/login.js";

const main = document.getElementById("view");
const hooks = window.__gpuprof = { charts: {}, sync: null, view: null, route: null, session: null, renders: 0 };

let session = null;
let current = null; // { key, view, controller, match }

const VIEWS = { runs: mountRuns, run: mountRun, compare: mountCompare, group: mountGroup };

function viewKey(match) {
  switch (match.view) {
    case "run": return `run:${match.id}`;
    case "group": return `group:${match.name}`;
    case "compare": return `compare:${match.ids.join(",")}`;
    default: return match.view;
  }
}

function unmount() {
  if (!current) return;
  current.controller.abort();
  try {
    if (current.view && current.view.destroy) current.view.destroy();
  } catch (e) {
    console.warn("gpuprof: view teardown failed", e);
  }
  current = null;
  hooks.charts = {};
  hooks.sync = null;
  hooks.view = null;
  setLive(null);
  delete document.body.dataset.ready;
}

function setLive(state) {
  const node = document.getElementById("live-state");
  if (!state) {
    node.hidden = true;
    node.dataset.state = "off";
    return;
  }
  node.hidden = false;
  node.dataset.state = state;
  node.textContent = state === "open" ? "live" : "reconnecting…";
  node.title = state === "open" ? "receiving live updates" : "the live connection dropped; retrying";
}

function updateChrome() {
  const logout = document.getElementById("logout");
  logout.hidden = !(session && session.logged_in && session.mode === "serve");
  document.getElementById("version").textContent = session && session.version ? session.version : "";
  const info = document.getElementById("session-info");
  info.textContent = session && session.mode === "dashboard" ? "in-process dashboard" : "";
  document.querySelector(".topnav").hidden = !(session && session.logged_in);
  for (const a of document.querySelectorAll(".topnav a")) {
    const on = current && current.match.view === a.dataset.nav;
    if (on) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function makeContext(match, route, key) {
  const controller = new AbortController();
  let readyDone = false;
  const ctx = {
    root: main,
    match,
    route,
    query: route.query,
    session,
    hooks,
    signal: controller.signal,
    api: (path, opts = {}) => api(path, { signal: controller.signal, ...opts }),
    isActive: () => current && current.key === key && !controller.signal.aborted,
    // The view's first render is done (its charts drawn): tests and benches wait on this.
    ready() {
      if (readyDone || controller.signal.aborted) return;
      readyDone = true;
      hooks.renders += 1;
      performance.mark("gpuprof:render");
      document.body.dataset.view = match.view;
      document.body.dataset.ready = "1";
    },
    setLive(state) {
      if (ctx.isActive()) setLive(state);
    },
    setTitle(text) {
      document.title = text ? `${text} \u00b7 gpuprof` : "gpuprof";
    },
    // Whether an error is worth showing: not an abort (a view being left is not an error) and
    // not a 401 (the login page takes over).
    shouldShow(err) {
      if (isAbort(err) || controller.signal.aborted) return false;
      return !(err instanceof ApiError && err.status === 401);
    },
    // Shows an error in `target` (its content replaced).
    reportError(err, where, target = main) {
      if (!ctx.shouldShow(err)) return;
      target.replaceChildren(errorBox(err, where));
    },
  };
  return { ctx, controller };
}

function mount(match, route) {
  unmount();
  const key = viewKey(match);
  const { ctx, controller } = makeContext(match, route, key);
  current = { key, view: null, controller, match };
  hooks.route = route.path;
  document.body.dataset.view = match.view;
  main.replaceChildren();
  let view = null;
  try {
    if (!session.viewing) view = mountViewingOff(ctx);
    else if (!session.logged_in) {
      view = session.mode === "dashboard" ? mountTokenNeeded(ctx) : mountLogin(ctx, { onLoggedIn });
    } else if (VIEWS[match.view]) view = VIEWS[match.view](ctx);
    else {
      main.append(pageHeader("Not found"),
        el("p", {}, "There is no page at this address. ", el("a", { href: "#/runs" }, "All runs")));
      ctx.ready();
    }
  } catch (e) {
    console.error(e);
    main.replaceChildren(errorBox(e, "This page failed"));
    ctx.ready();
  }
  current.view = view;
  hooks.view = match.view;
  updateChrome();
  main.focus({ preventScroll: true });
}

function route() {
  const r = parseHash(location.hash);
  let match = matchRoute(r);
  if (session && session.logged_in) {
    if (match.view === "login") {
      location.replace("#/runs");
      return;
    }
    // The in-process dashboard opens on its own run.
    if (session.mode === "dashboard" && r.parts.length === 0 && session.run_id !== null && session.run_id !== undefined) {
      location.replace(`#/runs/${session.run_id}`);
      return;
    }
  } else if (session && session.viewing) {
    match = { view: "login" };
  }
  // The same view with other parameters (the run view's window): let it adapt in place.
  const key = viewKey(match);
  if (current && current.key === key && current.view && current.view.onQuery) {
    current.view.onQuery(r.query);
    return;
  }
  mount(match, r);
}

async function loadSession() {
  session = await api("/api/v1/session", { auth: false });
  hooks.session = session;
}

async function onLoggedIn() {
  await loadSession();
  const r = parseHash(location.hash);
  if (matchRoute(r).view === "login" || r.parts.length === 0) {
    const target = session.mode === "dashboard" && session.run_id != null ? `#/runs/${session.run_id}` : "#/runs";
    if (location.hash !== target) {
      location.hash = target; // routes on hashchange
      return;
    }
  }
  current = null;
  route();
}

async function logout() {
  const button = document.getElementById("logout");
  button.disabled = true;
  try {
    // The session's CSRF token: from /api/v1/session, else the readable gpuprof_csrf cookie
    // (named gpuprof_csrf_SUFFIX on the in-process dashboard).
    const token = (session && session.csrf) || cookie("gpuprof_csrf", { prefix: true }) || "";
    await api("/api/v1/logout", { method: "POST", headers: { "X-CSRF-Token": token } });
    unmount();
    await loadSession();
    updateChrome();
    if (location.hash !== "#/login") location.hash = "#/login";
    else route();
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) {
      main.prepend(errorBox(e, "Log out failed"));
    }
  } finally {
    button.disabled = false;
  }
}

async function boot() {
  document.getElementById("logout").addEventListener("click", logout);
  onUnauthorized(async () => {
    // The session expired or ended elsewhere: back to the login page.
    if (!session || !session.logged_in) return;
    session = { ...session, logged_in: false };
    hooks.session = session;
    unmount();
    try {
      await loadSession();
    } catch (e) {
      // keep logged_in false
    }
    route();
  });
  window.addEventListener("hashchange", route);
  try {
    if (!window.Dygraph || typeof window.Dygraph.synchronize !== "function") {
      throw new Error("the chart library did not load (/vendor/dygraphs/dygraph.min.js and synchronizer.js)");
    }
    await loadSession();
  } catch (e) {
    main.replaceChildren(pageHeader("gpuprof"), errorBox(e, "The dashboard cannot start"));
    document.body.dataset.ready = "1";
    return;
  }
  route();
}

boot();
