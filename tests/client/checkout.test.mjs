// Unit tests of the browser client web/client/checkout.js, with node's own
// runner: `node --test tests/client/`. A fake fetch plays the service and a
// fake clock plays time, so that timeouts and backoffs take no real time and
// every delay can be checked to the millisecond. One test at the end uses
// the real fetch and timers against a real (local) HTTP server.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';

import { Click, DEFAULTS, NoAnswerError, listOrders, seatMap } from '../../web/client/checkout.js';

const BASE = 'http://stagedoor.test/';
const TOKEN = 'token-of-alice';
const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const problem = (slug, status) => ({
  type: `https://stagedoor.example/problems/${slug}`, title: slug, status, detail: `a ${slug}`,
});
const ORDER = {
  order_id: '0b0e5c1e-8a43-4e38-9c69-6d1b0c2f6a11', status: 'paid', amount_cents: 4500, currency: 'USD',
  hold_ids: [1, 2], seats: ['A1', 'A2'], charge_id: 'ch_1', created_at: '2026-12-01T10:00:00Z',
};

// ------------------------------------------------------------------ fakes

/** Virtual time: a sleep is a timer that fires only when everything else waits. */
function fakeClock(start = Date.UTC(2026, 11, 1, 10, 0, 0)) {
  let now = start;
  let timers = [];
  const idle = async () => {
    for (let i = 0; i < 5; i += 1) await new Promise((resolve) => setImmediate(resolve));
  };
  return {
    start,
    now: () => now,
    sleep(ms, signal) {
      return new Promise((resolve) => {
        const timer = { at: now + ms, resolve };
        timers.push(timer);
        signal?.addEventListener('abort', () => {
          timers = timers.filter((t) => t !== timer);
          resolve();
        }, { once: true });
      });
    },
    /** Settles `promise`, moving time to the next timer whenever nothing else can run. */
    async run(promise) {
      let settled = false;
      promise.then(() => { settled = true; }, () => { settled = true; });
      for (;;) {
        await idle();
        if (settled) return promise;
        assert.ok(timers.length > 0, 'the click waits for something that never comes');
        timers.sort((a, b) => a.at - b.at);
        const next = timers.shift();
        now = Math.max(now, next.at);
        next.resolve();
      }
    },
  };
}

/** A JSON answer. */
const json = (status, body, headers = {}) => () => new Response(JSON.stringify(body), {
  status, headers: { 'Content-Type': status < 400 ? 'application/json' : 'application/problem+json', ...headers },
});
/** No answer until the attempt is aborted. */
const TIMEOUT = 'timeout';
/** The connection fails (fetch rejects with a TypeError, as browsers do). */
const NETWORK = 'network';
/** Status and headers come, then the body stalls until the attempt is aborted. */
const STALL = 'stall';

/** The service: answers the requests in the order of `script` (answers get the clock), and records them. */
function fakeService(clock, script) {
  const calls = [];
  const aborted = () => new DOMException('This operation was aborted', 'AbortError');
  const fetch = async (url, init) => {
    calls.push({ url, at: clock.now(), init, headers: new Headers(init.headers), body: init.body });
    const next = script.shift();
    assert.ok(next, `request ${calls.length} was not expected`);
    if (next === TIMEOUT) {
      return new Promise((_, reject) => init.signal.addEventListener('abort', () => reject(aborted())));
    }
    if (next === NETWORK) throw new TypeError('fetch failed');
    if (next === STALL) {
      const stalled = new ReadableStream({
        start(controller) {
          init.signal.addEventListener('abort', () => controller.error(aborted()));
        },
      });
      return new Response(stalled, { status: 201, headers: { 'Content-Type': 'application/json' } });
    }
    return next(clock);
  };
  return { fetch, calls };
}

/** A fake service and clock, and `click()` to make clicks against them. */
function setup(script, options = {}) {
  const clock = fakeClock();
  const service = fakeService(clock, script);
  const seen = [];
  const click = (more = {}) => new Click({
    token: TOKEN, baseUrl: BASE, fetch: service.fetch, now: clock.now, sleep: clock.sleep,
    random: () => 0.5, onAttempt: (attempt) => seen.push(attempt), ...options, ...more,
  });
  return { clock, service, seen, click };
}

const pay = { holdIds: [1, 2], paymentMethod: 'pm_card_visa' };
const PAY_BODY = '{"hold_ids":[1,2],"payment_method":"pm_card_visa"}';

// ------------------------------------------------------------------ the request

test('a click makes its key at once and sends POST /orders with it, the token, JSON and Prefer: wait', async () => {
  const { clock, service, click } = setup([json(201, ORDER, { Location: `/orders/${ORDER.order_id}` })]);
  const c = click();
  assert.match(c.key, UUID_V4, 'a version-4 UUID, made before anything is sent');
  assert.equal(service.calls.length, 0);

  const answer = await clock.run(c.order(pay));
  assert.deepEqual(answer, { status: 201, body: ORDER, replayed: false, key: c.key, attempts: 1 });
  const [call] = service.calls;
  assert.equal(call.url, 'http://stagedoor.test/orders');
  assert.equal(call.init.method, 'POST');
  assert.equal(call.body, PAY_BODY);
  assert.equal(call.headers.get('Idempotency-Key'), c.key);
  assert.equal(call.headers.get('Authorization'), `Bearer ${TOKEN}`);
  assert.equal(call.headers.get('Content-Type'), 'application/json');
  // The default attempt timeout is 10 s: the service may wait 9 s of it.
  assert.equal(call.headers.get('Prefer'), `wait=${DEFAULTS.timeoutMs / 1000 - 1}`);
  assert.equal(call.init.credentials, 'omit', 'a bearer API: no cookies');
});

test('hold() posts the seat under the click\'s own key', async () => {
  const hold = { hold_id: 7, seat_id: 3, expires_at: '2026-12-01T10:10:00Z' };
  const { clock, service, click } = setup([json(201, hold)]);
  const c = click();
  const answer = await clock.run(c.hold({ seatId: 3 }));
  assert.deepEqual(answer, { status: 201, body: hold, replayed: false, key: c.key, attempts: 1 });
  assert.equal(service.calls[0].url, 'http://stagedoor.test/holds');
  assert.equal(service.calls[0].body, '{"seat_id":3}');
  assert.equal(service.calls[0].headers.get('Idempotency-Key'), c.key);
});

test('one key per click: a new click is a new key, and each click keeps its own', async () => {
  const { clock, service, click } = setup([json(201, ORDER), TIMEOUT, json(402, problem('payment-declined', 402))]);
  const first = click();
  const second = click();
  assert.notEqual(first.key, second.key);
  assert.match(second.key, UUID_V4);
  await clock.run(first.order(pay));
  await clock.run(second.order({ ...pay, paymentMethod: 'pm_card_declined' }));
  assert.deepEqual(service.calls.map((c) => c.headers.get('Idempotency-Key')), [first.key, second.key, second.key]);
  assert.equal(first.key, service.calls[0].headers.get('Idempotency-Key'), 'the key does not change');
  const keys = new Set(Array.from({ length: 200 }, () => click().key));
  assert.equal(keys.size, 200);
});

test('the service is the one that served the module, unless baseUrl says otherwise (a path prefix kept)', async () => {
  const moduleDefault = setup([json(201, ORDER)], { baseUrl: undefined });
  await moduleDefault.clock.run(moduleDefault.click().order(pay));
  // web/client/checkout.js → web/ → web/orders
  assert.equal(moduleDefault.service.calls[0].url, new URL('../../web/orders', import.meta.url).href);

  const prefixed = setup([json(201, ORDER)], { baseUrl: 'https://shop.example/stagedoor' });
  await prefixed.clock.run(prefixed.click().order(pay));
  assert.equal(prefixed.service.calls[0].url, 'https://shop.example/stagedoor/orders');
});

// ------------------------------------------------------------------ retried

test('timeouts, network errors and 5xx are retried with the same key and body, after growing, capped, jittered delays', async () => {
  const randoms = [0.5, 0.25, 0.75, 0.75, 0.5, 0.875, 0.125];
  const { clock, service, seen, click } = setup([
    TIMEOUT, NETWORK, json(500, problem('internal', 500)), json(503, problem('payment-unavailable', 503)),
    json(504, problem('payment-timeout', 504)), () => new Response('<h1>Bad Gateway</h1>', { status: 502 }),
    NETWORK, json(201, ORDER, { 'Idempotent-Replayed': 'true' }),
  ], { random: () => randoms.shift() });
  const c = click();
  const answer = await clock.run(c.order(pay));

  assert.deepEqual(answer, { status: 201, body: ORDER, replayed: true, key: c.key, attempts: 8 });
  assert.ok(service.calls.every((call) => call.headers.get('Idempotency-Key') === c.key), 'one key');
  assert.ok(service.calls.every((call) => call.body === PAY_BODY), 'the same body bytes');
  assert.deepEqual(seen.map((a) => a.error ?? a.status), ['timeout', 'network', 500, 503, 504, 502, 'network', 201]);
  // Full jitter: random × min(8000, 500 × 2^(failure - 1)).
  const delays = [250, 250, 1500, 3000, 4000, 7000, 1000];
  assert.deepEqual(seen.map((a) => a.retryInMs), [...delays, null]);
  const gaps = service.calls.slice(1).map((call, i) => call.at - service.calls[i].at);
  assert.deepEqual(gaps, [DEFAULTS.timeoutMs + 250, ...delays.slice(1)], 'time between requests');
  assert.equal(seen[0].elapsedMs, DEFAULTS.timeoutMs);
  assert.ok(service.calls[0].init.signal.aborted, 'the timed-out attempt was aborted');
  assert.equal(seen[5].body.type, 'about:blank', 'a non-JSON body is a problem saying what came');
  assert.equal(seen[5].body.detail, '<h1>Bad Gateway</h1>');
});

test('the ceiling doubles per failure up to backoffMaxMs', async () => {
  const { clock, seen, click } = setup(
    [...Array(7).fill(NETWORK), json(201, ORDER)],
    { random: () => 0.999999, backoffFirstMs: 100, backoffMaxMs: 1000 },
  );
  await clock.run(click().order(pay));
  assert.deepEqual(seen.slice(0, -1).map((a) => a.retryInMs), [100, 200, 400, 800, 1000, 1000, 1000]);
});

test('a body that stalls after the status is a timeout too, retried with the same key', async () => {
  const { clock, service, seen, click } = setup([STALL, json(201, ORDER, { 'Idempotent-Replayed': 'true' })],
    { timeoutMs: 3000 });
  const c = click();
  const answer = await clock.run(c.order(pay));
  assert.equal(seen[0].error, 'timeout');
  assert.equal(seen[0].elapsedMs, 3000);
  assert.equal(answer.replayed, true);
  assert.equal(service.calls[1].headers.get('Idempotency-Key'), c.key);
});

test('409 request-in-progress: waits exactly its Retry-After (seconds or a date), then the same key again', async () => {
  const { clock, service, seen, click } = setup([
    json(409, problem('request-in-progress', 409), { 'Retry-After': '2' }),
    (now) => json(409, problem('request-in-progress', 409),
      { 'Retry-After': new Date(now.now() + 3000).toUTCString() })(),
    json(409, problem('request-in-progress', 409)),
    json(201, ORDER, { 'Idempotent-Replayed': 'true' }),
  ], { random: () => { throw new Error('no jitter on a Retry-After'); } });
  const c = click();
  const answer = await clock.run(c.order(pay));
  assert.deepEqual(seen.map((a) => a.retryInMs), [2000, 3000, 1000, null], 'Retry-After, a date, the 1 s fallback');
  assert.deepEqual(answer, { status: 201, body: ORDER, replayed: true, key: c.key, attempts: 4 });
  assert.ok(service.calls.every((call) => call.headers.get('Idempotency-Key') === c.key));
});

test('a 409 request-in-progress is no failure: the backoff does not grow on it', async () => {
  const { clock, seen, click } = setup([
    NETWORK, json(409, problem('request-in-progress', 409), { 'Retry-After': '1' }), NETWORK, json(201, ORDER),
  ]);
  await clock.run(click().order(pay));
  assert.deepEqual(seen.map((a) => a.retryInMs), [250, 1000, 500, null]);
});

test('a service that waited (Prefer honoured) answers with the replay: the flag and Preference-Applied are read', async () => {
  const { clock, seen, click } = setup([
    TIMEOUT,
    json(201, ORDER, { 'Idempotent-Replayed': 'true', 'Preference-Applied': 'wait=2' }),
  ], { timeoutMs: 3000 });
  const c = click();
  const answer = await clock.run(c.order(pay));
  assert.equal(answer.replayed, true);
  assert.equal(answer.attempts, 2);
  assert.equal(seen[1].preferenceApplied, 'wait=2');
});

test('Prefer: wait is shorter than the attempt timeout, and 0 sends none', async () => {
  for (const [options, prefer] of [
    [{ timeoutMs: 3000 }, 'wait=2'], [{ timeoutMs: 3500 }, 'wait=2'], [{ timeoutMs: 1500 }, null],
    [{ timeoutMs: 10_000, waitSecs: 5 }, 'wait=5'], [{ waitSecs: 0 }, null],
  ]) {
    const { clock, service, click } = setup([json(201, ORDER)], options);
    await clock.run(click().order(pay));
    assert.equal(service.calls[0].headers.get('Prefer'), prefer, JSON.stringify(options));
  }
});

test('429 rate-limited (nothing written for the key) waits its Retry-After, same key', async () => {
  const { clock, service, seen, click } = setup([
    json(429, problem('rate-limited', 429), { 'Retry-After': '4' }), json(201, ORDER),
  ]);
  const c = click();
  const answer = await clock.run(c.order(pay));
  assert.equal(answer.status, 201);
  assert.equal(seen[0].retryInMs, 4000);
  assert.equal(service.calls[1].headers.get('Idempotency-Key'), c.key);
});

test('408 request-timeout (the request did not arrive whole, nothing written) is retried, same key and body', async () => {
  const { clock, service, seen, click } = setup([json(408, problem('request-timeout', 408)), json(201, ORDER)]);
  const c = click();
  const answer = await clock.run(c.order(pay));
  assert.equal(answer.status, 201);
  assert.equal(answer.attempts, 2);
  assert.notEqual(seen[0].retryInMs, null);
  assert.equal(service.calls[1].headers.get('Idempotency-Key'), c.key);
  assert.equal(service.calls[1].body, service.calls[0].body);
});

test('a 503\'s Retry-After (the breaker is open) is a floor under the backoff', async () => {
  const { clock, seen, click } = setup([
    json(503, problem('payment-unavailable', 503), { 'Retry-After': '30' }), json(201, ORDER),
  ]);
  await clock.run(click().order(pay));
  assert.equal(seen[0].retryInMs, 30_000);
});

// ------------------------------------------------------------------ answers

test('answers are never retried: 402, 409 hold-unavailable, 422, 401, 400, 404, 413', async (t) => {
  const cases = [
    [402, 'payment-declined'], [409, 'hold-unavailable'], [409, 'seat-unavailable'], [422, 'invalid-order'],
    [422, 'idempotency-key-reused'], [401, 'unauthorized'], [400, 'invalid-request'], [404, 'not-found'],
    [413, 'payload-too-large'],
  ];
  for (const [status, slug] of cases) {
    await t.test(`${status} ${slug}`, async () => {
      const { clock, service, seen, click } = setup([json(status, problem(slug, status), { 'Retry-After': '1' })]);
      const c = click();
      const answer = await clock.run(c.order(pay));
      assert.deepEqual(answer, { status, body: problem(slug, status), replayed: false, key: c.key, attempts: 1 });
      assert.equal(service.calls.length, 1, 'one request, no retry');
      assert.equal(seen[0].retryInMs, null);
    });
  }
});

test('a replayed decline is read as a replay', async () => {
  const { clock, click } = setup([json(402, problem('payment-declined', 402), { 'Idempotent-Replayed': 'true' })]);
  const answer = await clock.run(click().order(pay));
  assert.equal(answer.status, 402);
  assert.equal(answer.replayed, true);
});

// ------------------------------------------------------------------ limits

test('the attempt cap ends the call with NoAnswerError; the same click resumes under the same key', async () => {
  const { clock, service, seen, click } = setup([
    json(500, problem('internal', 500)), TIMEOUT, json(503, problem('payment-unavailable', 503)),
    json(201, ORDER, { 'Idempotent-Replayed': 'true' }),
  ], { maxAttempts: 3, timeoutMs: 2000 });
  const c = click();
  const error = await clock.run(c.order(pay)).then(() => assert.fail('resolved'), (e) => e);
  assert.ok(error instanceof NoAnswerError);
  assert.equal(error.name, 'NoAnswerError');
  assert.equal(error.key, c.key);
  assert.equal(error.attempts, 3);
  assert.equal(error.last.status, 503);
  assert.equal(seen[2].retryInMs, null, 'the last attempt says no retry follows');
  assert.match(error.message, /3 attempts/);

  const answer = await clock.run(c.order(pay));
  assert.deepEqual(answer, { status: 201, body: ORDER, replayed: true, key: c.key, attempts: 4 });
  assert.ok(service.calls.every((call) => call.headers.get('Idempotency-Key') === c.key));
  assert.ok(service.calls.every((call) => call.body === PAY_BODY));
});

test('the deadline bounds the call: attempts shrink to the time left, and no sleep runs past it', async () => {
  const { clock, service, seen, click } = setup(Array(10).fill(TIMEOUT), { deadlineMs: 5000, timeoutMs: 2000 });
  const c = click();
  const started = clock.now();
  const error = await clock.run(c.order(pay)).then(() => assert.fail('resolved'), (e) => e);
  assert.ok(error instanceof NoAnswerError);
  assert.ok(clock.now() - started <= 5000, `${clock.now() - started} ms`);
  // 2000 + 250 + 2000 + 500, then 250 ms left: the third attempt gets those.
  assert.deepEqual(seen.map((a) => a.elapsedMs), [2000, 2000, 250]);
  assert.equal(service.calls.length, 3);
});

test('a 409 in progress that names its order says so on the attempt and on NoAnswerError', async () => {
  const inProgress = (headers) => json(409, problem('request-in-progress', 409), { 'Retry-After': '1', ...headers });
  const { clock, seen, click } = setup([
    inProgress({}), inProgress({ Location: `/orders/${ORDER.order_id}` }), TIMEOUT,
  ], { maxAttempts: 3, timeoutMs: 2000 });
  const c = click();
  const error = await clock.run(c.order(pay)).then(() => assert.fail('resolved'), (e) => e);
  assert.ok(error instanceof NoAnswerError);
  assert.equal(seen[0].order, null, 'no Location: no order yet');
  const order = { orderId: ORDER.order_id, status: 'payment_pending' };
  assert.deepEqual(seen[1].order, order);
  assert.equal(seen[1].location, `/orders/${ORDER.order_id}`);
  assert.equal(error.last.error, 'timeout');
  assert.deepEqual(error.order, order, 'the order outlives the attempt that named it');
});

test('a Retry-After beyond the deadline ends the call at once', async () => {
  const { clock, seen, click } = setup([json(409, problem('request-in-progress', 409), { 'Retry-After': '120' })]);
  const c = click();
  const started = clock.now();
  const error = await clock.run(c.order(pay)).then(() => assert.fail('resolved'), (e) => e);
  assert.ok(error instanceof NoAnswerError);
  assert.equal(seen[0].retryInMs, null);
  assert.equal(clock.now(), started, 'no waiting for nothing');
});

// ------------------------------------------------------------------ the shape

test('a click is one request: another body or endpoint on it is refused, nothing sent', async () => {
  const { clock, service, click } = setup([json(402, problem('payment-declined', 402))]);
  const c = click();
  await clock.run(c.order(pay));
  await assert.rejects(c.order({ ...pay, paymentMethod: 'pm_card_mastercard' }), TypeError);
  await assert.rejects(c.hold({ seatId: 1 }), /new Click/);
  assert.equal(service.calls.length, 1);
});

test('a double click on the same click shares the request in flight', async () => {
  const { clock, service, click } = setup([json(201, ORDER)]);
  const c = click();
  const first = c.order(pay);
  const second = c.order(pay);
  assert.equal(first, second);
  await clock.run(first);
  assert.equal(service.calls.length, 1);
});

test('a token function is asked again for every attempt', async () => {
  const tokens = ['old', 'new'];
  const { clock, service, click } = setup([NETWORK, json(201, ORDER)], { token: () => tokens.shift() });
  await clock.run(click().order(pay));
  assert.deepEqual(service.calls.map((c) => c.headers.get('Authorization')), ['Bearer old', 'Bearer new']);
});

test('options are checked at the click', () => {
  assert.throws(() => new Click({ baseUrl: BASE }), TypeError, 'a token is required');
  assert.throws(() => new Click({ token: '' }), TypeError);
  assert.throws(() => new Click({ token: TOKEN, timeoutMs: 0 }), RangeError);
  assert.throws(() => new Click({ token: TOKEN, timeoutMs: 3000, waitSecs: 3 }), RangeError,
    'a wait as long as the attempt timeout would outlast the attempt');
  assert.throws(() => new Click({ token: TOKEN, waitSecs: 1.5 }), RangeError);
  assert.throws(() => new Click({ token: TOKEN, maxAttempts: -1 }), RangeError);
});

test('onAttempt sees every attempt; what it throws is reported and the click goes on', async (t) => {
  const reported = t.mock.method(console, 'error', () => {});
  const { clock, click } = setup([NETWORK, json(201, ORDER)]);
  const answer = await clock.run(click({ onAttempt: () => { throw new Error('the log broke'); } }).order(pay));
  assert.equal(answer.status, 201);
  assert.equal(reported.mock.callCount(), 2);
});

// ------------------------------------------------------------------ for real

test('with the real fetch and timers: an abandoned attempt is retried with the same key', async () => {
  const seen = [];
  const server = createServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', () => {
      seen.push({ key: request.headers['idempotency-key'], prefer: request.headers.prefer, body });
      if (seen.length === 1) return; // never answered: the client's timeout ends it
      response.writeHead(201, { 'Content-Type': 'application/json', 'Idempotent-Replayed': 'true' });
      response.end(JSON.stringify(ORDER));
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const c = new Click({
      token: TOKEN, baseUrl: `http://127.0.0.1:${server.address().port}`, timeoutMs: 300, backoffFirstMs: 20,
    });
    const answer = await c.order(pay);
    assert.deepEqual(answer, { status: 201, body: ORDER, replayed: true, key: c.key, attempts: 2 });
    assert.deepEqual(seen.map((s) => s.key), [c.key, c.key]);
    assert.deepEqual(seen.map((s) => s.body), [PAY_BODY, PAY_BODY]);
    assert.equal(seen[0].prefer, undefined, 'a 300 ms attempt leaves no whole second to wait');
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

// ------------------------------------------------------------------ the buyer's orders

test('listOrders sends GET /orders with the token, limit and after, and gives the page back', async () => {
  const clock = fakeClock();
  const page = { orders: [ORDER], next: 'AQID' };
  const service = fakeService(clock, [json(200, page), json(200, { orders: [], next: null })]);
  const options = { token: () => TOKEN, baseUrl: BASE, fetch: service.fetch, now: clock.now, sleep: clock.sleep };
  const first = await clock.run(listOrders({ ...options, limit: 1 }));
  assert.deepEqual(first, { status: 200, body: page });
  const last = await clock.run(listOrders({ ...options, limit: 1, after: first.body.next }));
  assert.deepEqual(last.body, { orders: [], next: null });
  const [one, two] = service.calls;
  assert.equal(one.url, `${BASE}orders?limit=1`);
  assert.equal(two.url, `${BASE}orders?limit=1&after=AQID`);
  for (const call of service.calls) {
    assert.equal(call.init.method, 'GET');
    assert.equal(call.headers.get('Authorization'), `Bearer ${TOKEN}`);
    assert.equal(call.headers.get('Idempotency-Key'), null, 'a read needs no key');
    assert.equal(call.body, undefined);
  }
});

test('listOrders answers a problem as it came, and rejects when no answer comes in time', async () => {
  const clock = fakeClock();
  const service = fakeService(clock, [json(400, problem('invalid-request', 400)), TIMEOUT]);
  const options = { token: TOKEN, baseUrl: BASE, fetch: service.fetch, now: clock.now, sleep: clock.sleep, timeoutMs: 2_000 };
  const refused = await clock.run(listOrders({ ...options, after: 'tampered' }));
  assert.equal(refused.status, 400);
  assert.equal(refused.body.type, 'https://stagedoor.example/problems/invalid-request');
  await assert.rejects(clock.run(listOrders(options)), { name: 'AbortError' });
  assert.equal(clock.now() - clock.start, 2_000);
  assert.equal(service.calls[1].url, `${BASE}orders`);
});

test('seatMap asks with If-None-Match: a 304 keeps the map shown and its etag, a 200 brings a new one', async () => {
  const clock = fakeClock();
  const map = { event_id: 'demo', seats: [{ seat_id: 1, label: 'A1', status: 'available', price_cents: 4500 }] };
  const notModified = () => new Response(null, { status: 304, headers: { ETag: '"v1"' } });
  const service = fakeService(clock, [json(200, map, { ETag: '"v1"' }), notModified, json(200, map, { ETag: '"v2"' })]);
  const options = { token: TOKEN, baseUrl: BASE, fetch: service.fetch, now: clock.now, sleep: clock.sleep };
  const first = await clock.run(seatMap('demo', options));
  assert.deepEqual(first, { status: 200, body: map, etag: '"v1"' });
  const same = await clock.run(seatMap('demo', { ...options, etag: first.etag }));
  assert.deepEqual(same, { status: 304, body: null, etag: '"v1"' });
  const changed = await clock.run(seatMap('demo', { ...options, etag: same.etag }));
  assert.equal(changed.etag, '"v2"');
  const [one, two, three] = service.calls;
  assert.equal(one.url, `${BASE}events/demo/seats`);
  assert.equal(one.headers.get('If-None-Match'), null, 'nothing shown yet, nothing to match');
  assert.equal(two.headers.get('If-None-Match'), '"v1"');
  assert.equal(three.headers.get('If-None-Match'), '"v1"');
  for (const call of service.calls) {
    assert.equal(call.init.method, 'GET');
    assert.equal(call.init.cache, 'no-store', 'the browser cache must not answer for the service');
    assert.equal(call.headers.get('Authorization'), `Bearer ${TOKEN}`);
    assert.equal(call.headers.get('Idempotency-Key'), null, 'a read needs no key');
  }
});
