package node

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"time"

	"shoal/api"
	"shoal/coordinator"
	"shoal/gateway"
	"shoal/internal/grantcache"
)

// The admin API's keys and tokens: checking a key's scope (on a server
// from its state, on a client agent by asking a server), and creating,
// rotating, listing and revoking tokens.

// scopeKinds lists the key kinds that have each scope.
var scopeKinds = map[api.Scope][]string{
	api.ScopeAdmin:     {coordinator.TokenAdmin, coordinator.TokenBootstrap},
	api.ScopeRead:      {coordinator.TokenAdmin, coordinator.TokenRead, coordinator.TokenBootstrap},
	api.ScopeInference: {coordinator.TokenAdmin, coordinator.TokenInference, coordinator.TokenBootstrap},
}

// Authorize checks that key has scope: an admin key has every scope, a
// read or inference key its own; the bootstrap secret acts as an admin key
// until operators create one.
func (b *admin) Authorize(ctx context.Context, key string, scope api.Scope) error {
	_, err := b.grant(ctx, key, scope)
	return err
}

// InferenceKey checks a key of the OpenAI endpoint and returns the models
// it is limited to (none: every model). A read key may list the models
// (list: the dashboard shows them).
func (b *admin) InferenceKey(ctx context.Context, key string, list bool) ([]string, error) {
	tok, err := b.grant(ctx, key, api.ScopeInference)
	if err != nil && list {
		return nil, b.ReadKey(ctx, key)
	}
	if err != nil || tok == nil {
		return nil, err
	}
	return tok.Models, nil
}

// ReadKey checks a key of the dashboard.
func (b *admin) ReadKey(ctx context.Context, key string) error {
	return b.Authorize(ctx, key, api.ScopeRead)
}

// grant finds key's token and checks it has scope; the token is nil for
// the local bootstrap secret before the cluster stored it.
func (b *admin) grant(ctx context.Context, key string, scope api.Scope) (*coordinator.Token, error) {
	if model, ok := gateway.ForwardedModel(ctx); ok {
		// The agent that passed the request on checked the user's key
		// and kept it; the peer's certificate is the credential here,
		// for the one model and the routes peers may forward (the one
		// read among them: what the driver measures).
		if key != gateway.ForwardGrant {
			return nil, forbidden("a forwarded request carries no API key")
		}
		return &coordinator.Token{Kind: coordinator.TokenInference, Models: []string{model}}, nil
	}
	if b.srv == nil {
		return b.grantRemote(ctx, key, scope)
	}
	tok, err := b.authorize(ctx, key, scopeKinds[scope], false)
	if err != nil && b.srv != nil && !b.srv.IsLeader() {
		// A follower may not have applied a key created a moment ago:
		// check once more against the leader's state.
		return b.authorize(ctx, key, scopeKinds[scope], true)
	}
	return tok, err
}

// grantRemote asks a server about key: a client agent sees no token
// hashes. Before it knows a server, it accepts only its own bootstrap
// secret.
func (b *admin) grantRemote(ctx context.Context, key string, scope api.Scope) (*coordinator.Token, error) {
	id := grantcache.IDOf(key, string(scope))
	if g, ok := b.keys.Get(id, keyFresh); ok {
		return g.token(), nil
	}
	var g keyGrant
	asked, err := b.askServer(ctx, methodCheckKey, checkKeyRequest{Key: key, Scope: scope}, &g)
	if !asked && b.bootstrapSecret != "" && subtle.ConstantTimeCompare([]byte(key), []byte(b.bootstrapSecret)) == 1 {
		return nil, nil
	}
	if err != nil {
		if refused(err) {
			b.keys.Drop(id)
		} else if g, ok := b.keys.Get(id, keyStale); ok {
			return g.token(), nil // no server answered: what one said lately stands
		}
		return nil, err
	}
	b.keys.Put(id, g, keyStale)
	return g.token(), nil
}

// token is the token a grant stands for: nil for a server's bootstrap
// secret before it was stored.
func (g keyGrant) token() *coordinator.Token {
	if g.Kind == "" {
		return nil
	}
	return &coordinator.Token{Kind: g.Kind, Models: g.Models}
}

func (b *admin) authorize(ctx context.Context, key string, kinds []string, viaLeader bool) (*coordinator.Token, error) {
	var st *coordinator.State
	var err error
	switch {
	case b.srv != nil && !viaLeader:
		st = b.srv.FSM().State() // servers check locally, so a dead leader cannot lock operators out
	case b.srv != nil:
		// The key is not in this server's copy, which may lag (a server
		// just restarted holds its last snapshot until the leader
		// contacts it): only the leader's state can say no.
		if st, err = b.cluster.LeaderState(ctx); err != nil {
			return nil, &coordinator.Error{Code: http.StatusServiceUnavailable,
				Msg: fmt.Sprintf("this server does not know the key and no leader answered to confirm it (an election may be under way; retry): %v", err)}
		}
	default:
		if st, err = b.cluster.State(ctx); err != nil {
			st = coordinator.NewState() // still allow the local bootstrap secret below
		}
	}
	now := time.Now()
	tok, err := checkToken(st, key, now, kinds...)
	if err == nil {
		if tok.Kind == coordinator.TokenBootstrap && adminKeysExist(st, now) {
			return nil, forbidden("the bootstrap secret is no longer an API key once admin keys exist: use an admin key")
		}
		return tok, nil
	}
	// Before the cluster has stored the bootstrap token, the agent that
	// was given the secret accepts it itself.
	if b.bootstrapSecret != "" && st.Tokens[coordinator.TokenBootstrap] == nil && !adminKeysExist(st, now) &&
		subtle.ConstantTimeCompare([]byte(key), []byte(b.bootstrapSecret)) == 1 {
		return nil, nil
	}
	if strings.Contains(err.Error(), "invalid token") {
		return nil, forbidden("invalid API key")
	}
	return nil, err
}

// CreateToken stores a new token's hash; the secret is returned once.
func (b *admin) CreateToken(ctx context.Context, req api.TokenRequest, ttl time.Duration) (*api.NewToken, error) {
	id, secret := randomString(6), randomString(16)
	now := time.Now().UTC()
	kind := req.Kind
	tok := coordinator.Token{ID: id, Kind: kind, Models: req.Models, Role: req.Role, SecretHash: hashSecret(secret),
		Description: req.Description, CreatedAt: now}
	if ttl > 0 {
		exp := now.Add(ttl)
		tok.ExpiresAt = &exp
	}
	if err := b.cluster.Apply(ctx, coordinator.TokenCreateType, coordinator.TokenCreateRequest{Token: tok}); err != nil {
		return nil, err
	}
	return &api.NewToken{Token: apiToken(&tok), Secret: b.fullToken(&tok, secret)}, nil
}

// fullToken is the string a user presents: "<id>.<secret>", and for join
// tokens the CA hash after it.
func (b *admin) fullToken(t *coordinator.Token, secret string) string {
	full := t.ID + "." + secret
	if t.Kind == coordinator.TokenJoin {
		full += "." + b.caHash
	}
	return full
}

// RotateToken gives a token a new secret: the old one stops working at
// once, everything else about the token stays.
func (b *admin) RotateToken(ctx context.Context, id string) (*api.NewToken, error) {
	secret := randomString(16)
	now := time.Now().UTC()
	if err := b.cluster.Apply(ctx, coordinator.TokenRotateType, coordinator.TokenRotateRequest{ID: id, SecretHash: hashSecret(secret), Now: now}); err != nil {
		return nil, err
	}
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	t := st.Tokens[id]
	if t == nil {
		return nil, fmt.Errorf("token %s vanished after its rotation", id)
	}
	return &api.NewToken{Token: apiToken(t), Secret: b.fullToken(t, secret)}, nil
}

// Tokens lists the tokens (hashes only).
func (b *admin) Tokens(ctx context.Context) ([]*api.Token, error) {
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	return apiTokens(st.SortedTokens()), nil
}

// RevokeToken revokes a token by ID.
func (b *admin) RevokeToken(ctx context.Context, id string) error {
	return b.cluster.Apply(ctx, coordinator.TokenRevokeType, coordinator.TokenRevokeRequest{ID: id, Now: time.Now().UTC()})
}
