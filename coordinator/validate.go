package coordinator

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"unicode/utf8"

	"shoal/placement"
)

// Every command is checked where it is applied (FSM.Apply, on every
// server, so a command that fails is skipped the same way everywhere and
// changes nothing) and before it is proposed (Server.Apply, Client.Apply,
// Client.Handle), so that it is refused with a clear message before it is
// written. Each request type has a Validate method with the bounds below;
// ValidateCommand runs the one of a log entry's type.

// Bounds of what a command may hold. Strings are in bytes.
const (
	// MaxCommandBytes bounds a command's JSON body (the RPC's frames are
	// 4 MiB: transport.DefaultMaxFrame), MaxCommandValues the objects,
	// arrays and elements in it, so that decoding it allocates in
	// proportion to neither more than a few tens of MiB (an empty object
	// of 2 bytes can decode to a struct of a hundred). The largest real
	// commands (a profile of 4096 layers, a plan of 4096 stages) hold
	// under 100,000.
	MaxCommandBytes  = 4 << 20
	MaxCommandValues = 1 << 18
	// MaxIDLen bounds node and token IDs.
	MaxIDLen = 128
	// MaxModelNameLen bounds a model's name.
	MaxModelNameLen = 128
	// MaxAddrLen bounds a host:port.
	MaxAddrLen = 512
	// MaxShortLen bounds short words: versions, digests, manifests,
	// accelerators, interfaces, strategies, wire formats.
	MaxShortLen = 256
	// MaxPathLen bounds a model file's path and a hub file's name.
	MaxPathLen = 4096
	// MaxTextLen bounds free text: reasons, errors, descriptions.
	MaxTextLen = 16 << 10
	// MaxPEMLen bounds each of the HTTPS CA's PEM blocks.
	MaxPEMLen = 64 << 10
	// MaxListLen bounds a token's models, a model's pin and the links of
	// one report.
	MaxListLen = 1024
	// MaxModels bounds the models of the state, MaxHolders the copies of
	// one model's file, MaxLinksPerNode the links measured from one node,
	// MaxTokens the tokens: so that no node, client or not, grows the
	// state without end.
	MaxModels       = 4096
	MaxHolders      = 4096
	MaxLinksPerNode = 4096
	MaxTokens       = 1 << 16
	// MaxReplicas bounds a model's wanted copies, MaxQueue its queue,
	// MaxCores a node's cores.
	MaxReplicas = 1024
	MaxQueue    = 1 << 20
	MaxLookup   = 16 // tokens drafted a step (Model.Lookup)
	MaxCores    = 1 << 20
	// MaxGFLOPS and MaxGBps bound a node's measured compute and memory
	// bandwidth; MaxGbit and MaxLatencyMs a link's bandwidth and latency.
	MaxGFLOPS    = 1e9
	MaxGBps      = 1e9
	MaxGbit      = 1e6
	MaxLatencyMs = 1e7
)

// invalid is the error of a command that fails its checks.
func invalid(format string, args ...any) error {
	return &Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

// commandNames name the command types in messages.
var commandNames = map[MessageType]string{
	RegisterNodeType:   "register-node",
	DeregisterNodeType: "deregister-node",
	NodeStatusType:     "node-status",
	NodeDrainType:      "node-drain",
	TokenCreateType:    "token-create",
	TokenRevokeType:    "token-revoke",
	ModelUpsertType:    "model-upsert",
	ModelDeleteType:    "model-delete",
	PlanSetType:        "plan-set",
	ShardStatusType:    "shard-status",
	LinkReportType:     "link-report",
	HTTPSCASetType:     "https-ca-set",
	NodeRevokeType:     "node-revoke",
	TokenRotateType:    "token-rotate",
	ModelHolderType:    "model-holder",
	ProtocolSetType:    "protocol-set",
}

// CommandName names command type t (its IgnoreUnknownTypeFlag aside).
func CommandName(t MessageType) string {
	if n, ok := commandNames[t&^IgnoreUnknownTypeFlag]; ok {
		return n
	}
	return fmt.Sprintf("type %d", uint8(t&^IgnoreUnknownTypeFlag))
}

// errUnknownType is the answer to a command of a type this server does
// not know.
func errUnknownType(t MessageType) error {
	return invalid("unknown command type %d: this server knows types 0 to %d (a newer server's command? upgrade this one)", uint8(t&^IgnoreUnknownTypeFlag), len(commandTable)-1)
}

// ValidateCommand checks the command a log entry of type t (its
// IgnoreUnknownTypeFlag aside) and JSON body would apply, as FSM.Apply
// checks it: a 400 *Error naming the field and the bound, or nil. A type
// this server does not know is refused.
func ValidateCommand(t MessageType, body []byte) error {
	c, ok := commandTable[t&^IgnoreUnknownTypeFlag]
	if !ok {
		return errUnknownType(t)
	}
	_, err := c.check(body)
	return err
}

// request is a command's request: it checks its own fields.
type request interface{ Validate() error }

// decodeChecked decodes a command's body and checks it, the one step that
// both FSM.Apply and ValidateCommand take.
func decodeChecked[T any, PT interface {
	*T
	request
}](t MessageType, body []byte) (*T, error) {
	if len(body) > MaxCommandBytes {
		return nil, invalid("invalid %s: the command is %d bytes, limit %d", CommandName(t), len(body), MaxCommandBytes)
	}
	if n := jsonValues(body); n > MaxCommandValues {
		return nil, invalid("invalid %s: the command holds more than %d JSON values (objects, arrays and their elements)", CommandName(t), MaxCommandValues)
	}
	v, err := decode[T](body)
	if err != nil {
		return nil, invalid("invalid %s: %v", CommandName(t), err)
	}
	if err := PT(v).Validate(); err != nil {
		return nil, invalid("invalid %s: %v", CommandName(t), err)
	}
	return v, nil
}

// jsonValues counts the objects, arrays and separated elements of JSON
// text b (its '{', '[' and ',' outside strings), stopping past
// MaxCommandValues: what decoding it may allocate structs for.
func jsonValues(b []byte) int {
	n, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[' || c == ',':
			if n++; n > MaxCommandValues {
				return n
			}
		}
	}
	return n
}

// ---- field checks

// idChar reports whether c may be in an ID or a model name.
func idChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// checkID checks a node or token ID: 1 to MaxIDLen letters, digits, '.',
// '_' and '-'.
func checkID(field, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(s) > MaxIDLen {
		return fmt.Errorf("%s is %d bytes, limit %d", field, len(s), MaxIDLen)
	}
	for i := 0; i < len(s); i++ {
		if !idChar(s[i]) {
			return fmt.Errorf("%s %.40q: use letters, digits, '.', '_' and '-'", field, s)
		}
	}
	return nil
}

// checkKey checks the ID or name a command looks up (deletes, revokes,
// status changes): not empty and within bound, so that an entry a former
// rule allowed can still be named.
func checkKey(field, s string, bound int) error {
	if s == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(s) > bound {
		return fmt.Errorf("%s is %d bytes, limit %d", field, len(s), bound)
	}
	return nil
}

// CheckModelName reports why name cannot name a model, or nil: 1 to
// MaxModelNameLen letters, digits, '.', '_', '-', ':', '+' and '@',
// starting with a letter or digit. A model's name is in API paths, the
// OpenAI "model" field, shard keys and file names.
func CheckModelName(name string) error {
	return checkName("model name", name, MaxModelNameLen, "._-:+@")
}

// checkText checks free text: at most bound bytes of UTF-8 without
// control characters other than tab and newline.
func checkText(field, s string, bound int) error {
	if len(s) > bound {
		return fmt.Errorf("%s is %d bytes, limit %d", field, len(s), bound)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not UTF-8", field)
	}
	for _, r := range s {
		if r < 0x20 && r != '\t' && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 {
			return fmt.Errorf("%s has the control character %U", field, r)
		}
	}
	return nil
}

// checkWord checks a short word (a digest, a version, an interface): at
// most bound bytes of printable ASCII, no spaces.
func checkWord(field, s string, bound int) error {
	if len(s) > bound {
		return fmt.Errorf("%s is %d bytes, limit %d", field, len(s), bound)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return fmt.Errorf("%s %.40q: printable ASCII without spaces only", field, s)
		}
	}
	return nil
}

// checkOneOf checks that s is one of allowed.
func checkOneOf(field, s string, allowed ...string) error {
	for _, a := range allowed {
		if s == a {
			return nil
		}
	}
	return fmt.Errorf("%s %.40q is not one of %q", field, s, allowed)
}

func checkInt(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s %d is outside [%d, %d]", field, v, lo, hi)
	}
	return nil
}

func checkBytes(field string, v uint64) error {
	if v > placement.MaxBytes {
		return fmt.Errorf("%s %d is above the limit %d (1 PiB)", field, v, placement.MaxBytes)
	}
	return nil
}

// checkFloat checks a finite float in [0, hi] (NaN fails).
func checkFloat(field string, v, hi float64) error {
	if !(v >= 0 && v <= hi) {
		return fmt.Errorf("%s %g is outside [0, %g]", field, v, hi)
	}
	return nil
}

// first returns the first error of errs, or nil.
func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- one Validate per request type

// Validate checks the node a leader registers.
func (r *RegisterNodeRequest) Validate() error {
	n := &r.Node
	if err := CheckNodeName(n.Name); err != nil {
		return fmt.Errorf("node.name: %w", err)
	}
	c := &n.Caps
	return first(
		checkID("node.id", n.ID),
		checkOneOf("node.role", n.Role, "", RoleServer, RoleClient), // "": an agent that gossips none
		checkWord("node.addr", n.Addr, MaxAddrLen),
		checkWord("node.rpc_addr", n.RPCAddr, MaxAddrLen),
		checkWord("node.http_addr", n.HTTPAddr, MaxAddrLen),
		checkText("node.version", n.Version, MaxShortLen),
		checkOneOf("node.status", string(n.Status), string(StatusAlive), string(StatusSuspect), string(StatusFailed), string(StatusLeft)),
		checkBytes("node.caps.mem_total", c.MemTotal),
		checkBytes("node.caps.mem_free", c.MemFree),
		checkInt("node.caps.cores", c.Cores, 0, MaxCores),
		checkFloat("node.caps.gflops", c.GFLOPS, MaxGFLOPS),
		checkFloat("node.caps.mem_gbps", c.MemGBps, MaxGBps),
		checkText("node.caps.accel", c.Accel, MaxShortLen),
		checkText("node.caps.gpu", c.GPU, MaxShortLen),
		checkBytes("node.caps.gpu_mem", c.GPUMem),
		checkFloat("node.caps.gpu_gbps", c.GPUGBps, MaxGBps),
		checkOneOf("node.caps.serves", c.Serves, "", placement.ServesPrefill, placement.ServesDecode),
	)
}

// Validate checks the node ID.
func (r *DeregisterNodeRequest) Validate() error { return checkKey("id", r.ID, MaxIDLen) }

// Validate checks the node ID.
func (r *NodeRevokeRequest) Validate() error { return checkKey("id", r.ID, MaxIDLen) }

// Validate checks the node ID and the status.
func (r *NodeStatusRequest) Validate() error {
	return first(
		checkKey("id", r.ID, MaxIDLen),
		checkOneOf("status", string(r.Status), string(StatusAlive), string(StatusSuspect), string(StatusFailed), string(StatusLeft)),
	)
}

// Validate checks the node ID.
func (r *NodeDrainRequest) Validate() error { return checkKey("id", r.ID, MaxIDLen) }

// Validate checks the new token's fields.
func (r *TokenCreateRequest) Validate() error {
	t := &r.Token
	if len(t.Models) > MaxListLen {
		return fmt.Errorf("token.models has %d names, limit %d", len(t.Models), MaxListLen)
	}
	for i, m := range t.Models {
		if err := checkKey(fmt.Sprintf("token.models[%d]", i), m, MaxModelNameLen); err != nil {
			return err
		}
	}
	return first(
		checkID("token.id", t.ID),
		checkOneOf("token.kind", t.Kind, TokenJoin, TokenAdmin, TokenInference, TokenRead, TokenBootstrap),
		checkOneOf("token.role", t.Role, "", RoleClient, RoleServer),
		checkWord("token.secret_hash", t.SecretHash, MaxShortLen),
		checkText("token.description", t.Description, MaxTextLen),
	)
}

// Validate checks the token ID.
func (r *TokenRevokeRequest) Validate() error { return checkKey("id", r.ID, MaxIDLen) }

// Validate checks the token ID and the new secret's hash.
func (r *TokenRotateRequest) Validate() error {
	return first(
		checkKey("id", r.ID, MaxIDLen),
		checkWord("secret_hash", r.SecretHash, MaxShortLen),
	)
}

// Validate checks the model.
func (r *ModelUpsertRequest) Validate() error {
	if err := CheckModelName(r.Model.Name); err != nil {
		return fmt.Errorf("model.name: %w", err)
	}
	if err := validateModel(&r.Model); err != nil {
		return fmt.Errorf("model %q: %w", r.Model.Name, err)
	}
	return nil
}

// validateModel checks a model's fields but its name: in an upsert and
// in a restored snapshot.
func validateModel(m *Model) error {
	if len(m.Pin) > MaxListLen {
		return fmt.Errorf("pin has %d nodes, limit %d", len(m.Pin), MaxListLen)
	}
	pinned := make(map[string]bool, len(m.Pin))
	for i, id := range m.Pin {
		if err := checkID(fmt.Sprintf("pin[%d]", i), id); err != nil {
			return err
		}
		if pinned[id] {
			return fmt.Errorf("pin lists node %s twice", id)
		}
		pinned[id] = true
	}
	if len(m.Holders) > MaxHolders {
		return fmt.Errorf("holders has %d nodes, limit %d", len(m.Holders), MaxHolders)
	}
	for id, h := range m.Holders {
		if h == nil || h.Node != id {
			return fmt.Errorf("holders[%.40q] is not that node's copy", id)
		}
		if err := validateHolder(h); err != nil {
			return fmt.Errorf("holders[%.40q]: %w", id, err)
		}
	}
	if m.Profile != nil {
		if err := m.Profile.Validate(); err != nil {
			return err
		}
		if m.Layers != 0 && m.Layers != m.Profile.NLayer {
			return fmt.Errorf("layers %d, the profile has n_layer %d", m.Layers, m.Profile.NLayer)
		}
	}
	if h := m.Hub; h != nil {
		if err := first(
			checkText("hub.endpoint", h.Endpoint, MaxPathLen),
			checkText("hub.repo", h.Repo, MaxPathLen),
			checkText("hub.revision", h.Revision, MaxShortLen),
			checkText("hub.file", h.File, MaxPathLen),
			checkWord("hub.sha256", h.SHA256, MaxShortLen),
		); err != nil {
			return err
		}
		if h.Size < 0 || uint64(h.Size) > placement.MaxBytes {
			return fmt.Errorf("hub.size %d is outside [0, %d]", h.Size, placement.MaxBytes)
		}
	}
	if d := m.Draft; d != nil {
		if err := first(
			checkText("draft.source", d.Source, MaxPathLen),
			checkWord("draft.digest", d.Digest, MaxShortLen),
			checkWord("draft.manifest", d.Manifest, MaxShortLen),
			checkBytes("draft.bytes", d.Bytes),
			checkInt("draft.layers", d.Layers, 1, placement.MaxLayers),
			checkBytes("draft.kv_bytes_per_token", d.KVBytesPerToken),
			checkInt("draft.max", d.Max, 0, MaxLookup),
		); err != nil {
			return err
		}
		if d.Source == "" {
			return errors.New("draft.source is empty")
		}
	}
	return first(
		checkText("source", m.Source, MaxPathLen),
		checkWord("digest", m.Digest, MaxShortLen),
		checkWord("manifest", m.Manifest, MaxShortLen),
		checkInt("layers", m.Layers, 0, placement.MaxLayers),
		checkBytes("bytes", m.Bytes),
		checkKeyOrEmpty("source_node", m.SourceNode),
		checkInt("ctx", m.Ctx, 0, placement.MaxContext),
		checkBytes("overhead", m.Overhead),
		checkInt("max_seqs", m.MaxSeqs, 0, placement.MaxBatch),
		checkInt("queue", m.Queue, 0, MaxQueue),
		checkInt("lookup", m.Lookup, 0, MaxLookup),
		checkInt("plan_prompt", m.PlanPrompt, 0, placement.MaxContext),
		checkInt("plan_gen", m.PlanGen, 0, placement.MaxContext),
		checkOneOf("strategy", m.Strategy, "", string(placement.Auto), string(placement.Pipeline), string(placement.Tensor)),
		checkOneOf("disagg", m.Disagg, "", placement.DisaggAuto, placement.DisaggOn, placement.DisaggOff),
		checkWord("disagg_failure", m.DisaggFailure, MaxShortLen),
		checkWord("wire", m.Wire, MaxShortLen),
		checkOneOf("kv_type", m.KVType, "", "f16", "q8_0", "q4_0"),
		checkInt("replicas", m.Replicas, 0, MaxReplicas),
		checkOneOf("status", m.Status, "", ModelHashing, ModelPlanned, ModelUnservable, ModelFailed),
		checkText("reason", m.Reason, MaxTextLen),
	)
}

func checkKeyOrEmpty(field, s string) error {
	if s == "" {
		return nil
	}
	return checkID(field, s)
}

// validateHolder checks one copy of a model file.
func validateHolder(h *ModelHolder) error {
	return first(
		checkID("node", h.Node),
		checkWord("digest", h.Digest, MaxShortLen),
		checkOneOf("state", h.State, "", HolderCopying, HolderReady, HolderNoRoom, HolderFailed),
		checkText("error", h.Error, MaxTextLen),
	)
}

// Validate checks the model's name.
func (r *ModelDeleteRequest) Validate() error { return checkKey("name", r.Name, MaxModelNameLen) }

// Validate checks the model's name and the copy.
func (r *ModelHolderRequest) Validate() error {
	if err := checkKey("model", r.Model, MaxModelNameLen); err != nil {
		return err
	}
	if err := validateHolder(&r.Holder); err != nil {
		return fmt.Errorf("holder: %w", err)
	}
	return nil
}

// Validate checks the plan's shape and bounds (placement.Plan.CheckBounds;
// the model's own layers are checked where it is applied, against the
// model in the state).
func (r *PlanSetRequest) Validate() error {
	if err := checkKey("plan.model", r.Plan.Model, MaxModelNameLen); err != nil {
		return err
	}
	if r.Plan.Version == 0 {
		return fmt.Errorf("plan.version is 0")
	}
	if err := r.Plan.CheckBounds(nil, 0); err != nil {
		return err
	}
	return checkText("inputs", r.Inputs, MaxCommandBytes/2)
}

// Validate checks the shard report.
func (r *ShardStatusRequest) Validate() error {
	s := &r.Shard
	if s.Lo < 0 || s.Hi < s.Lo || s.Hi > placement.MaxLayers {
		return fmt.Errorf("shard layers [%d,%d) are outside [0, %d)", s.Lo, s.Hi, placement.MaxLayers)
	}
	return first(
		checkID("shard.node", s.Node),
		checkKey("shard.model", s.Model, MaxModelNameLen),
		checkOneOf("shard.state", s.State, ShardFetching, ShardReady, ShardFailed, ShardVerifying),
		checkBytes("shard.bytes", s.Bytes),
		checkBytes("shard.done", s.Done),
		checkBytes("shard.fetched", s.Fetched),
		checkText("shard.error", s.Error, MaxTextLen),
		checkText("shard.source", s.Source, MaxShortLen),
		checkInt("shard.refetched", s.Refetched, 0, math.MaxInt32),
	)
}

// Validate checks each link of the report.
func (r *LinkReportRequest) Validate() error {
	if len(r.Links) > MaxListLen {
		return fmt.Errorf("links has %d entries, limit %d", len(r.Links), MaxListLen)
	}
	for i := range r.Links {
		if err := validateLink(&r.Links[i]); err != nil {
			return fmt.Errorf("links[%d]: %w", i, err)
		}
	}
	return nil
}

// validateLink checks one measured link.
func validateLink(l *LinkStat) error {
	if l.From == l.To {
		return fmt.Errorf("from and to are the same node %.40q", l.From)
	}
	return first(
		checkID("from", l.From),
		checkID("to", l.To),
		checkFloat("gbit", l.Gbit, MaxGbit),
		checkFloat("latency_ms", l.LatencyMs, MaxLatencyMs),
		checkFloat("probe_gbit", l.ProbeGbit, MaxGbit),
		checkFloat("live_gbit", l.LiveGbit, MaxGbit),
		checkFloat("direct_gbit", l.DirectGbit, MaxGbit),
		checkFloat("rtt_ms", l.RTTMs, MaxLatencyMs),
		checkWord("source", l.Source, MaxShortLen),
		checkText("iface", l.Iface, MaxShortLen),
		checkWord("telemetry", l.Telemetry, MaxShortLen),
	)
}

// Validate checks the CA's PEM blocks.
func (r *HTTPSCASetRequest) Validate() error {
	if r.CA.CertPEM == "" || r.CA.KeyPEM == "" {
		return fmt.Errorf("ca.cert_pem or ca.key_pem is empty")
	}
	return first(
		checkText("ca.cert_pem", r.CA.CertPEM, MaxPEMLen),
		checkText("ca.key_pem", r.CA.KeyPEM, MaxPEMLen),
	)
}

// ---- the checks of a restored snapshot

// sanitize drops what a snapshot holds that no command could have
// written (an entry that fails its command's checks, one under another
// key than its own, a nil one, a plan of no model or out of the model's
// bounds), logging each through drop, so that a server starts on a state
// every reader can trust instead of failing to start.
func (s *State) sanitize(drop func(what, key string, err error)) {
	sanitizeEntries(s.Nodes, "node", drop, func(n *Node) string { return n.ID },
		func(n *Node) error { return (&RegisterNodeRequest{Node: *n}).Validate() })
	sanitizeEntries(s.Tokens, "token", drop, func(t *Token) string { return t.ID },
		func(t *Token) error { return (&TokenCreateRequest{Token: *t}).Validate() })
	sanitizeEntries(s.Models, "model", drop, func(m *Model) string { return m.Name },
		func(m *Model) error { return (&ModelUpsertRequest{Model: *m}).Validate() })
	for name, p := range s.Plans {
		var err error
		switch {
		case p == nil || p.Model != name:
			err = fmt.Errorf("the entry is not the plan of model %q", name)
		case s.Models[name] == nil:
			err = fmt.Errorf("model %q is not in the state", name)
		default:
			err = checkPlanOf(p, s.Models[name])
		}
		if err != nil {
			drop("plan", name, err)
			delete(s.Plans, name)
			delete(s.PlanInputs, name)
		}
	}
	sanitizeEntries(s.Shards, "shard", drop, func(sh *ShardStatus) string { return ShardKey(sh.Node, sh.Model) },
		func(sh *ShardStatus) error { return (&ShardStatusRequest{Shard: *sh}).Validate() })
	sanitizeEntries(s.Links, "link", drop, func(l *LinkStat) string { return l.From + ">" + l.To }, validateLink)
	if s.HTTPSCA != nil {
		if err := (&HTTPSCASetRequest{CA: *s.HTTPSCA}).Validate(); err != nil {
			drop("https ca", "", err)
			s.HTTPSCA = nil
		}
	}
}

// sanitizeEntries drops from m, logging each through drop as a what,
// every entry that is nil, stands under another key than its own (key
// gives it) or fails check.
func sanitizeEntries[V any](m map[string]*V, what string, drop func(what, key string, err error),
	key func(*V) string, check func(*V) error) {
	for k, v := range m {
		var err error
		switch {
		case v == nil || key(v) != k:
			err = fmt.Errorf("the entry is not %s %q", what, k)
		default:
			err = check(v)
		}
		if err != nil {
			drop(what, k, err)
			delete(m, k)
		}
	}
}

// checkPlanOf checks plan p against model m: a plan with pools must tile
// the model's layers (its profile's, else Model.Layers when known) and stay
// within its heads, FFN and experts.
func checkPlanOf(p *placement.Plan, m *Model) error {
	if err := (&PlanSetRequest{Plan: *p}).Validate(); err != nil {
		return err
	}
	if m.Profile != nil && m.Profile.Validate() != nil {
		return p.CheckBounds(nil, m.Layers)
	}
	return p.CheckBounds(m.Profile, m.Layers)
}
