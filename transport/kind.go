package transport

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"
)

// Kind is the first byte of every stream and selects its handler.
type Kind byte

// Stream kinds. Values are part of the wire format: append, never renumber.
const (
	KindRaft        Kind = 1
	KindRPC         Kind = 2
	KindJoin        Kind = 3 // the only kind a peer without a certificate may open
	KindActivations Kind = 4
	KindCollectives Kind = 5
	KindKV          Kind = 6
	KindWeights     Kind = 7
	KindProbe       Kind = 8
	KindForward     Kind = 9  // an HTTP request passed to the agent serving its model
	KindGateway     Kind = 10 // a tokenized generation passed to a model's driver (gateway/)
)

func (k Kind) String() string {
	switch k {
	case KindRaft:
		return "raft"
	case KindRPC:
		return "rpc"
	case KindJoin:
		return "join"
	case KindActivations:
		return "activations"
	case KindCollectives:
		return "collectives"
	case KindKV:
		return "kv"
	case KindWeights:
		return "weights"
	case KindProbe:
		return "probe"
	case KindForward:
		return "forward"
	case KindGateway:
		return "gateway"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// IsUnknownKind reports whether err is a peer's refusal of a stream of a
// kind it has no handler for (an agent of an older version).
func IsUnknownKind(err error) bool {
	var se *quic.StreamError
	return errors.As(err, &se) && se.Remote && se.ErrorCode == codeUnknownKind
}
