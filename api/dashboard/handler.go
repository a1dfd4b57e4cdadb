package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// Options configure the dashboard.
type Options struct {
	// Recent supplies GET /dashboard/api/requests; nil answers an empty
	// list.
	Recent *Recent
	// CheckKey validates the API key of "Authorization: Bearer KEY" for
	// /dashboard/api/*: nil accepts any; an error refuses with 401, or
	// with its HTTPStatus() if it has one. The page and its assets need no
	// key (they hold no data).
	CheckKey func(ctx context.Context, key string) error
	// Node is this agent's name, in its traffic.
	Node string
	// Peers gives the other agents' traffic for GET
	// /dashboard/api/cluster-traffic (nil: this agent's alone).
	Peers Peers
}

// Handler serves the dashboard page at GET / and GET /dashboard/, the chat
// page at GET /dashboard/chat, their assets under /dashboard/, and the
// recent requests at GET /dashboard/api/requests. Mount it for "GET /{$}"
// and "/dashboard/".
func Handler(o Options) http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	assets := http.StripPrefix("/dashboard/", http.FileServerFS(sub))
	page := func(name string) http.HandlerFunc {
		body, err := fs.ReadFile(sub, name)
		if err != nil {
			panic(err)
		}
		return func(w http.ResponseWriter, r *http.Request) {
			secure(w.Header())
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			if r.Method == http.MethodHead {
				return
			}
			_, _ = w.Write(body)
		}
	}
	index, chat := page("index.html"), page("chat.html")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", index)
	mux.HandleFunc("GET /dashboard/{$}", index)
	mux.HandleFunc("GET /dashboard/chat", chat)
	mux.HandleFunc("GET /dashboard/chat.html", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/chat", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /dashboard/index.html", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /dashboard/api/requests", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r, o.CheckKey) {
			return
		}
		recs := []RequestRecord{}
		capacity := 0
		if o.Recent != nil {
			recs = o.Recent.Records()
			capacity = len(o.Recent.buf)
		}
		writeJSON(w, http.StatusOK, struct {
			Capacity int             `json:"capacity"`
			Requests []RequestRecord `json:"requests"`
		}{capacity, recs})
	})
	local := func() NodeTraffic {
		nt := NodeTraffic{Node: o.Node, Models: []ModelTraffic{}}
		if o.Recent != nil {
			nt.Models = o.Recent.Traffic()
		}
		return nt
	}
	mux.HandleFunc("GET /dashboard/api/traffic", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r, o.CheckKey) {
			return
		}
		writeJSON(w, http.StatusOK, local())
	})
	mux.HandleFunc("GET /dashboard/api/cluster-traffic", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r, o.CheckKey) {
			return
		}
		nodes := []NodeTraffic{local()}
		var missing []string
		if o.Peers != nil {
			got, miss := o.Peers(r.Context())
			nodes, missing = append(nodes, got...), miss
		}
		out := Sum(nodes)
		out.Missing = missing
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("/dashboard/api/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{"no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	mux.HandleFunc("/dashboard/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		secure(w.Header())
		w.Header().Set("Cache-Control", "no-cache")
		assets.ServeHTTP(w, r)
	})
	return mux
}

// secure sets the headers that keep the page to its own origin.
func secure(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

type apiError struct {
	Error string `json:"error"`
}

func authorized(w http.ResponseWriter, r *http.Request, check func(context.Context, string) error) bool {
	if check == nil {
		return true
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		writeJSON(w, http.StatusUnauthorized, apiError{"missing API key: send Authorization: Bearer <key>"})
		return false
	}
	err := check(r.Context(), key)
	if err == nil {
		return true
	}
	code := http.StatusUnauthorized
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) && hs.HTTPStatus() >= 400 {
		code = hs.HTTPStatus()
	}
	writeJSON(w, code, apiError{err.Error()})
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
