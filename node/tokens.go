package node

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"shoal/coordinator"
)

const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b)
}

func hashSecret(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// A join token is "<id>.<secret>.<ca hash hex>" (kubeadm's token and
// discovery hash in one string); an admin API key is "<id>.<secret>".
func isJoinToken(s string) bool {
	_, _, h, ok := parseToken(s)
	return ok && h != ""
}

func parseToken(s string) (id, secret, caHash string, ok bool) {
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 || len(parts[0]) != 6 || len(parts[1]) != 16 {
		return "", "", "", false
	}
	if len(parts) == 3 {
		if len(parts[2]) != 64 {
			return "", "", "", false
		}
		if _, err := hex.DecodeString(parts[2]); err != nil {
			return "", "", "", false
		}
		caHash = "sha256:" + parts[2]
	}
	return parts[0], parts[1], caHash, true
}

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
