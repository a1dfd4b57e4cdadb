package node

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"shoal/coordinator"
	"shoal/node/identity"
)

// randomString is identity.RandomString.
func randomString(n int) string { return identity.RandomString(n) }

func hashSecret(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// parseToken is identity.ParseToken.
func parseToken(s string) (id, secret, caHash string, ok bool) { return identity.ParseToken(s) }

func tokenErr(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusForbidden, Msg: fmt.Sprintf(format, args...)}
}

// checkToken validates a presented token or key against the state. kinds
// lists the acceptable kinds.
func checkToken(st *coordinator.State, presented string, now time.Time, kinds ...string) (*coordinator.Token, error) {
	if presented == "" {
		return nil, tokenErr("no token given")
	}
	var tok *coordinator.Token
	var secret string
	if id, sec, _, ok := parseToken(presented); ok && st.Tokens[id] != nil {
		tok, secret = st.Tokens[id], sec
	} else if b := st.Tokens[coordinator.TokenBootstrap]; b != nil {
		tok, secret = b, presented
	}
	if tok == nil || subtle.ConstantTimeCompare([]byte(hashSecret(secret)), []byte(tok.SecretHash)) != 1 {
		return nil, tokenErr("invalid token")
	}
	if tok.Revoked {
		return nil, tokenErr("token %s is revoked", tok.ID)
	}
	if !tok.Valid(now) {
		return nil, tokenErr("token %s expired", tok.ID)
	}
	for _, k := range kinds {
		if tok.Kind == k {
			return tok, nil
		}
	}
	return nil, tokenErr("token %s is a %s token, not %s", tok.ID, tok.Kind, strings.Join(kinds, " or "))
}

// adminKeysExist reports whether operators created their own API keys,
// which retires the bootstrap secret as an API key.
func adminKeysExist(st *coordinator.State, now time.Time) bool {
	for _, t := range st.Tokens {
		if t.Kind == coordinator.TokenAdmin && t.Valid(now) {
			return true
		}
	}
	return false
}
