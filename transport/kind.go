package transport

import "fmt"

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
	KindForward     Kind = 9 // an HTTP request passed to the agent serving its model
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
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}
