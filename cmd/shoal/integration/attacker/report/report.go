package report

// Attempt is one call and how the server answered it.
type Attempt struct {
	Name string `json:"name"`
	Code int    `json:"code"` // 0: accepted
	Err  string `json:"err,omitempty"`
}

// Result is what the attacker prints (one JSON object).
type Result struct {
	Attempts []Attempt `json:"attempts,omitempty"`
	// Cluster.State as a client node saw it.
	Tokens []StateToken `json:"tokens,omitempty"`
	Nodes  int          `json:"nodes,omitempty"`
	// An HTTP request's answer.
	Status int    `json:"status,omitempty"`
	Body   string `json:"body,omitempty"`

	// gossip: the member it gossiped, how many members its join
	// contacted, the streams (by kind) and RPC methods its endpoint
	// received, and the names in the HTTPS certificates servers signed
	// for it.
	Member   string         `json:"member,omitempty"`
	Joined   int            `json:"joined,omitempty"`
	Streams  map[string]int `json:"streams,omitempty"`
	Methods  []string       `json:"methods,omitempty"`
	DNSNames []string       `json:"dns_names,omitempty"`

	// Floods (streams, dist-open, layout): how many it opened or got
	// answered, how many the server refused, closed or reset, and how
	// many were still open at the end; the status codes of the refusals.
	Opened  int            `json:"opened,omitempty"`
	Blocked int            `json:"blocked,omitempty"`
	Closed  int            `json:"closed,omitempty"`
	Held    int            `json:"held,omitempty"`
	Codes   map[string]int `json:"codes,omitempty"`
	Seconds float64        `json:"seconds,omitempty"` // how long the opening took
	// layout: the piece checksums and reply bytes it got in all.
	Sums  int `json:"sums,omitempty"`
	Bytes int `json:"bytes,omitempty"`

	// trickle: seconds from the headers until the server closed the
	// connection (-1: still open at the limit) and until it answered (0:
	// no answer), body bytes sent.
	ClosedAfter   float64 `json:"closed_after,omitempty"`
	AnsweredAfter float64 `json:"answered_after,omitempty"`
	Sent          int     `json:"sent,omitempty"`
}

type StateToken struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	HasHash bool   `json:"has_hash"`
}
