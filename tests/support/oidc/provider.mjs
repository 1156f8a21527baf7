// A real OpenID Provider for the tests (panva/oidc-provider, OpenID Certified), configured from
// the JSON in $SEALED_TEST_OIDC: { port, issuer, audience, jwks: {keys: [private JWK]}, clients: [...],
// claims: { "<account or client id>": { groups: [...], tenant: "..." } } }.
// Test-only: dev interactions (any password logs in), plain HTTP on loopback, in-memory storage.
// `PUT /test/claims/<id>` (JSON body) changes what the IdP says about an account or client, as an
// administrator removing a user from a group would.
import http from 'node:http';
import Provider from 'oidc-provider';

const cfg = JSON.parse(process.env.SEALED_TEST_OIDC);
const claims = cfg.claims;
const machine = new Set(cfg.clients.filter((c) => (c.grant_types || []).includes('client_credentials'))
  .map((c) => c.client_id));

const provider = new Provider(cfg.issuer, {
  clients: cfg.clients,
  jwks: cfg.jwks,
  pkce: { required: () => true },
  scopes: ['openid', 'offline_access', 'sealed'],
  claims: { openid: ['sub'], sealed: ['groups', 'tenant'] },
  conformIdTokenClaims: false, // the ID token carries the scope's claims (groups, tenant)
  async findAccount(ctx, id) {
    return { accountId: id, async claims() { return { sub: id, ...(claims[id] || {}) }; } };
  },
  async extraTokenClaims(ctx, token) {
    const id = token.accountId || token.clientId;
    return { ...(claims[id] || {}) };
  },
  // Skip the consent screen: the console client is first-party.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid sealed');
    grant.addOIDCClaims(['groups', 'tenant']);
    await grant.save();
    return grant;
  },
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (ctx, client) => (machine.has(client.clientId) ? cfg.audience : undefined),
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'manage', audience: cfg.audience, accessTokenTTL: 600, accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  ttl: { ClientCredentials: 600, AccessToken: 600, IdToken: 600 },
});

provider.use(async (ctx, next) => {
  const m = ctx.path.match(/^\/test\/claims\/([^/]+)$/);
  if (m && ctx.method === 'PUT') {
    let body = '';
    for await (const chunk of ctx.req) body += chunk;
    claims[decodeURIComponent(m[1])] = JSON.parse(body);
    ctx.status = 204;
    return;
  }
  await next();
});

const server = http.createServer(provider.callback());
server.listen(cfg.port, '127.0.0.1', () => { console.log(`oidc-provider listening ${cfg.issuer}`); });
