// Hash routes of the dashboard: "#/runs/3?w=5m" <-> { path, parts, query }. Pure functions.

// Parses a location hash ("#/runs/3?from=1&to=2", "", "#") into { path: "/runs/3",
// parts: ["runs", "3"], query: URLSearchParams }. Parts are percent-decoded; an empty hash is
// the path "/".
export function parseHash(hash) {
  let text = String(hash || "").replace(/^#/, "");
  const q = text.indexOf("?");
  const query = new URLSearchParams(q >= 0 ? text.slice(q + 1) : "");
  if (q >= 0) text = text.slice(0, q);
  if (!text.startsWith("/")) text = "/" + text;
  const parts = text.split("/").filter(Boolean).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  return { path: "/" + parts.map(encodeURIComponent).join("/"), parts, query };
}

// Builds "#/a/b?k=v" from path parts and a parameter object (null/undefined values left out).
export function buildHash(parts, params = {}) {
  const path = "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `${path}?${s.replace(/%2C/g, ",")}` : path;
}

// Which view a route shows: { view: "runs" | "run" | "compare" | "group" | "login" |
// "notfound", ...params }.
export function matchRoute(route) {
  const p = route.parts;
  if (p.length === 0 || (p.length === 1 && p[0] === "runs")) return { view: "runs" };
  if (p.length === 2 && p[0] === "runs" && /^\d+$/.test(p[1])) return { view: "run", id: Number(p[1]) };
  if (p.length === 1 && p[0] === "compare") {
    const ids = (route.query.get("runs") || "").split(",").filter((s) => /^\d+$/.test(s)).map(Number);
    return { view: "compare", ids };
  }
  if (p.length === 2 && p[0] === "groups") return { view: "group", name: p[1] };
  if (p.length === 1 && p[0] === "login") return { view: "login" };
  return { view: "notfound" };
}
