// Types of the Stagedoor checkout browser client, /client/checkout.js.
// The module is plain JavaScript; these say what it takes and gives back.

/** RFC 9457 Problem Details: every error the service answers. */
export interface Problem {
  /** `https://stagedoor.example/problems/<slug>`, or `about:blank` for a body that was not JSON. */
  type: string;
  title: string;
  status: number;
  detail?: string;
  /** A 402's order. */
  order_id?: string;
  /** A `payment-declined`'s reason, when Payrail said it: `card_declined`,
   * `insufficient_funds`, `expired_card`, `incorrect_cvc`, `lost_card`,
   * `stolen_card` or `other`. */
  decline_code?: string;
  [member: string]: unknown;
}

/** The 201 of `POST /orders` (and `GET /orders/{order_id}`, and each of `GET /orders`). */
export interface Order {
  order_id: string;
  status: 'paid' | 'declined' | 'failed' | 'payment_pending';
  amount_cents: number;
  currency: string;
  hold_ids: number[];
  seats: string[];
  charge_id: string | null;
  /** A declined order's reason, when Payrail gave one (as in its 402). */
  decline_code?: string;
  created_at: string;
}

/** The 201 of `POST /holds`. */
export interface Hold {
  hold_id: number;
  seat_id: number;
  expires_at: string;
}

/**
 * The service's answer to a click: what the first attempt that got an answer
 * saw. A 201 has `T` as its body; any other status (402 payment-declined,
 * 409 hold-unavailable, seat-unavailable or hold-limit-reached, 422
 * invalid-order, 401 ...) a
 * `Problem`.
 */
export interface Answer<T> {
  status: number;
  body: T | Problem | null;
  /** `Idempotent-Replayed: true`: the service had answered this key before (an abandoned attempt got it first). */
  replayed: boolean;
  /** The click's `Idempotency-Key`. */
  key: string;
  /** How many requests the click has sent so far. */
  attempts: number;
}

/** One request of a click, as `onAttempt` and `NoAnswerError.last` see it. */
export interface Attempt {
  key: string;
  /** 1 for the click's first request, then 2, 3 ... (across resumed calls too). */
  attempt: number;
  method: 'POST';
  path: '/orders' | '/holds';
  /** The HTTP status, or null when no answer came (see `error`). */
  status: number | null;
  /** Why no answer came: the per-attempt timeout, or a network error. */
  error: 'timeout' | 'network' | null;
  /** The network error's message. */
  message: string | null;
  body: unknown;
  replayed: boolean;
  retryAfter: string | null;
  /** `Preference-Applied`: the service waited for an earlier attempt's answer (`Prefer: wait`). */
  preferenceApplied: string | null;
  /** `Location`, when the answer has one. */
  location: string | null;
  /** A 409 request-in-progress with `Location: /orders/{order_id}`: the click's order exists, its payment being confirmed. */
  order: PendingOrder | null;
  elapsedMs: number;
  /** When the next attempt goes (same key), or null: this attempt ended the call (an answer, or no more time). */
  retryInMs: number | null;
}

/** The click's order, known to exist while its payment is being confirmed. */
export interface PendingOrder {
  orderId: string;
  status: 'payment_pending';
}

export interface ClickOptions {
  /** The buyer's bearer token; a function is asked again for every attempt (a token that refreshes). */
  token: string | (() => string);
  /** The service; by default the one that served the module (`new URL('..', import.meta.url)`). */
  baseUrl?: string | URL;
  /** One attempt's timeout, the body read included. Default 10 000. */
  timeoutMs?: number;
  /**
   * `Prefer: wait=N`: how long the service may wait for an earlier attempt's
   * answer instead of answering 409 request-in-progress. Whole seconds,
   * shorter than `timeoutMs`; default one second less than it; 0 sends no
   * `Prefer`.
   */
  waitSecs?: number;
  /** All attempts of one call together. Default 60 000. */
  deadlineMs?: number;
  /** Attempts per call, the first included. Default 10. */
  maxAttempts?: number;
  /** The backoff's first ceiling; it doubles per failure up to `backoffMaxMs`. Default 500. */
  backoffFirstMs?: number;
  /** Default 8 000. */
  backoffMaxMs?: number;
  /** Called after every attempt (a log, a spinner); what it throws does not stop the click. */
  onAttempt?: (attempt: Attempt) => void;
  /** For tests: the fetch to use. Default `globalThis.fetch`. */
  fetch?: (url: string, init: RequestInit) => Promise<Response>;
  /** For tests: milliseconds since the epoch. Default `Date.now`. */
  now?: () => number;
  /** For tests: resolves after `ms`, or as soon as `signal` aborts. Default: a `setTimeout`. */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** For tests: uniform in [0, 1), for the backoff's jitter. Default `Math.random`. */
  random?: () => number;
}

/**
 * The buyer's one act, and every request sent for it: constructing one is the
 * click, and makes its key (`crypto.randomUUID()`). A click sends one request;
 * calling the same method again with the same arguments resumes it under the
 * same key, anything else rejects with a `TypeError`. A new act is a new
 * `Click`.
 *
 * Retried with the same key: timeouts, network errors, 5xx, 408
 * request-timeout, 409 request-in-progress and 429 (after `Retry-After`). Everything else is the
 * answer. Rejects with `NoAnswerError` when the deadline or the attempt cap
 * comes first.
 */
export class Click {
  constructor(options: ClickOptions);
  /** The `Idempotency-Key` of every request this click sends. */
  readonly key: string;
  /** `POST /orders` `{"hold_ids", "payment_method"}`. */
  order(request: { holdIds: number[]; paymentMethod: string }): Promise<Answer<Order>>;
  /** `POST /holds` `{"seat_id"}`, keyed. */
  hold(request: { seatId: number }): Promise<Answer<Hold>>;
}

/** A page of `GET /orders`: the buyer's orders, newest first. */
export interface OrderPage {
  orders: Order[];
  /** The `after` of the next page; null on the last one. */
  next: string | null;
}

export interface ListOrdersOptions
  extends Pick<ClickOptions, 'token' | 'baseUrl' | 'timeoutMs' | 'fetch' | 'now' | 'sleep'> {
  /** Orders per page, 1-100. Default (the service's) 20. */
  limit?: number;
  /** The `next` of the page before, as it came. */
  after?: string | null;
}

/**
 * `GET /orders`: one page of the buyer's orders, newest first. One request,
 * no key (a read); rejects only when no answer comes (network, `timeoutMs`).
 * A 200's body is an `OrderPage`; anything else a `Problem` (401, 400
 * invalid-request for a bad `limit` or `after`).
 */
export function listOrders(options: ListOrdersOptions): Promise<{ status: number; body: OrderPage | Problem | null }>;

export interface SeatMapOptions
  extends Pick<ClickOptions, 'token' | 'baseUrl' | 'timeoutMs' | 'fetch' | 'now' | 'sleep'> {
  /** The `ETag` of the map shown: sent as `If-None-Match`. */
  etag?: string | null;
}

/**
 * `GET /events/{eventId}/seats`, conditionally: a 304 (body null) means the
 * map shown is still the map, and keeps its `etag`; a 200 brings the map and
 * its new `etag`. One request, no key; rejects only when no answer comes.
 */
export function seatMap(eventId: string, options: SeatMapOptions): Promise<{ status: number; body: unknown; etag: string | null }>;

/**
 * No answer before the deadline or the attempt cap: the work may still have
 * been done. Resume the same click (same key), never a new one.
 */
export class NoAnswerError extends Error {
  readonly name: 'NoAnswerError';
  readonly key: string;
  readonly attempts: number;
  readonly last: Attempt;
  /** The click's order, when a 409 named it: the payment is being confirmed. */
  readonly order: PendingOrder | null;
}

export const DEFAULTS: Readonly<{
  timeoutMs: number;
  deadlineMs: number;
  maxAttempts: number;
  backoffFirstMs: number;
  backoffMaxMs: number;
}>;
