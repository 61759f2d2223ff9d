// The report's deep links (location.hash). Pure functions, no DOM.
//   #view=overview | files | functions | memory | gpu   a section
//   #file=<index>[&line=<n>]                           the source view of payload.files[index],
//                                                       scrolled to and highlighting line n

export const VIEWS = ["overview", "files", "functions", "memory", "gpu"];

function nonNegativeInt(text) {
  if (text === null || !/^\d+$/.test(text)) return null;
  return Number(text);
}

// "#file=2&line=14" -> { view: "source", file: 2, line: 14 }; anything unreadable -> overview.
export function parseHash(hash) {
  const params = new URLSearchParams(String(hash || "").replace(/^#/, ""));
  const file = nonNegativeInt(params.get("file"));
  if (file !== null) {
    const line = nonNegativeInt(params.get("line"));
    return { view: "source", file, line: line && line > 0 ? line : null };
  }
  const view = params.get("view");
  return { view: VIEWS.includes(view) ? view : "overview", file: null, line: null };
}

export function lineHref(file, line) {
  return line ? `#file=${file}&line=${line}` : `#file=${file}`;
}

export function viewHref(view) {
  return `#view=${view}`;
}
