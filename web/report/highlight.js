// Python syntax highlighting for the source view, and links from call names to their
// definitions. Pure functions, no DOM: a small tokenizer (not a parser) that knows what a
// reader of profiled code needs to see — keywords, strings (prefixed, f-strings with their
// {expressions}, triple-quoted across lines), comments, numbers, decorators, builtins and
// call names. Anything it does not recognise is plain text, so a line is never lost.
import { escapeHtml } from "../lib/dom.js";

export const PY_KEYWORDS = new Set([
  "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
  "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
  "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
  "try", "while", "with", "yield",
]);
// Soft keywords: keywords only where they start a statement (`match x:`, `case 1:`).
const SOFT_KEYWORDS = new Set(["match", "case", "type"]);

export const PY_BUILTINS = new Set([
  "abs", "all", "any", "ascii", "bin", "bool", "breakpoint", "bytearray", "bytes", "callable",
  "chr", "classmethod", "compile", "complex", "delattr", "dict", "dir", "divmod", "enumerate",
  "eval", "exec", "filter", "float", "format", "frozenset", "getattr", "globals", "hasattr",
  "hash", "help", "hex", "id", "input", "int", "isinstance", "issubclass", "iter", "len",
  "list", "locals", "map", "max", "memoryview", "min", "next", "object", "oct", "open", "ord",
  "pow", "print", "property", "range", "repr", "reversed", "round", "set", "setattr", "slice",
  "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "vars", "zip", "self",
  "cls", "NotImplemented", "Ellipsis", "__name__", "__file__",
  "Exception", "BaseException", "ValueError", "TypeError", "KeyError", "IndexError",
  "RuntimeError", "StopIteration", "AttributeError", "ImportError", "OSError",
  "NotImplementedError", "ZeroDivisionError", "AssertionError",
]);

const IDENT = /[A-Za-z_\u00c0-\uffff][\w\u00c0-\uffff]*/y;
const NUMBER = /(?:0[xX][\da-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?[jJ]?)/y;
const PREFIX = /(?:[rR][bBfF]?|[bBfF][rR]?|[uU])?(?:"""|'''|"|')/y;

// Tokens are [type, text]; type is "" (plain), "kw", "str", "com", "num", "dec", "bi" (a
// builtin), "call" (a name called: `f(`), "def" (the name a def/class defines), or "fx" (the
// braces of an f-string's replacement field).
//
// `state` carries an open triple-quoted string into the next line: null or
// { quote: '"""' | "'''", f: bool, raw: bool }. Returns { tokens, state }.
export function tokenizeLine(text, state = null) {
  const tokens = [];
  let i = 0;
  const push = (type, t) => {
    if (!t) return;
    const last = tokens[tokens.length - 1];
    if (last && last[0] === type && type !== "call" && type !== "def") last[1] += t;
    else tokens.push([type, t]);
  };
  if (state) {
    const r = readString(text, 0, state.quote, state.f, state.raw);
    for (const t of r.tokens) push(t[0], t[1]);
    i = r.end;
    state = r.open ? state : null;
    if (state) return { tokens, state };
  }
  let statementStart = /^\s*$/.test(text.slice(0, i));
  let afterDefKw = false;
  while (i < text.length) {
    const c = text[i];
    if (c === "#") {
      push("com", text.slice(i));
      break;
    }
    if (c === " " || c === "\t") {
      let j = i;
      while (j < text.length && (text[j] === " " || text[j] === "\t")) j++;
      push("", text.slice(i, j));
      i = j;
      continue;
    }
    PREFIX.lastIndex = i;
    const pm = PREFIX.exec(text);
    if (pm) {
      const prefix = pm[0].replace(/["']+$/, "");
      const quote = pm[0].slice(prefix.length);
      const q = quote.length === 3 ? quote : quote[0];
      const f = /[fF]/.test(prefix);
      const raw = /[rR]/.test(prefix);
      push("str", pm[0]);
      const r = readString(text, i + pm[0].length, q, f, raw);
      for (const t of r.tokens) push(t[0], t[1]);
      i = r.end;
      if (r.open && q.length === 3) return { tokens, state: { quote: q, f, raw } };
      statementStart = false;
      continue;
    }
    if (c === "@" && statementStart) {
      let j = i + 1;
      while (j < text.length && /[\w.\u00c0-\uffff]/.test(text[j])) j++;
      push("dec", text.slice(i, j));
      i = j;
      statementStart = false;
      continue;
    }
    IDENT.lastIndex = i;
    const im = IDENT.exec(text);
    if (im) {
      const word = im[0];
      const j = i + word.length;
      let k = j;
      while (k < text.length && (text[k] === " " || text[k] === "\t")) k++;
      const called = text[k] === "(";
      const prev = previousSignificant(tokens);
      const attribute = prev === ".";
      if (afterDefKw) {
        push("def", word);
        afterDefKw = false;
      } else if (!attribute && PY_KEYWORDS.has(word)) {
        push("kw", word);
        afterDefKw = word === "def" || word === "class";
      } else if (!attribute && statementStart && SOFT_KEYWORDS.has(word) &&
                 k > j && k < text.length && /[\w(\[{"'\-]/.test(text[k]) &&
                 !/^\s*=(?!=)/.test(text.slice(j))) {
        push("kw", word);
      } else if (!attribute && PY_BUILTINS.has(word)) {
        push("bi", word);  // also when called: print(...), len(...)
      } else if (called) {
        push("call", word);
      } else {
        push("", word);
      }
      i = j;
      statementStart = false;
      continue;
    }
    if (/\d/.test(c) || (c === "." && /\d/.test(text[i + 1] || ""))) {
      NUMBER.lastIndex = i;
      const nm = NUMBER.exec(text);
      const t = nm && nm[0] ? nm[0] : c;
      push("num", t);
      i += t.length;
      statementStart = false;
      continue;
    }
    push("", c);
    i++;
    statementStart = false;
  }
  return { tokens, state: null };
}

function previousSignificant(tokens) {
  for (let k = tokens.length - 1; k >= 0; k--) {
    const t = tokens[k][1].trimEnd();
    if (t) return t[t.length - 1];
  }
  return "";
}

// The rest of a string body from `start`: up to and including its closing quote `q`, or to
// the end of the line (open). In an f-string, {expressions} are tokenized as code.
function readString(text, start, q, f, raw) {
  const tokens = [];
  let i = start;
  let run = "";
  const flush = () => {
    if (run) tokens.push(["str", run]);
    run = "";
  };
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && !raw) {
      run += text.slice(i, i + 2);
      i += 2;
      continue;
    }
    if (c === "\\" && raw) {  // a raw string still cannot end on an escaped quote
      run += text.slice(i, i + 2);
      i += 2;
      continue;
    }
    if (text.startsWith(q, i)) {
      run += q;
      flush();
      return { tokens, end: i + q.length, open: false };
    }
    if (f && c === "{") {
      if (text[i + 1] === "{") {
        run += text.slice(i, i + 2);  // an escaped brace
        i += 2;
        continue;
      }
      const close = fieldEnd(text, i + 1, q);
      if (close < 0) {
        run += c;
        i++;
        continue;
      }
      flush();
      tokens.push(["fx", "{"]);
      const inner = tokenizeLine(text.slice(i + 1, close)).tokens;
      for (const t of inner) tokens.push(t);
      tokens.push(["fx", "}"]);
      i = close + 1;
      continue;
    }
    run += c;
    i++;
  }
  flush();
  return { tokens, end: text.length, open: q.length === 3 };
}

// The index of the "}" closing an f-string replacement field that starts at `from` (after
// its "{"), or -1. Nested braces and quoted strings inside the field are skipped.
function fieldEnd(text, from, q) {
  let depth = 0;
  for (let i = from; i < text.length; i++) {
    const c = text[i];
    if (text.startsWith(q, i)) return -1;
    if (c === "'" || c === '"') {
      const end = text.indexOf(c, i + 1);
      if (end < 0) return -1;
      i = end;
      continue;
    }
    if (c === "{" || c === "[" || c === "(") depth++;
    else if (c === "}" && depth === 0) return i;
    else if (c === "}" || c === "]" || c === ")") depth--;
  }
  return -1;
}

// Every line of a file, tokenized with the triple-quote state carried from line to line.
export function tokenizePython(lines) {
  const out = [];
  let state = null;
  for (const text of lines) {
    const r = tokenizeLine(text ?? "", state);
    out.push(r.tokens);
    state = r.state;
  }
  return out;
}

// Call targets: name -> the definitions a call spelled `name(` may mean. `symbols` are the
// payload's { name, qualname, file, line }.
export function symbolIndex(symbols) {
  const byName = new Map();
  for (const s of symbols || []) {
    if (!byName.has(s.name)) byName.set(s.name, []);
    byName.get(s.name).push(s);
  }
  return byName;
}

// The definition a call links to, or null when none (or no single one) fits: a method
// (`x.name(`) only matches methods, a plain call (`name(`) only functions (module level or
// nested); one in the calling file wins, else the only one of the run.
export function resolveCall(index, name, attribute, file) {
  const all = index.get(name);
  if (!all) return null;
  const fits = all.filter((s) => {
    const parts = s.qualname.split(".");
    const owner = parts.length > 1 ? parts[parts.length - 2] : null;
    const method = owner !== null && owner !== "<locals>";
    return attribute ? method : !method;
  });
  const here = fits.filter((s) => s.file === file);
  if (here.length === 1) return here[0];
  if (here.length === 0 && fits.length === 1) return fits[0];
  return null;
}

const CLASS = { kw: "tok-kw", str: "tok-str", com: "tok-com", num: "tok-num", dec: "tok-dec",
                bi: "tok-bi", call: "tok-call", def: "tok-def", fx: "tok-fx" };

// One line's markup. `link(name, attribute)` -> href or null for a call name.
export function tokensToHtml(tokens, link = () => null) {
  let html = "";
  let prev = "";
  for (const [type, text] of tokens) {
    const t = escapeHtml(text);
    if (type === "call") {
      const href = link(text, prev === ".");
      html += href ? `<a class="tok-call call-link" href="${escapeHtml(href)}">${t}</a>`
                   : `<span class="tok-call">${t}</span>`;
    } else if (type) {
      html += `<span class="${CLASS[type]}">${t}</span>`;
    } else {
      html += t;
    }
    const trimmed = text.trimEnd();
    if (trimmed) prev = trimmed[trimmed.length - 1];
  }
  return html;
}
