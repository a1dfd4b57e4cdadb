package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultEndpoint is the hub used when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

var (
	// ErrGated: the repository is gated or private and the token (if any)
	// does not grant access.
	ErrGated = errors.New("gated or private repository")
	// ErrNotFound: no such repository, revision or file.
	ErrNotFound = errors.New("no such repo or file")
	// ErrChecksum: a downloaded file's sha256 is not the hub's.
	ErrChecksum = errors.New("sha256 mismatch")
	// ErrNotInStore: --offline and the model is not in the store.
	ErrNotInStore = errors.New("not in the model store")
)

// FileInfo is one file of a repository as the hub's tree lists it.
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"` // the LFS oid; "" for files not in LFS
}

// Client speaks the hub's HTTP API: the tree listing and resolve downloads.
type Client struct {
	Endpoint    string        // base URL, e.g. https://huggingface.co
	Token       string        // sent as Authorization: Bearer to Endpoint's host only
	HTTP        *http.Client  // nil: a client that keeps the token off other hosts
	MaxAttempts int           // per file, for cut connections and 5xx (0 = 6)
	Backoff     time.Duration // first retry delay, doubled each time (0 = 500ms)
	UserAgent   string
}

// NewClient returns a client configured from the environment: HF_ENDPOINT,
// HF_TOKEN (or HUGGING_FACE_HUB_TOKEN).
func NewClient() *Client {
	c := &Client{Endpoint: os.Getenv("HF_ENDPOINT"), Token: os.Getenv("HF_TOKEN")}
	if c.Token == "" {
		c.Token = os.Getenv("HUGGING_FACE_HUB_TOKEN")
	}
	return c
}

// BaseURL is the hub the client asks: Endpoint, else DefaultEndpoint.
func (c *Client) BaseURL() string { return c.base() }

func (c *Client) base() string {
	if c.Endpoint == "" {
		return DefaultEndpoint
	}
	return strings.TrimRight(c.Endpoint, "/")
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	baseHost := ""
	if u, err := url.Parse(c.base()); err == nil {
		baseHost = u.Host
	}
	return &http.Client{CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		// Go keeps Authorization on redirects to subdomains
		// (cdn-lfs.huggingface.co); the CDN URLs are signed, so the token
		// goes to the hub's own host only.
		if req.URL.Host != baseHost {
			req.Header.Del("Authorization")
		}
		return nil
	}}
}

func (c *Client) newRequest(ctx context.Context, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	ua := c.UserAgent
	if ua == "" {
		ua = "shoal"
	}
	req.Header.Set("User-Agent", ua)
	return req, nil
}

// escapePath escapes each segment of a slash-separated path.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// statusError turns a failed hub answer into an error that says what to do.
func (c *Client) statusError(resp *http.Response, repo, what string) error {
	code := resp.Header.Get("X-Error-Code")
	msg := resp.Header.Get("X-Error-Message")
	detail := ""
	if code != "" || msg != "" {
		detail = " (" + strings.Trim(code+": "+msg, ": ") + ")"
	}
	page := c.base() + "/" + repo
	switch {
	case code == "RepoNotFound" || code == "EntryNotFound" || code == "RevisionNotFound" || resp.StatusCode == http.StatusNotFound:
		hint := ""
		if resp.StatusCode == http.StatusUnauthorized && c.Token == "" {
			// The hub answers 401 for private repositories too.
			hint = "; if it is private, set HF_TOKEN to an access token that can read it"
		}
		return fmt.Errorf("%w: %s (HTTP %d for %s%s)%s", ErrNotFound, repo, resp.StatusCode, what, detail, hint)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		tok := "set HF_TOKEN to an access token with read permission (" + DefaultEndpoint + "/settings/tokens)"
		if c.Token != "" {
			tok = "check that the HF_TOKEN in use belongs to the account that accepted it and can read gated repositories"
		}
		return fmt.Errorf("%w: %s answered HTTP %d for %s%s; accept the license on %s while logged in, then %s",
			ErrGated, repo, resp.StatusCode, what, detail, page, tok)
	}
	return &retryableError{fmt.Errorf("hub answered HTTP %d for %s%s", resp.StatusCode, what, detail)}
}

// retryableError marks a failure worth another attempt (5xx, 429, cut
// connections).
type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

type treeEntry struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// ListFiles lists every file of repo at revision ("" = main), recursively,
// with sizes and LFS sha256, following the hub's Link: rel="next" pages.
func (c *Client) ListFiles(ctx context.Context, repo, revision string) ([]FileInfo, error) {
	if revision == "" {
		revision = "main"
	}
	next := fmt.Sprintf("%s/api/models/%s/tree/%s?recursive=true", c.base(), escapePath(repo), url.PathEscape(revision))
	var files []FileInfo
	for page := 0; next != "" && page < 1000; page++ {
		req, err := c.newRequest(ctx, next)
		if err != nil {
			return nil, err
		}
		resp, err := c.httpClient().Do(req)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", repo, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, c.statusError(resp, repo, "the file list at revision "+revision)
		}
		var entries []treeEntry
		err = json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&entries)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("listing %s: bad answer from the hub: %w", repo, err)
		}
		for _, e := range entries {
			if e.Type != "file" {
				continue
			}
			f := FileInfo{Path: e.Path, Size: e.Size}
			if e.LFS != nil {
				f.SHA256 = strings.ToLower(e.LFS.OID)
				if e.LFS.Size > 0 {
					f.Size = e.LFS.Size
				}
			}
			files = append(files, f)
		}
		next = nextLink(resp.Header.Get("Link"), resp.Request.URL)
	}
	return files, nil
}

// nextLink finds the rel="next" URL of a Link header.
func nextLink(h string, base *url.URL) string {
	for _, part := range strings.Split(h, ",") {
		target, params, ok := strings.Cut(part, ";")
		if !ok || !strings.Contains(strings.ReplaceAll(params, " ", ""), `rel="next"`) {
			continue
		}
		target = strings.Trim(strings.TrimSpace(target), "<>")
		u, err := base.Parse(target)
		if err != nil {
			return ""
		}
		return u.String()
	}
	return ""
}

// resolveURL is where a file's bytes are fetched from.
func (c *Client) resolveURL(repo, revision, file string) string {
	if revision == "" {
		revision = "main"
	}
	return fmt.Sprintf("%s/%s/resolve/%s/%s", c.base(), escapePath(repo), url.PathEscape(revision), escapePath(file))
}
