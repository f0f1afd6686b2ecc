// The dashboard's only door to the server: /v1 with the user's bearer token.
//
// The token lives in sessionStorage (this tab, until it closes), or in localStorage when
// the user ticks "remember". `jigsaw dashboard` opens /ui/#token=..., which is read once
// and removed from the address bar: a URL fragment is never sent to the server.

const KEY = "jigsaw.token";

export class Unauthorized extends Error {}

export function token() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY);
}

export function saveToken(value, remember) {
  forgetToken();
  (remember ? localStorage : sessionStorage).setItem(KEY, value.trim());
}

export function forgetToken() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

export function takeTokenFromFragment() {
  const match = location.hash.match(/^#token=([A-Za-z0-9_\-.~]+)/);
  if (match) {
    saveToken(decodeURIComponent(match[1]), false);
    history.replaceState(null, "", location.pathname + "#/cluster");
  }
}

export async function api(path, { method = "GET", query } = {}) {
  const url = new URL("/v1" + path, location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    for (const item of [].concat(value)) {
      if (item !== undefined && item !== null && item !== "") url.searchParams.append(name, item);
    }
  }
  const response = await fetch(url, {
    method,
    headers: { Authorization: `Bearer ${token() || ""}`, Accept: "application/json" },
    cache: "no-store",
  });
  if (response.status === 401) throw new Unauthorized("token refused");
  let body = null;
  try { body = await response.json(); } catch { /* an empty or non-JSON body */ }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : response.statusText;
    throw new Error(`${message} (HTTP ${response.status})`);
  }
  return body;
}
