package identity

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// A join token is "<id>.<secret>.<ca hash hex>" (kubeadm's token and
// discovery hash in one string); an admin API key is "<id>.<secret>".

// IsJoinToken reports whether s has the form of a join token.
func IsJoinToken(s string) bool {
	_, _, h, ok := ParseToken(s)
	return ok && h != ""
}

// ParseToken splits a join token or API key; caHash ("sha256:…") is ""
// for an API key, and ok is false for anything else (a bootstrap secret).
func ParseToken(s string) (id, secret, caHash string, ok bool) {
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

const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"

// RandomString is n random lower-case letters and digits: token IDs and
// secrets, and the bootstrap secret.
func RandomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b)
}
