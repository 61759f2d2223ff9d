// Light / dark theme, as <html data-theme="light|dark"> (report.css styles both). Without a
// choice the page follows the system (prefers-color-scheme, also when it changes while the
// page is open); a choice made with the toggle is stored in localStorage and wins. Storage is guarded: a page opened from file:// with
// storage disabled, or inside a sandboxed iframe (a notebook's srcdoc), throws on access —
// the toggle then still works for the page's lifetime.

export const THEME_KEY = "linescope.theme";

function storage() {
  try {
    return window.localStorage;  // the getter itself throws in a sandboxed iframe
  } catch {
    return null;
  }
}

// The stored choice: "light", "dark" or null (follow the system).
export function storedTheme() {
  try {
    const s = storage();
    const v = s ? s.getItem(THEME_KEY) : null;
    return v === "light" || v === "dark" ? v : null;
  } catch {
    return null;
  }
}

// Stores the choice; false when the page may not store anything.
export function storeTheme(theme) {
  try {
    const s = storage();
    if (!s) return false;
    s.setItem(THEME_KEY, theme);
    return true;
  } catch {
    return false;
  }
}

export function systemTheme() {
  try {
    return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  } catch {
    return "light";
  }
}

// The theme the page shows now.
export function currentTheme() {
  return document.documentElement.dataset.theme || systemTheme();
}

export function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
}

let chosen = false;  // the toggle was used on this page (also where nothing can be stored)

// Before anything renders: the stored choice, else the system's theme, which is followed
// while no choice is made.
export function startTheme() {
  const stored = storedTheme();
  chosen = stored !== null;
  applyTheme(stored || systemTheme());
  try {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
      if (!chosen) applyTheme(systemTheme());
    });
  } catch {
    // an old browser without MediaQueryList events: the theme stays as it started
  }
}

// A button that switches between light and dark and remembers the choice.
export function themeToggle() {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "theme-toggle";
  button.id = "theme-toggle";
  const label = () => {
    const next = currentTheme() === "dark" ? "light" : "dark";
    button.textContent = next === "dark" ? "\u263E Dark" : "\u2600 Light";
    button.setAttribute("aria-label", `Switch to the ${next} theme`);
    button.title = `Switch to the ${next} theme`;
    button.dataset.theme = currentTheme();
  };
  button.addEventListener("click", () => {
    const next = currentTheme() === "dark" ? "light" : "dark";
    chosen = true;
    applyTheme(next);
    storeTheme(next);
    label();
  });
  try {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", label);
  } catch {
    // an old browser without MediaQueryList events: the label follows the next click
  }
  label();
  return button;
}
