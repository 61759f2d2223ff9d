// The pages before the dashboard: the viewer login (gpuprof serve), the in-process dashboard's
// "open the printed URL" page, and the notice that viewing is off.
import { el } from "/lib/dom.js";
import { ApiError, api } from "../api.js";

function panel(...children) {
  return el("section", { class: "auth-panel" }, el("div", { class: "auth-brand" },
    el("span", { class: "brand-mark", "aria-hidden": "true" }), "gpuprof"), ...children);
}

export function mountLogin(ctx, { onLoggedIn }) {
  ctx.setTitle("Log in");
  const password = el("input", { id: "password", name: "password", type: "password",
                                 autocomplete: "current-password", required: true });
  const submit = el("button", { class: "btn btn-primary", type: "submit", id: "login-submit" }, "Log in");
  const message = el("p", { id: "login-error", class: "form-error", role: "alert", hidden: true });
  // A username field (there is none: one shared viewer password) lets password managers and
  // assistive tools read the form right.
  const user = el("input", { type: "text", name: "username", autocomplete: "username", value: "viewer",
                             hidden: true, tabindex: "-1", "aria-hidden": "true" });
  const form = el("form", { class: "auth-form", id: "login-form", "data-testid": "login" },
    user, el("label", { for: "password" }, "Viewer password"), password, message, submit);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    submit.disabled = true;
    message.hidden = true;
    try {
      await api("/api/v1/login", { method: "POST", body: { password: password.value }, auth: false });
      password.value = "";
      await onLoggedIn();
    } catch (err) {
      let text;
      if (err instanceof ApiError && err.status === 429) {
        const n = Number.isFinite(err.retryAfter) ? err.retryAfter : null;
        text = n === null ? "too many attempts, retry later" : `too many attempts, retry in ${n} s`;
      } else {
        text = err.message || String(err);
      }
      message.textContent = text;
      message.hidden = false;
      password.select();
    } finally {
      submit.disabled = false;
    }
  });
  ctx.root.append(panel(el("h1", {}, "Log in"),
    el("p", { class: "muted" }, "This server's runs are visible to viewers with its viewer password."),
    form));
  password.focus();
  ctx.ready();
  return {};
}

export function mountTokenNeeded(ctx) {
  ctx.setTitle("Open the printed URL");
  ctx.root.append(panel(el("h1", {}, "Open the URL the training process printed"),
    el("p", {}, "This is the live dashboard of one training run. To view it, open the URL that the " +
      "training process printed when it started (",
      el("code", {}, "http://…/login?token=…"), ")."),
    el("p", { class: "muted", "data-testid": "token-note" },
      "The token is single-use: once a browser has logged in with it, the URL no longer works. " +
      "Restart from that browser, or start the run again for a new URL.")));
  ctx.ready();
  return {};
}

export function mountViewingOff(ctx) {
  ctx.setTitle("Viewing is off");
  ctx.root.append(panel(el("h1", {}, "Viewing is off"),
    el("p", { "data-testid": "viewing-off" }, "viewing is off on this server (start gpuprof serve with ",
      el("code", {}, "--viewer-password"), ")")));
  ctx.ready();
  return {};
}
