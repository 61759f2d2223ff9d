// Small DOM helpers shared by the report views.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

// Escapes text for use inside HTML element content and quoted attribute values.
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// el("a", {href: "#x", class: "link"}, "text", childNode) -> an element. Attributes with
// value null/undefined/false are left out; true sets an empty attribute.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Parses an HTML string into a DocumentFragment (for markup built by escapeHtml'd templates).
export function fragment(html) {
  const t = document.createElement("template");
  t.innerHTML = html;
  return t.content;
}
