// The team server's HTTP API (docs/server.md) and its live WebSocket, as the dashboard uses
// them. Every refusal carries {"error": "..."}; it becomes an ApiError with that message.

export class ApiError extends Error {
  constructor(status, message, { retryAfter = null, path = "" } = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.retryAfter = retryAfter;
    this.path = path;
  }
}

// Called on any 401 of an authenticated request (the session expired or was logged out
// elsewhere): the app then shows its login page.
let unauthorizedHandler = null;
export function onUnauthorized(fn) {
  unauthorizedHandler = fn;
}

// The value of a cookie readable by JavaScript (the CSRF token; the session cookie is
// HttpOnly), or null. prefix: the first cookie whose name starts with `name`.
export function cookie(name, { prefix = false } = {}) {
  for (const part of document.cookie.split(";")) {
    const i = part.indexOf("=");
    if (i < 0) continue;
    const key = part.slice(0, i).trim();
    if (key === name || (prefix && key.startsWith(name))) {
      try {
        return decodeURIComponent(part.slice(i + 1).trim());
      } catch {
        return part.slice(i + 1).trim();
      }
    }
  }
  return null;
}

// fetch() of a JSON API path. Options: method, body (sent as JSON), headers, signal, auth
// (false: a 401 is the caller's business, e.g. a wrong password). Resolves to the parsed body;
// rejects with ApiError for a non-2xx answer or an unreadable body, and with the fetch's own
// AbortError when `signal` aborted it.
export async function api(path, { method = "GET", body, headers = {}, signal, auth = true } = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers }, signal,
                 credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e && e.name === "AbortError") throw e;
    throw new ApiError(0, `the server did not answer (${e && e.message ? e.message : e})`, { path });
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      if (res.ok) throw new ApiError(res.status, `${path}: the answer is not JSON`, { path });
    }
  }
  if (!res.ok) {
    const message = data && typeof data.error === "string" ? data.error : `${res.status} ${res.statusText}`.trim();
    const retry = res.headers.get("Retry-After");
    const err = new ApiError(res.status, message, { retryAfter: retry === null ? null : Number(retry), path });
    if (res.status === 401 && auth && unauthorizedHandler) unauthorizedHandler(err);
    throw err;
  }
  return data;
}

export function isAbort(e) {
  return e && e.name === "AbortError";
}

// The live event stream: a WebSocket on /api/v1/live (?run=ID for one run's events) that
// reconnects with a growing delay while it is wanted. onEvent(message) gets each JSON message;
// onState("open" | "closed") the connection's state; after a reconnect, onReopen() (events may
// have been missed: the page re-reads what it shows). close() ends it for good.
export function openLive(runId, { onEvent, onState = () => {}, onReopen = () => {} }) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${proto}//${location.host}/api/v1/live${runId === null || runId === undefined ? "" : `?run=${runId}`}`;
  let socket = null;
  let closed = false;
  let delay = 1000;
  let opens = 0;
  let timer = null;

  function connect() {
    if (closed) return;
    socket = new WebSocket(url);
    socket.addEventListener("open", () => {
      delay = 1000;
      opens += 1;
      onState("open");
      if (opens > 1) onReopen();
    });
    socket.addEventListener("message", (e) => {
      let msg;
      try {
        msg = JSON.parse(e.data);
      } catch {
        return;
      }
      onEvent(msg);
    });
    socket.addEventListener("close", async () => {
      if (closed) return;
      onState("closed");
      // A socket refused because the session ended (a browser shows no status for it): the
      // login page takes over instead of a reconnect loop.
      try {
        const s = await api("/api/v1/session", { auth: false });
        if (s && s.viewing && !s.logged_in) {
          closed = true;
          if (unauthorizedHandler) unauthorizedHandler(new ApiError(401, "the session has ended"));
          return;
        }
      } catch {
        // the server is down: keep retrying
      }
      if (closed) return;
      timer = setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    });
  }
  connect();
  return {
    close() {
      closed = true;
      if (timer !== null) clearTimeout(timer);
      if (!socket) return;
      // Closing a socket that is still connecting makes the browser log a warning: close it
      // once it is open instead.
      if (socket.readyState === WebSocket.CONNECTING) {
        const s = socket;
        s.addEventListener("open", () => s.close());
      } else {
        socket.close();
      }
    },
    get socket() { return socket; },
  };
}
