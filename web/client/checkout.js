/**
 * Stagedoor checkout, the browser client: one standard ES module, no build
 * step, no dependencies. Served by the service at `/client/checkout.js`.
 *
 * The service promises that one click is one order and at most one charge,
 * for every request that carries the click's `Idempotency-Key`. This module
 * keeps the client's half of that promise, so that a shop page cannot get it
 * wrong: the key is made when the buyer acts (a `new Click()`), every retry
 * of that click carries the same key, and a new click is a new object with a
 * new key.
 *
 *     import { Click } from '/client/checkout.js';
 *     const click = new Click({ token });                    // the buyer acted
 *     const { status, body } = await click.order({ holdIds, paymentMethod });
 *
 * Retried, always with the same key and the same body bytes, because none of
 * them is an answer to the click: an attempt with no answer in time, a
 * network error, a 5xx (the service stored nothing, or is still settling), a
 * 408 `request-timeout` (the request did not arrive whole; nothing was written),
 * a 409 `request-in-progress` (after its `Retry-After`) and a 429
 * `rate-limited` (after its `Retry-After`; nothing was written for the key).
 * Every other status is the answer and is returned, never retried: 201, 402
 * `payment-declined`, 409 `hold-unavailable`, 422, 401 ...
 *
 * A 409 `request-in-progress` whose click has made its order already carries
 * `Location: /orders/{order_id}`: the order exists and its payment is being
 * confirmed. The attempt says so (`attempt.order`), and so does a
 * {@link NoAnswerError} that ends the call (`error.order`), so that a page can
 * tell the buyer "your payment is being confirmed" rather than "no answer".
 *
 * @module
 */

/** The defaults of {@link Click}'s options (milliseconds unless named). */
export const DEFAULTS = Object.freeze({
  /** One attempt: longer than a charge usually takes, so that a slow answer is not abandoned. */
  timeoutMs: 10_000,
  /** All attempts of one call together: a buyer waits no longer than this for an outcome. */
  deadlineMs: 60_000,
  /** Attempts per call, the first included. */
  maxAttempts: 10,
  /** The backoff's first ceiling; it doubles with every failure ... */
  backoffFirstMs: 500,
  /** ... up to this. */
  backoffMaxMs: 8_000,
});

const IN_PROGRESS = 'https://stagedoor.example/problems/request-in-progress';
/** When a 409 request-in-progress or a 429 comes without a usable Retry-After. */
const RETRY_AFTER_FALLBACK_MS = 1_000;

/**
 * The buyer's one act (a press of Pay, a click on a seat) and everything sent
 * for it. Making one *is* the click: its key is made here, once.
 *
 * A click sends one request: the first `order()` or `hold()` fixes it. Calling
 * it again with the same arguments resumes the click with the same key (after
 * a {@link NoAnswerError}, say: the service may have done the work, and the
 * retry gets that answer back); another request on the same click is refused,
 * since the service would answer it 422 `idempotency-key-reused`.
 */
export class Click {
  #key;
  #options;
  #request = null;
  #running = null;
  #attempts = 0;
  #order = null;

  /** @param {object} options the buyer's `token`, and what checkout.d.ts's `ClickOptions` lists */
  constructor(options) {
    this.#options = configure(options);
    this.#key = newKey();
  }

  /** The `Idempotency-Key` of every request this click sends. */
  get key() {
    return this.#key;
  }

  /** `POST /orders`: pays for the holds. Resolves with the answer (201, 402, 409, 422 ...). */
  order({ holdIds, paymentMethod }) {
    return this.#send('/orders', JSON.stringify({ hold_ids: holdIds, payment_method: paymentMethod }));
  }

  /** `POST /holds`: holds one seat, keyed so that a retried hold is replayed, not refused. */
  hold({ seatId }) {
    return this.#send('/holds', JSON.stringify({ seat_id: seatId }));
  }

  #send(path, body) {
    if (this.#request && (this.#request.path !== path || this.#request.body !== body)) {
      return Promise.reject(new TypeError(
        `click ${this.#key} already sent POST ${this.#request.path} ${this.#request.body}: ` +
          'another request is another act, so it needs a new Click (and a new key)'));
    }
    this.#request = { path, body };
    // A second call while the first runs (a double click) gets the same promise.
    this.#running ??= this.#run(path, body).finally(() => {
      this.#running = null;
    });
    return this.#running;
  }

  /** Attempts until an answer, the deadline or the attempt cap, whichever comes first. */
  async #run(path, body) {
    const o = this.#options;
    const deadline = o.now() + o.deadlineMs;
    let failures = 0;
    for (let n = 1; ; n += 1) {
      const attempt = await this.#attempt(path, body, Math.min(o.timeoutMs, deadline - o.now()));
      if (attempt.order) this.#order = attempt.order;
      if (isLost(attempt)) failures += 1;
      const delay = retryDelay(attempt, failures, o);
      const last = delay === null || n >= o.maxAttempts || o.now() + delay >= deadline;
      attempt.retryInMs = last ? null : Math.round(delay);
      report(o.onAttempt, attempt);
      if (delay === null) {
        const { status, body: answer, replayed } = attempt;
        return { status, body: answer, replayed, key: this.#key, attempts: this.#attempts };
      }
      if (last) throw new NoAnswerError(this.#attempts, attempt, this.#order);
      await o.sleep(delay);
    }
  }

  /** One request, bounded by `timeoutMs`, the body read included (a stalled body is no answer either). */
  async #attempt(path, body, timeoutMs) {
    const o = this.#options;
    const attempt = {
      key: this.#key, attempt: (this.#attempts += 1), method: 'POST', path,
      status: null, error: null, message: null, body: null, replayed: false,
      retryAfter: null, preferenceApplied: null, location: null, order: null, elapsedMs: 0, retryInMs: null,
    };
    const headers = {
      Authorization: bearer(o),
      'Content-Type': 'application/json',
      'Idempotency-Key': this.#key,
    };
    // If the key is still in progress (an earlier attempt is being worked
    // on), the service may wait this long for that answer instead of a 409.
    if (o.waitSecs > 0) headers.Prefer = `wait=${o.waitSecs}`;
    const started = o.now();
    const timeout = new AbortController();
    const finished = new AbortController();
    o.sleep(Math.max(timeoutMs, 0), finished.signal).then(() => timeout.abort(), () => {});
    try {
      const response = await o.fetch(new URL(path.slice(1), o.baseUrl).href, {
        method: 'POST', headers, body, signal: timeout.signal, cache: 'no-store', credentials: 'omit',
      });
      const text = await response.text();
      attempt.status = response.status;
      attempt.body = parseBody(text, response);
      attempt.replayed = response.headers.get('Idempotent-Replayed') === 'true';
      attempt.retryAfter = response.headers.get('Retry-After');
      attempt.preferenceApplied = response.headers.get('Preference-Applied');
      attempt.location = response.headers.get('Location');
      attempt.order = pendingOrder(attempt);
    } catch (error) {
      attempt.error = timeout.signal.aborted ? 'timeout' : 'network';
      attempt.message = error && error.message ? error.message : String(error);
    } finally {
      finished.abort();
      attempt.elapsedMs = o.now() - started;
    }
    return attempt;
  }
}

/**
 * `GET /orders`: a page of the buyer's orders, newest first, each as
 * `GET /orders/{order_id}` shows it. A read: it needs no key and sends one
 * request, bounded by `timeoutMs`. Resolves with `{ status, body }`: on 200
 * the body is `{ orders, next }`, and `next` (null on the last page) is the
 * `after` of the following page; anything else is a problem (401, 400
 * `invalid-request` for a bad `limit` or `after`). Rejects when no answer
 * comes (a network error, the timeout), which is safe to try again.
 *
 *     let page = (await listOrders({ token })).body;
 *     while (page.next) page = (await listOrders({ token, after: page.next })).body;
 *
 * @param {object} options the buyer's `token`, `limit` (1-100, default 20), `after`, and `baseUrl`, `timeoutMs`, `fetch` as for a Click
 */
export async function listOrders(options) {
  const { limit, after, ...rest } = options ?? {};
  const o = configure(rest);
  const url = new URL('orders', o.baseUrl);
  if (limit !== undefined && limit !== null) url.searchParams.set('limit', String(limit));
  if (after) url.searchParams.set('after', after);
  const { status, body } = await read(o, url, {});
  return { status, body };
}

/**
 * `GET /events/{eventId}/seats`: the seat map, conditionally. Pass the
 * `etag` of the map you show, and an unchanged map costs a `304` with no
 * body: the answer is then `{ status: 304, body: null, etag }` (the same
 * etag), and the map you show is still the map. A 200 brings the map and its
 * new `etag`. A read like {@link listOrders}: no key, one request, rejects
 * only when no answer comes within `timeoutMs`, and is safe to call again
 * (a page polls it).
 *
 *     let shown = await seatMap('demo', { token });
 *     const again = await seatMap('demo', { token, etag: shown.etag });
 *     if (again.status === 200) shown = again;
 *
 * @param {string} eventId the event
 * @param {object} options the buyer's `token`, the `etag` of the map shown, and `baseUrl`, `timeoutMs`, `fetch` as for a Click
 */
export async function seatMap(eventId, options) {
  const { etag, ...rest } = options ?? {};
  const o = configure(rest);
  const url = new URL(`events/${encodeURIComponent(eventId)}/seats`, o.baseUrl);
  const answer = await read(o, url, etag ? { 'If-None-Match': etag } : {});
  return { ...answer, etag: answer.status === 304 ? etag : answer.etag };
}

/** One GET, bounded by `timeoutMs` (the body read included): `{ status, body, etag }`. */
async function read(o, url, headers) {
  const timeout = new AbortController();
  const finished = new AbortController();
  o.sleep(o.timeoutMs, finished.signal).then(() => timeout.abort(), () => {});
  try {
    // `no-store`: the browser's cache must neither answer for the service
    // nor turn its 304 into a 200, so the caller sees what the service said.
    const response = await o.fetch(url.href, {
      method: 'GET', headers: { ...headers, Authorization: bearer(o) }, signal: timeout.signal,
      cache: 'no-store', credentials: 'omit',
    });
    const text = await response.text();
    return { status: response.status, body: parseBody(text, response), etag: response.headers.get('ETag') };
  } finally {
    finished.abort();
  }
}

/**
 * A click that ended without an answer: every attempt timed out, failed or
 * was told to come back later, until the deadline or the attempt cap. The
 * order may still go through. Resume with the same click (same key), never a
 * new one: the retry gets the service's answer, whichever it was. When the
 * service said the click's order exists (a 409 with its `Location`), `order`
 * names it: its payment is being confirmed.
 */
export class NoAnswerError extends Error {
  constructor(attempts, last, order = null) {
    super(`no answer for key ${last.key} after ${attempts} attempts (last: ${describe(last)}); ` +
      'retry the same click, it keeps its key');
    this.name = 'NoAnswerError';
    /** The click's key. */
    this.key = last.key;
    /** Attempts the click has made so far. */
    this.attempts = attempts;
    /** The last attempt, as `onAttempt` saw it. */
    this.last = last;
    /** `{ orderId, status: 'payment_pending' }`: the click's order, known to exist, or null. */
    this.order = order;
  }
}

/** A short text for an attempt: `201`, `409 request-in-progress`, `timeout` ... */
function describe(attempt) {
  if (attempt.error) return attempt.error === 'network' ? `network error: ${attempt.message}` : 'timeout';
  const type = attempt.body && typeof attempt.body.type === 'string' ? attempt.body.type : '';
  const slug = type.includes('/problems/') ? ` ${type.split('/problems/').pop()}` : '';
  return `${attempt.status}${slug}`;
}

// ------------------------------------------------------------------ helpers

/** The options with their defaults, checked once, at the click. */
function configure(options) {
  const given = options ?? {};
  if (!(typeof given.token === 'function' || (typeof given.token === 'string' && given.token !== ''))) {
    throw new TypeError('a Click needs the buyer\'s bearer token (options.token)');
  }
  const fetchFn = given.fetch ?? globalThis.fetch;
  if (typeof fetchFn !== 'function') throw new TypeError('no fetch here: pass options.fetch');
  const o = {
    token: given.token,
    // The service that served this module, unless told otherwise.
    baseUrl: String(given.baseUrl ?? new URL('..', import.meta.url)).replace(/\/?$/, '/'),
    // Called bare, never as a method: `window.fetch` refuses any other `this`.
    fetch: (url, init) => fetchFn(url, init),
    now: given.now ?? Date.now,
    sleep: given.sleep ?? sleep,
    random: given.random ?? Math.random,
    onAttempt: given.onAttempt ?? null,
  };
  for (const name of Object.keys(DEFAULTS)) {
    o[name] = given[name] ?? DEFAULTS[name];
    if (!(o[name] > 0)) throw new RangeError(`options.${name} must be a positive number, not ${o[name]}`);
  }
  // The service must answer an attempt before this client gives up on it,
  // or the wait is spent on an answer nobody reads.
  o.waitSecs = given.waitSecs ?? Math.max(0, Math.floor(o.timeoutMs / 1000) - 1);
  if (!Number.isInteger(o.waitSecs) || o.waitSecs < 0 || o.waitSecs * 1000 >= o.timeoutMs) {
    throw new RangeError(`options.waitSecs must be a whole number of seconds shorter than timeoutMs (${o.timeoutMs} ms), not ${o.waitSecs}`);
  }
  return o;
}

/** The `Authorization` value: a token function is asked again for every request (a token that refreshes). */
function bearer(o) {
  return `Bearer ${typeof o.token === 'function' ? o.token() : o.token}`;
}

/**
 * A new key. `crypto.randomUUID()` exists only in secure contexts (https,
 * localhost); elsewhere the same version-4 UUID is made from
 * `crypto.getRandomValues`.
 */
function newKey() {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/**
 * How long to wait before the next attempt of the same click, or null when
 * `attempt` got the answer. `failures` counts the timeouts, network errors
 * and 5xx so far, this one included.
 */
function retryDelay(attempt, failures, o) {
  if (isLost(attempt)) {
    // Capped exponential backoff with full jitter: clients that failed
    // together (a Payrail outage) do not come back together. A 503's
    // Retry-After (the breaker is open) is a floor.
    const ceiling = Math.min(o.backoffMaxMs, o.backoffFirstMs * 2 ** (failures - 1));
    return Math.max(o.random() * ceiling, retryAfterMs(attempt.retryAfter, o.now()) ?? 0);
  }
  // The service says when: it knows better than any backoff.
  if (isNotYet(attempt)) return retryAfterMs(attempt.retryAfter, o.now()) ?? RETRY_AFTER_FALLBACK_MS;
  return null;
}

/**
 * No answer from the service: none in time, a network error, a 5xx, or a 408
 * (the request did not reach it whole, so nothing was written for the key).
 */
function isLost(attempt) {
  return Boolean(attempt.error) || attempt.status >= 500 || attempt.status === 408;
}

/** Not an answer yet, says the service: in progress, or rate-limited before the key was written. */
function isNotYet(attempt) {
  return attempt.status === 429 || isInProgress(attempt);
}

function isInProgress(attempt) {
  return attempt.status === 409 && attempt.body !== null && attempt.body.type === IN_PROGRESS;
}

/**
 * The click's order, when a 409 request-in-progress names it (`Location:
 * /orders/{order_id}`): it exists, and its payment is being confirmed.
 */
function pendingOrder(attempt) {
  if (!isInProgress(attempt) || !attempt.location) return null;
  const match = /\/orders\/([^/?#]+)$/.exec(attempt.location);
  return match ? { orderId: decodeURIComponent(match[1]), status: 'payment_pending' } : null;
}

/** `Retry-After` (seconds or an HTTP date) in milliseconds from `now`, or null. */
function retryAfterMs(value, now) {
  if (!value) return null;
  const text = value.trim();
  const ms = /^\d+$/.test(text) ? Number(text) * 1000 : Date.parse(text) - now;
  return Number.isFinite(ms) ? Math.max(ms, 0) : null;
}

/** The body as JSON; anything else (a proxy's HTML page) as a problem that says what came. */
function parseBody(text, response) {
  if (text === '') return null;
  try {
    return JSON.parse(text);
  } catch {
    const title = response.statusText || `HTTP ${response.status}`;
    return { type: 'about:blank', title, status: response.status, detail: text.slice(0, 500) };
  }
}

/** The callback only watches: what it throws is reported (as uncaught, in a browser), and the click goes on. */
function report(onAttempt, attempt) {
  if (!onAttempt) return;
  try {
    onAttempt({ ...attempt });
  } catch (error) {
    if (typeof globalThis.reportError === 'function') globalThis.reportError(error);
    else console.error('checkout.js: onAttempt threw', error);
  }
}

/** Resolves after `ms`, or as soon as `signal` aborts. */
function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}
