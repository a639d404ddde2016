// The public API, as the pasted key may use it.
//
// The key lives in sessionStorage only: it is sent as `Authorization: Bearer <key>` to the
// page's own origin, never put in a URL, and never written to the console or the page.

const STORAGE_KEY = 'gpu-console.api-key';

/** The key pasted in this tab, or null. */
export function storedKey() {
  return sessionStorage.getItem(STORAGE_KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(STORAGE_KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(STORAGE_KEY);
}

/**
 * An answer of the API: `ok` with the JSON `body`, or a refusal with the RFC 9457
 * `problem` (title, detail, code and the offending ids). A network failure becomes a
 * problem too, so callers handle one shape.
 */
export class Answer {
  constructor(status, body, problem) {
    this.status = status;
    this.body = body;
    this.problem = problem;
  }

  get ok() {
    return this.status >= 200 && this.status < 300;
  }
}

/** 32 random hex digits, for Idempotency-Key (crypto.randomUUID needs a secure context). */
function randomKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * Calls the API. `path` starts with /v1/; path segments from data must already be encoded
 * (use `segment`). POSTs carry a fresh Idempotency-Key, so a retried click cannot apply twice.
 */
export async function call(method, path, body) {
  const headers = { Accept: 'application/json' };
  const key = storedKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    headers['Idempotency-Key'] = randomKey();
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    return new Answer(0, null, {
      title: 'The API could not be reached',
      detail: String(error && error.message ? error.message : error),
      code: 'network-error',
    });
  }
  let json = null;
  try {
    json = await response.json();
  } catch {
    json = null;
  }
  if (response.ok) return new Answer(response.status, json, null);
  const problem = json && typeof json === 'object' ? json : {};
  return new Answer(response.status, null, {
    ...problem,
    title: problem.title || `HTTP ${response.status}`,
    detail: problem.detail || '',
    code: problem.code || '',
    unitIds: Array.isArray(problem.unitIds) ? problem.unitIds : [],
  });
}

/** One path segment, encoded. */
export function segment(value) {
  return encodeURIComponent(value);
}

/**
 * Every item of a paged listing (`items` + `nextCursor`), up to `max` items, `pageSize` per
 * request (each listing has its own largest page: reservations 100, VMs 500, audit 1000).
 * Returns an Answer whose body is `{ items, truncated }`, or the first refusal.
 */
export async function all(path, { max = 20000, pageSize = 100 } = {}) {
  const items = [];
  let cursor = null;
  for (;;) {
    const separator = path.includes('?') ? '&' : '?';
    const page = await call('GET', `${path}${separator}limit=${pageSize}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    if (!page.ok) return page;
    items.push(...(page.body.items || []));
    cursor = page.body.nextCursor;
    if (!cursor) return new Answer(200, { items, truncated: false }, null);
    if (items.length >= max) return new Answer(200, { items, truncated: true }, null);
  }
}
