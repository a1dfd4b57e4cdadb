package hubtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is a fake hub. Its URL is what HF_ENDPOINT (or Client.Endpoint)
// should be.
type Server struct {
	*httptest.Server                  // the hub: /api/models/... and /.../resolve/...
	CDN              *httptest.Server // where resolve redirects when CrossHost

	mu        sync.Mutex
	repos     map[string]*Repo
	crossHost bool
	ignoreRng bool
	delay     time.Duration // before each download answers
	holds     []hold        // downloads that wait for a release
	pageSize  int
	served    map[string]int64 // "repo/path" → bytes
	requests  []Request
	// inflight counts download handlers not yet returned: a client can
	// read a whole body before the handler's Write returns and records
	// it, so the accessors wait for them (bounded) first.
	inflight int
}

// Repo is one repository of the fake hub.
type Repo struct {
	Name  string
	Files map[string][]byte
	// Gated, if non-zero (401 or 403), is the status answered to requests
	// without "Authorization: Bearer <Token>".
	Gated int
	Token string
	// WrongSHA lists files whose tree entry carries a wrong sha256.
	WrongSHA map[string]bool
	// cut: file → bytes after which the next download of it is cut once.
	cut map[string]int64
	// flip: file → offsets whose byte is served inverted (the tree keeps
	// the true sha256), to the requests when matches.
	flip map[string][]flip
}

type flip struct {
	off  int64
	when func(*http.Request) bool // nil: every request
}

// Request is one download request the fake served.
type Request struct {
	Repo, Path string
	Range      string // the Range header asked for
	Status     int
	Bytes      int64 // body bytes written
	Auth       bool  // carried an Authorization header
	Host       string
	UserAgent  string // who asked: per-client accounting
}

// New starts a fake hub (and its CDN) closed at the end of the test.
// Resolve redirects to the CDN server (a second host) by default.
func New(t testing.TB) *Server {
	s := &Server{repos: map[string]*Repo{}, served: map[string]int64{}, crossHost: true}
	h := http.HandlerFunc(s.route)
	s.Server = httptest.NewServer(h)
	s.CDN = httptest.NewServer(h)
	t.Cleanup(func() { s.Server.Close(); s.CDN.Close() })
	return s
}

// AddRepo adds (or replaces) a repository with files (path → contents).
func (s *Server) AddRepo(name string, files map[string][]byte) *Repo {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &Repo{Name: name, Files: files, WrongSHA: map[string]bool{}, cut: map[string]int64{}, flip: map[string][]flip{}}
	s.repos[name] = r
	return r
}

// Gate makes repo answer status (401 or 403, with X-Error-Code GatedRepo)
// unless the request carries "Bearer token".
func (s *Server) Gate(repo string, status int, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repo].Gated, s.repos[repo].Token = status, token
}

// WrongSHA makes the tree list a wrong sha256 for repo's file.
func (s *Server) WrongSHA(repo, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repo].WrongSHA[path] = true
}

// CutOnce makes the next download of repo's file stop after n body bytes
// by closing the connection.
func (s *Server) CutOnce(repo, path string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repo].cut[path] = n
}

// Corrupt makes the CDN serve repo's file with the byte at off inverted
// (the tree still lists the true sha256), until Repair.
func (s *Server) Corrupt(repo, path string, off int64) { s.CorruptWhen(repo, path, off, nil) }

// CorruptWhen is Corrupt for the requests when reports true of (nil: all).
func (s *Server) CorruptWhen(repo, path string, off int64, when func(*http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repo].flip[path] = append(s.repos[repo].flip[path], flip{off, when})
}

// Repair undoes Corrupt for repo's file.
func (s *Server) Repair(repo, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.repos[repo].flip, path)
}

// CrossHost chooses whether resolve redirects to the CDN server (true, the
// default) or to a path on the hub itself.
func (s *Server) CrossHost(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.crossHost = on
}

// IgnoreRange makes the CDN answer 200 with the whole file to Range requests.
func (s *Server) IgnoreRange(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignoreRng = on
}

// PageSize makes the tree listing paginate (Link: rel="next") by n entries.
func (s *Server) PageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// hold makes the downloads when matches wait until released is closed.
type hold struct {
	when     func(*http.Request) bool
	released chan struct{}
}

// Hold makes every download for which when is true wait, before it
// answers, until release is called (or its client gives up): what nodes
// fetch stays in flight while a test changes the cluster around them.
func (s *Server) Hold(when func(*http.Request) bool) (release func()) {
	h := hold{when: when, released: make(chan struct{})}
	s.mu.Lock()
	s.holds = append(s.holds, h)
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(h.released) }) }
}

// Delay makes every download wait d before it answers (a slow hub).
func (s *Server) Delay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// BytesServed is the body bytes sent for repo's file over all requests.
func (s *Server) BytesServed(repo, path string) int64 {
	s.settle()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served[repo+"/"+path]
}

// TotalBytesServed is the body bytes of all file downloads.
func (s *Server) TotalBytesServed() int64 {
	s.settle()
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, b := range s.served {
		n += b
	}
	return n
}

// Requests lists the download requests served so far (resolve redirects
// and CDN answers).
func (s *Server) Requests() []Request {
	s.settle()
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// settle waits, at most 2 s, until no download handler is between
// writing its body and recording it.
func (s *Server) settle() {
	deadline := time.Now().Add(2 * time.Second)
	for {
		s.mu.Lock()
		n := s.inflight
		s.mu.Unlock()
		if n == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// SHA256 is the hex sha256 of b.
func SHA256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// route dispatches the three kinds of path (ServeMux patterns for them
// overlap):
//
//	/api/models/{owner}/{name}/tree/{rev}
//	/{owner}/{name}/resolve/{rev}/{path...}
//	/cdn/{owner}/{name}/{path...}
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	seg := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch {
	case len(seg) == 6 && seg[0] == "api" && seg[1] == "models" && seg[4] == "tree":
		r.SetPathValue("owner", seg[2])
		r.SetPathValue("name", seg[3])
		r.SetPathValue("rev", seg[5])
		s.tree(w, r)
	case len(seg) >= 4 && seg[0] == "cdn":
		r.SetPathValue("owner", seg[1])
		r.SetPathValue("name", seg[2])
		r.SetPathValue("path", strings.Join(seg[3:], "/"))
		s.blob(w, r)
	case len(seg) >= 5 && seg[2] == "resolve":
		r.SetPathValue("owner", seg[0])
		r.SetPathValue("name", seg[1])
		r.SetPathValue("rev", seg[3])
		r.SetPathValue("path", strings.Join(seg[4:], "/"))
		s.resolve(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) repo(w http.ResponseWriter, r *http.Request) *Repo {
	name := r.PathValue("owner") + "/" + r.PathValue("name")
	s.mu.Lock()
	repo := s.repos[name]
	s.mu.Unlock()
	if repo == nil {
		w.Header().Set("X-Error-Code", "RepoNotFound")
		w.Header().Set("X-Error-Message", "Repository not found")
		http.Error(w, "Repository not found", http.StatusNotFound)
		return nil
	}
	if repo.Gated != 0 && r.Header.Get("Authorization") != "Bearer "+repo.Token {
		w.Header().Set("X-Error-Code", "GatedRepo")
		w.Header().Set("X-Error-Message", "Access to model "+name+" is restricted. You must have access to it and be authenticated to access it.")
		http.Error(w, "gated", repo.Gated)
		return nil
	}
	if rev := r.PathValue("rev"); rev != "" && rev != "main" {
		w.Header().Set("X-Error-Code", "RevisionNotFound")
		http.Error(w, "Invalid rev id: "+rev, http.StatusNotFound)
		return nil
	}
	return repo
}

type lfs struct {
	OID         string `json:"oid"`
	Size        int64  `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

type entry struct {
	Type string `json:"type"`
	OID  string `json:"oid"`
	Size int64  `json:"size"`
	Path string `json:"path"`
	LFS  *lfs   `json:"lfs,omitempty"`
}

func (s *Server) tree(w http.ResponseWriter, r *http.Request) {
	repo := s.repo(w, r)
	if repo == nil {
		return
	}
	s.mu.Lock()
	var entries []entry
	dirs := map[string]bool{}
	for p, b := range repo.Files {
		for d := p; strings.Contains(d, "/"); {
			d = d[:strings.LastIndexByte(d, '/')]
			if !dirs[d] {
				dirs[d] = true
				entries = append(entries, entry{Type: "directory", OID: SHA256([]byte(d))[:40], Path: d})
			}
		}
		e := entry{Type: "file", OID: SHA256(b)[:40], Size: int64(len(b)), Path: p}
		if strings.HasSuffix(p, ".gguf") {
			sha := SHA256(b)
			if repo.WrongSHA[p] {
				sha = SHA256(append([]byte("wrong"), b...))
			}
			e.LFS = &lfs{OID: sha, Size: int64(len(b)), PointerSize: 134}
		}
		entries = append(entries, e)
	}
	page := s.pageSize
	s.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	if page > 0 {
		start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		end := min(start+page, len(entries))
		if end < len(entries) {
			q := r.URL.Query()
			q.Set("cursor", strconv.Itoa(end))
			w.Header().Set("Link", fmt.Sprintf(`<%s?%s>; rel="next"`, r.URL.Path, q.Encode()))
		}
		entries = entries[min(start, len(entries)):end]
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(entries)
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	repo := s.repo(w, r)
	if repo == nil {
		return
	}
	p := r.PathValue("path")
	s.mu.Lock()
	_, ok := repo.Files[p]
	base := s.Server.URL
	if s.crossHost {
		base = s.CDN.URL
	}
	s.requests = append(s.requests, Request{Repo: repo.Name, Path: p, Range: r.Header.Get("Range"), Status: http.StatusFound, Auth: r.Header.Get("Authorization") != "", Host: r.Host})
	s.mu.Unlock()
	if !ok {
		w.Header().Set("X-Error-Code", "EntryNotFound")
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	http.Redirect(w, r, base+"/cdn/"+repo.Name+"/"+p+"?X-Amz-Signature=fake", http.StatusFound)
}

// blob serves a file's bytes like the CDN: Range, and the one-shot cut.
func (s *Server) blob(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("owner") + "/" + r.PathValue("name")
	p := r.PathValue("path")
	s.mu.Lock()
	s.inflight++
	repo := s.repos[name]
	var b []byte
	ok := false
	if repo != nil {
		b, ok = repo.Files[p]
	}
	cut, cutting := int64(-1), false
	if ok {
		if n, c := repo.cut[p]; c {
			cut, cutting = n, true
			delete(repo.cut, p)
		}
	}
	ignore, delay := s.ignoreRng, s.delay
	var wait []chan struct{}
	for _, h := range s.holds {
		if h.when(r) {
			wait = append(wait, h.released)
		}
	}
	if ok && len(repo.flip[p]) > 0 {
		b = append([]byte(nil), b...)
		for _, f := range repo.flip[p] {
			if f.off >= 0 && f.off < int64(len(b)) && (f.when == nil || f.when(r)) {
				b[f.off] ^= 0xff
			}
		}
	}
	s.mu.Unlock()
	time.Sleep(delay)
	for _, c := range wait {
		select {
		case <-c:
		case <-r.Context().Done():
		}
	}
	req := Request{Repo: name, Path: p, Range: r.Header.Get("Range"), Auth: r.Header.Get("Authorization") != "", Host: r.Host, UserAgent: r.Header.Get("User-Agent")}
	defer func() {
		s.mu.Lock()
		s.served[name+"/"+p] += req.Bytes
		s.requests = append(s.requests, req)
		s.inflight--
		s.mu.Unlock()
	}()
	if !ok {
		req.Status = http.StatusNotFound
		http.Error(w, "NoSuchKey", http.StatusNotFound)
		return
	}
	start, end := int64(0), int64(len(b))
	req.Status = http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" && !ignore {
		from, to, ok := parseRange(rg)
		if ok && to >= 0 {
			end = min(end, to+1)
		}
		if !ok || from >= int64(len(b)) || from >= end {
			req.Status = http.StatusRequestedRangeNotSatisfiable
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(b)))
			w.WriteHeader(req.Status)
			return
		}
		start = from
		req.Status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, len(b)))
	}
	w.Header().Set("Content-Length", strconv.FormatInt(end-start, 10))
	w.Header().Set("Accept-Ranges", "bytes")
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(req.Status)
	body := b[start:end]
	if cutting && cut < int64(len(body)) {
		n, _ := w.Write(body[:cut])
		req.Bytes = int64(n)
		w.(http.Flusher).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	n, _ := w.Write(body)
	req.Bytes = int64(n)
}

// parseRange reads "bytes=N-" (to = -1) or "bytes=N-M" (the forms the
// client sends).
func parseRange(v string) (from, to int64, ok bool) {
	v, ok = strings.CutPrefix(v, "bytes=")
	if !ok {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(v, "-")
	if !ok {
		return 0, 0, false
	}
	n, err := strconv.ParseInt(a, 10, 64)
	if err != nil || n < 0 {
		return 0, 0, false
	}
	if b == "" {
		return n, -1, true
	}
	m, err := strconv.ParseInt(b, 10, 64)
	if err != nil || m < n {
		return 0, 0, false
	}
	return n, m, true
}
