// A real OpenID provider for the tests (npm `oidc-provider`), issuing JWT
// access tokens by the client credentials grant, as a shop's identity
// provider issues them for the checkout API. Each client's id is the
// tokens' `sub`, so a test can be any buyer (`auth0|…` included).
//
// Environment:
//   OIDC_PROVIDER_MODULE  the path of the installed package (scripts/oidc-provider.sh)
//   PORT                  where to listen (127.0.0.1)
//   ISSUER                the issuer (default http://127.0.0.1:PORT)
//   KEYS_FILE             the private JWKS; made (an RS256 and an ES256 key) when missing
//   KEY_PREFIX            the kids of made keys: <prefix>-rs, <prefix>-es
//   AUDIENCE              the checkout API's audience
//   CLIENTS               a JSON array of client ids (secret: "secret")
//
// Resource indicators (`resource=`) choose the token:
//   https://rs.stagedoor.test/rs256     RS256, aud AUDIENCE, 10 minutes
//   https://rs.stagedoor.test/es256     ES256, aud AUDIENCE
//   https://rs.stagedoor.test/expiring  RS256, aud AUDIENCE, 1 second
//   https://rs.stagedoor.test/other     RS256, another application's audience
// GET /test/forged?sub=S is a token with the claims of an RS256 one and the
// provider's kid, signed by a key it never published.

import { createServer } from 'node:http';
import { generateKeyPairSync, sign as signWith } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const { default: Provider } = await import(pathToFileURL(process.env.OIDC_PROVIDER_MODULE).href);

const port = Number(process.env.PORT);
const issuer = process.env.ISSUER || `http://127.0.0.1:${port}`;
const audience = process.env.AUDIENCE;
const keysFile = process.env.KEYS_FILE;
const prefix = process.env.KEY_PREFIX || 'k1';

function privateJwk(type, options, kid, alg) {
  const { privateKey } = generateKeyPairSync(type, options);
  return { ...privateKey.export({ format: 'jwk' }), kid, alg, use: 'sig' };
}

if (!existsSync(keysFile)) {
  const keys = [
    privateJwk('rsa', { modulusLength: 2048 }, `${prefix}-rs`, 'RS256'),
    privateJwk('ec', { namedCurve: 'P-256' }, `${prefix}-es`, 'ES256'),
  ];
  writeFileSync(keysFile, JSON.stringify({ keys }));
}
const jwks = JSON.parse(readFileSync(keysFile, 'utf8'));

const resources = {
  'https://rs.stagedoor.test/rs256': { alg: 'RS256', aud: audience, ttl: 600 },
  'https://rs.stagedoor.test/es256': { alg: 'ES256', aud: audience, ttl: 600 },
  'https://rs.stagedoor.test/expiring': { alg: 'RS256', aud: audience, ttl: 1 },
  'https://rs.stagedoor.test/other': { alg: 'RS256', aud: 'https://other.stagedoor.test', ttl: 600 },
};

const provider = new Provider(issuer, {
  jwks,
  clients: JSON.parse(process.env.CLIENTS).map((client_id) => ({
    client_id,
    client_secret: 'secret',
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'client_secret_post',
  })),
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => false,
      getResourceServerInfo(ctx, indicator) {
        const resource = resources[indicator];
        if (!resource) throw new Provider.errors.InvalidTarget();
        return {
          scope: 'checkout',
          audience: resource.aud,
          accessTokenTTL: resource.ttl,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: resource.alg } },
        };
      },
    },
  },
  ttl: { ClientCredentials: (ctx, token) => token.resourceServer?.accessTokenTTL || 600 },
});

const b64 = (value) => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url');

function forged(sub) {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const kid = jwks.keys.find((key) => key.alg === 'RS256').kid;
  const now = Math.floor(Date.now() / 1000);
  const input = `${b64({ alg: 'RS256', typ: 'at+jwt', kid })}.${b64({
    sub, iss: issuer, aud: audience, iat: now, exp: now + 600, client_id: sub, scope: 'checkout',
  })}`;
  return `${input}.${signWith('sha256', Buffer.from(input), privateKey).toString('base64url')}`;
}

const callback = provider.callback();
createServer((req, res) => {
  const url = new URL(req.url, issuer);
  if (url.pathname === '/test/forged') {
    res.setHeader('content-type', 'text/plain');
    res.end(forged(url.searchParams.get('sub')));
    return;
  }
  callback(req, res);
}).listen(port, '127.0.0.1', () => {
  console.log(`oidc-provider ${issuer} listening on ${port}`);
});
