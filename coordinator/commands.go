package coordinator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"shoal/placement"
)

// MessageType is the first byte of every Raft log entry.
type MessageType uint8

// IgnoreUnknownTypeFlag marks a command that a server which does not know
// its type can safely miss. Set it on commands added later that older
// servers may skip. A server skips a command of an unknown type either way
// (FSM.Apply: no server stops on one); without the flag it logs an error.
const IgnoreUnknownTypeFlag MessageType = 128

// Command types. Values are stored in Raft logs: append, never renumber.
const (
	RegisterNodeType   MessageType = 0
	DeregisterNodeType MessageType = 1
	NodeStatusType     MessageType = 2
	NodeDrainType      MessageType = 3
	TokenCreateType    MessageType = 4
	TokenRevokeType    MessageType = 5
	ModelUpsertType    MessageType = 6
	ModelDeleteType    MessageType = 7
	PlanSetType        MessageType = 8
	ShardStatusType    MessageType = 9
	// LinkReportType is sent with IgnoreUnknownTypeFlag: a server that
	// predates it skips link reports.
	LinkReportType MessageType = 10
	// HTTPSCASetType is sent with IgnoreUnknownTypeFlag: a server that
	// predates it keeps no HTTPS CA and signs no HTTPS certificates.
	HTTPSCASetType MessageType = 11
	// NodeRevokeType revokes a removed node's certificate.
	NodeRevokeType MessageType = 12
	// TokenRotateType gives a token a new secret.
	TokenRotateType MessageType = 13
	// ModelHolderType records a node's copy of a model file. Sent with
	// IgnoreUnknownTypeFlag: a server that predates it keeps no copies.
	ModelHolderType MessageType = 14
	// ProtocolSetType records the cluster's protocol (protocol.go). Added
	// in protocol 2: written only once every server speaks it, with
	// IgnoreUnknownTypeFlag all the same.
	ProtocolSetType MessageType = 15
)

// RegisterNodeRequest upserts a node from gossip. Draining and RegisteredAt
// of a known node are kept.
type RegisterNodeRequest struct {
	Node Node      `json:"node"`
	Now  time.Time `json:"now"`
}

// DeregisterNodeRequest removes a node from the state.
type DeregisterNodeRequest struct {
	ID string `json:"id"`
}

// NodeRevokeRequest revokes the certificate of node ID: no node of the
// cluster accepts a connection from it again.
type NodeRevokeRequest struct {
	ID  string    `json:"id"`
	Now time.Time `json:"now"`
}

// TokenRotateRequest replaces a token's secret hash.
type TokenRotateRequest struct {
	ID         string    `json:"id"`
	SecretHash string    `json:"secret_hash"`
	Now        time.Time `json:"now"`
}

// NodeStatusRequest sets a node's status.
type NodeStatusRequest struct {
	ID     string     `json:"id"`
	Status NodeStatus `json:"status"`
	Now    time.Time  `json:"now"`
}

// NodeDrainRequest sets or clears a node's draining flag.
type NodeDrainRequest struct {
	ID    string `json:"id"`
	Drain bool   `json:"drain"`
}

// TokenCreateRequest stores a new token (hash only).
type TokenCreateRequest struct {
	Token Token `json:"token"`
}

// TokenRevokeRequest revokes a token by ID.
type TokenRevokeRequest struct {
	ID  string    `json:"id"`
	Now time.Time `json:"now"`
}

// ModelUpsertRequest adds or replaces a model. With StatusOnly it changes
// only the Status and Reason of the model of that name, and only while it
// is the same registration (CreatedAt) and its status is still
// FromStatus: the planner records what it decided on a
// state read a moment before without putting back the rest of the model as
// it read it (an agent may have registered the model again meanwhile,
// with another pin or file, or a check failed it).
type ModelUpsertRequest struct {
	Model      Model  `json:"model"`
	StatusOnly bool   `json:"status_only,omitempty"`
	FromStatus string `json:"from_status,omitempty"`
}

// ModelDeleteRequest removes a model with its plan.
type ModelDeleteRequest struct {
	Name string `json:"name"`
}

// ModelHolderRequest records the state of Holder.Node's copy of model
// Model's file; an empty State forgets it.
type ModelHolderRequest struct {
	Model  string      `json:"model"`
	Holder ModelHolder `json:"holder"`
}

// PlanSetRequest stores a model's plan; Version must grow.
type PlanSetRequest struct {
	Plan placement.Plan `json:"plan"`
	// Inputs is the signature of what the planner read to decide it
	// (State.PlanInputs).
	Inputs string `json:"inputs,omitempty"`
}

// ShardStatusRequest records a node's report about a shard.
type ShardStatusRequest struct {
	Shard ShardStatus `json:"shard"`
}

// LinkReportRequest records link probes measured from one node.
type LinkReportRequest struct {
	Links []LinkStat `json:"links"`
}

// Encode builds a log entry: the type byte then the JSON request.
func Encode(t MessageType, req any) ([]byte, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return append([]byte{byte(t)}, b...), nil
}

// handler applies one command's body to the state at index: it decodes
// and checks it (an invalid one changes nothing), then applies it.
type handler func(s *State, index uint64, body []byte) any

// command is one command type: check decodes a body and checks it
// (Validate), apply applies a checked request to the state at index.
type command struct {
	check func(body []byte) (any, error)
	apply func(s *State, index uint64, req any) any
}

// cmd builds the command of request type T (a *T is checked by its
// Validate method) from the function that applies it.
func cmd[T any, PT interface {
	*T
	request
}](t MessageType, apply func(s *State, index uint64, r *T) any) command {
	return command{
		check: func(body []byte) (any, error) { return decodeChecked[T, PT](t, body) },
		apply: func(s *State, index uint64, req any) any { return apply(s, index, req.(*T)) },
	}
}

func decode[T any](body []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(body, v); err != nil {
		return nil, fmt.Errorf("decode command: %w", err)
	}
	return v, nil
}

// Error is an error with an HTTP status code, so the admin API can answer
// with the right status wherever the error came from.
type Error struct {
	Code int
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// HTTPStatus reports the status code the error maps to.
func (e *Error) HTTPStatus() int { return e.Code }

func errorf(code int, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Errors returned from Apply travel back to the proposer as the future's
// response; they carry HTTP codes for the admin API.
func notFound(what, id string) error {
	return errorf(http.StatusNotFound, "%s %q not found", what, id)
}

// commands is the command table as handlers.
var commands = func() map[MessageType]handler {
	out := make(map[MessageType]handler, len(commandTable))
	for t, c := range commandTable {
		out[t] = func(s *State, index uint64, body []byte) any {
			req, err := c.check(body)
			if err != nil {
				return err
			}
			return c.apply(s, index, req)
		}
	}
	return out
}()

// commandTable is the command table.
var commandTable = map[MessageType]command{
	ProtocolSetType: cmd(ProtocolSetType, applyProtocolSet),
	HTTPSCASetType: cmd(HTTPSCASetType, func(s *State, _ uint64, r *HTTPSCASetRequest) any {
		if r.CA.CertPEM == "" || r.CA.KeyPEM == "" {
			return errorf(http.StatusBadRequest, "HTTPS CA without a certificate or key")
		}
		if s.HTTPSCA != nil {
			return errorf(http.StatusConflict, "the cluster has an HTTPS CA")
		}
		ca := r.CA
		s.HTTPSCA = &ca
		return nil
	}),
	RegisterNodeType: cmd(RegisterNodeType, func(s *State, _ uint64, r *RegisterNodeRequest) any {
		n := r.Node
		if n.ID == "" {
			return errorf(http.StatusBadRequest, "node without an id")
		}
		if _, gone := s.RevokedNodes[n.ID]; gone {
			return errorf(http.StatusForbidden, "node %s was removed from the cluster", n.ID)
		}
		if old, ok := s.Nodes[n.ID]; ok {
			n.Draining = old.Draining
			n.RegisteredAt = old.RegisteredAt
			n.StatusSince = old.StatusSince
			if old.Status != n.Status {
				n.StatusSince = r.Now
			}
		} else {
			n.RegisteredAt = r.Now
			n.StatusSince = r.Now
		}
		s.Nodes[n.ID] = &n
		return nil
	}),
	DeregisterNodeType: cmd(DeregisterNodeType, func(s *State, _ uint64, r *DeregisterNodeRequest) any {
		if _, ok := s.Nodes[r.ID]; !ok {
			return notFound("node", r.ID)
		}
		delete(s.Nodes, r.ID)
		for _, m := range s.Models {
			delete(m.Holders, r.ID)
		}
		for k, sh := range s.Shards {
			if sh.Node == r.ID {
				delete(s.Shards, k)
			}
		}
		for k, l := range s.Links {
			if l.From == r.ID || l.To == r.ID {
				delete(s.Links, k)
			}
		}
		return nil
	}),
	NodeStatusType: cmd(NodeStatusType, func(s *State, _ uint64, r *NodeStatusRequest) any {
		n, ok := s.Nodes[r.ID]
		if !ok {
			return notFound("node", r.ID)
		}
		if n.Status != r.Status {
			n.Status = r.Status
			n.StatusSince = r.Now
		}
		return nil
	}),
	NodeDrainType: cmd(NodeDrainType, func(s *State, _ uint64, r *NodeDrainRequest) any {
		n, ok := s.Nodes[r.ID]
		if !ok {
			return notFound("node", r.ID)
		}
		n.Draining = r.Drain
		return nil
	}),
	TokenCreateType: cmd(TokenCreateType, func(s *State, _ uint64, r *TokenCreateRequest) any {
		if old, ok := s.Tokens[r.Token.ID]; ok {
			if old.SecretHash != "" && old.SecretHash == r.Token.SecretHash {
				return nil // the same create, sent again after its leader went away
			}
			return errorf(http.StatusConflict, "token %q exists", r.Token.ID)
		}
		if len(s.Tokens) >= MaxTokens {
			return errorf(http.StatusConflict, "the cluster holds %d tokens, limit %d: revoke and remove some first", len(s.Tokens), MaxTokens)
		}
		t := r.Token
		s.Tokens[t.ID] = &t
		return nil
	}),
	TokenRevokeType: cmd(TokenRevokeType, func(s *State, _ uint64, r *TokenRevokeRequest) any {
		t, ok := s.Tokens[r.ID]
		if !ok {
			return notFound("token", r.ID)
		}
		if !t.Revoked {
			t.Revoked = true
			now := r.Now
			t.RevokedAt = &now
		}
		return nil
	}),
	NodeRevokeType: cmd(NodeRevokeType, func(s *State, _ uint64, r *NodeRevokeRequest) any {
		if r.ID == "" {
			return errorf(http.StatusBadRequest, "no node id")
		}
		if s.RevokedNodes == nil {
			s.RevokedNodes = map[string]time.Time{}
		}
		if _, ok := s.RevokedNodes[r.ID]; !ok {
			s.RevokedNodes[r.ID] = r.Now
		}
		return nil
	}),
	TokenRotateType: cmd(TokenRotateType, func(s *State, _ uint64, r *TokenRotateRequest) any {
		t, ok := s.Tokens[r.ID]
		switch {
		case !ok:
			return notFound("token", r.ID)
		case t.Kind == TokenBootstrap:
			return errorf(http.StatusBadRequest, "the bootstrap secret is not rotated: revoke it ('shoal token revoke bootstrap') once admin keys exist")
		case t.Revoked:
			return errorf(http.StatusConflict, "token %s is revoked", r.ID)
		case r.SecretHash == "":
			return errorf(http.StatusBadRequest, "no secret hash")
		}
		t.SecretHash = r.SecretHash
		now := r.Now
		t.RotatedAt = &now
		return nil
	}),
	ModelUpsertType: cmd(ModelUpsertType, func(s *State, _ uint64, r *ModelUpsertRequest) any {
		if r.Model.Name == "" {
			return errorf(http.StatusBadRequest, "model without a name")
		}
		m := r.Model
		if r.StatusOnly {
			if old := s.Models[m.Name]; old != nil && old.Status == r.FromStatus && old.CreatedAt.Equal(m.CreatedAt) {
				old.Status, old.Reason = m.Status, m.Reason
			}
			return nil // unloaded, or its status changed since: nothing to record
		}
		if _, known := s.Models[m.Name]; !known && len(s.Models) >= MaxModels {
			return errorf(http.StatusConflict, "the cluster holds %d models, limit %d: unload one first", len(s.Models), MaxModels)
		}
		// The copies are written by ModelHolderType only; they stay while
		// the file is the same.
		m.Holders = nil
		if old := s.Models[m.Name]; old != nil {
			for id, h := range old.Holders {
				if m.Digest == "" || h.Digest == m.Digest {
					if m.Holders == nil {
						m.Holders = map[string]*ModelHolder{}
					}
					m.Holders[id] = h
				}
			}
		}
		s.Models[m.Name] = &m
		return nil
	}),
	ModelHolderType: cmd(ModelHolderType, func(s *State, _ uint64, r *ModelHolderRequest) any {
		m, ok := s.Models[r.Model]
		if !ok {
			return notFound("model", r.Model)
		}
		h := r.Holder
		switch {
		case h.Node == "":
			return errorf(http.StatusBadRequest, "model holder without a node")
		case h.Node == m.SourceNode:
			return errorf(http.StatusBadRequest, "node %s is the source of model %s", h.Node, r.Model)
		case h.State == "":
			delete(m.Holders, h.Node)
			return nil
		case m.Digest == "" || h.Digest != m.Digest:
			return errorf(http.StatusConflict, "model %s's file is %.12s now, not %.12s", r.Model, m.Digest, h.Digest)
		}
		if _, known := m.Holders[h.Node]; !known && len(m.Holders) >= MaxHolders {
			return errorf(http.StatusConflict, "model %s has %d copies recorded, limit %d", r.Model, len(m.Holders), MaxHolders)
		}
		if m.Holders == nil {
			m.Holders = map[string]*ModelHolder{}
		}
		m.Holders[h.Node] = &h
		return nil
	}),
	ModelDeleteType: cmd(ModelDeleteType, func(s *State, _ uint64, r *ModelDeleteRequest) any {
		if _, ok := s.Models[r.Name]; !ok {
			return notFound("model", r.Name)
		}
		delete(s.Models, r.Name)
		delete(s.Plans, r.Name)
		delete(s.PlanInputs, r.Name)
		for k, sh := range s.Shards {
			if sh.Model == r.Name || sh.Model == DraftShardModel(r.Name) {
				delete(s.Shards, k)
			}
		}
		return nil
	}),
	PlanSetType: cmd(PlanSetType, func(s *State, _ uint64, r *PlanSetRequest) any {
		m, ok := s.Models[r.Plan.Model]
		if !ok {
			return notFound("model", r.Plan.Model)
		}
		if err := checkPlanOf(&r.Plan, m); err != nil {
			return errorf(http.StatusBadRequest, "invalid %s: model %s: %v", CommandName(PlanSetType), m.Name, err)
		}
		if old, ok := s.Plans[r.Plan.Model]; ok && r.Plan.Version <= old.Version {
			return errorf(http.StatusConflict, "plan version %d is not newer than %d", r.Plan.Version, old.Version)
		}
		p := r.Plan
		s.Plans[p.Model] = &p
		if s.PlanInputs == nil {
			s.PlanInputs = map[string]string{}
		}
		s.PlanInputs[p.Model] = r.Inputs
		return nil
	}),
	ShardStatusType: cmd(ShardStatusType, func(s *State, _ uint64, r *ShardStatusRequest) any {
		sh := r.Shard
		// Reports of a model the state does not hold would stay forever
		// (a model's delete removes its shards).
		if name, draft := strings.CutSuffix(sh.Model, DraftShardModel("")); draft {
			if m := s.Models[name]; m == nil || m.Draft == nil {
				return notFound("draft model of", name)
			}
		} else if _, ok := s.Models[sh.Model]; !ok {
			return notFound("model", sh.Model)
		}
		key := ShardKey(sh.Node, sh.Model)
		// A node sends its reports from more than one goroutine (a shard
		// starting, a load ending), so they can arrive out of order: one
		// older than the report held stays out (a stale "fetching" once
		// replaced the "no room" failure that came before it).
		if old := s.Shards[key]; old != nil && old.Node == sh.Node && sh.UpdatedAt.Before(old.UpdatedAt) {
			return nil
		}
		s.Shards[key] = &sh
		return nil
	}),
	LinkReportType: cmd(LinkReportType, func(s *State, _ uint64, r *LinkReportRequest) any {
		for _, l := range r.Links {
			if l.From == "" || l.To == "" || l.From == l.To {
				return errorf(http.StatusBadRequest, "link report needs two different nodes")
			}
		}
		// Each node's links to nodes it did not report before count
		// against MaxLinksPerNode: no node grows the state without end.
		added, seen := map[string]int{}, map[string]bool{}
		for _, l := range r.Links {
			k := l.From + ">" + l.To
			if _, ok := s.Links[k]; !ok && !seen[k] {
				seen[k] = true
				added[l.From]++
			}
		}
		if len(added) > 0 {
			have := map[string]int{}
			for _, l := range s.Links {
				if added[l.From] > 0 {
					have[l.From]++
				}
			}
			for from, n := range added {
				if have[from]+n > MaxLinksPerNode {
					return errorf(http.StatusConflict, "node %s would have %d links recorded, limit %d", from, have[from]+n, MaxLinksPerNode)
				}
			}
		}
		for _, l := range r.Links {
			l := l
			if s.Links == nil {
				s.Links = map[string]*LinkStat{}
			}
			s.Links[l.From+">"+l.To] = &l
		}
		return nil
	}),
}
