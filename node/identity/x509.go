package identity

import (
	"crypto/ed25519"
	"crypto/x509"
	"errors"
)

func parseCert(der []byte) (*x509.Certificate, error) { return x509.ParseCertificate(der) }

func parsePKCS8(der []byte) (ed25519.PrivateKey, error) {
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, errors.New("not an ed25519 key")
	}
	return ek, nil
}

func marshalPKCS8(k ed25519.PrivateKey) ([]byte, error) {
	if k == nil {
		return nil, errors.New("this server does not hold the CA key")
	}
	return x509.MarshalPKCS8PrivateKey(k)
}
