package openai

import "net/http"

// entry is a model as /v1/models lists it.
func (h *handler) entry(m *Model) ModelEntry {
	e := ModelEntry{ID: m.Name, Object: "model", OwnedBy: m.OwnedBy, ChatTemplate: h.templateState(m)}
	if e.OwnedBy == "" {
		e.OwnedBy = "shoal"
	}
	if !m.Created.IsZero() {
		e.Created = m.Created.Unix()
	}
	if m.Submitter != nil {
		e.ContextLen = m.Submitter.Capacity()
	}
	return e
}

func (h *handler) models(x *exchange) *apiError {
	list := ModelList{Object: "list", Data: []ModelEntry{}}
	for _, m := range h.b.Models() {
		if x.allowed(m.Name) {
			list.Data = append(list.Data, h.entry(m))
		}
	}
	x.ok(list)
	return nil
}

func (h *handler) model(x *exchange) *apiError {
	id := x.r.PathValue("id")
	x.rec.Model = id
	m, ok := h.b.Model(id)
	if !ok || !x.allowed(id) {
		return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: "The model `" + id + "` does not exist."}
	}
	x.ok(h.entry(m))
	return nil
}
