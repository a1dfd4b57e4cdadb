package hub

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Ref is a parsed hub reference.
type Ref struct {
	Repo  string // owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF
	Quant string // e.g. Q4_K_M ("" = choose)
	File  string // an explicit file path inside the repo ("" = choose)
}

// String gives the reference back in the form it was parsed from.
func (r Ref) String() string {
	switch {
	case r.File != "":
		return r.Repo + "/" + r.File
	case r.Quant != "":
		return r.Repo + ":" + r.Quant
	}
	return r.Repo
}

// ParseRef parses REPO, REPO:QUANT or REPO/FILE.gguf (the file may be in a
// subfolder: REPO/dir/FILE.gguf).
func ParseRef(s string) (Ref, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "hf.co/")
	s = strings.TrimPrefix(s, "huggingface.co/")
	var r Ref
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		r.Quant = s[i+1:]
		s = s[:i]
		if r.Quant == "" || strings.ContainsAny(r.Quant, "/ ") {
			return Ref{}, fmt.Errorf("bad reference %q: the quantization after ':' must be a name like Q4_K_M", s+":"+r.Quant)
		}
	}
	parts := strings.Split(s, "/")
	if len(parts) < 2 || parts[0] == "" || parts[1] == "" {
		return Ref{}, fmt.Errorf("bad reference %q: want OWNER/REPO, OWNER/REPO:QUANT or OWNER/REPO/FILE.gguf", s)
	}
	r.Repo = parts[0] + "/" + parts[1]
	if len(parts) > 2 {
		r.File = strings.Join(parts[2:], "/")
		if r.Quant != "" {
			return Ref{}, fmt.Errorf("bad reference %q: give a file or a quantization, not both", s)
		}
		if !strings.HasSuffix(strings.ToLower(r.File), ".gguf") {
			return Ref{}, fmt.Errorf("bad reference %q: the file %q is not a .gguf file", s, r.File)
		}
		for _, p := range parts[2:] {
			if p == "" || p == "." || p == ".." {
				return Ref{}, fmt.Errorf("bad reference %q: bad file path", s)
			}
		}
	}
	for _, p := range parts[:2] {
		if p == "." || p == ".." || strings.ContainsAny(p, " \\?#") {
			return Ref{}, fmt.Errorf("bad reference %q: bad repository name", s)
		}
	}
	return r, nil
}

// splitRE matches the parts of a split GGUF: NAME-00001-of-00003.gguf.
var splitRE = regexp.MustCompile(`(?i)^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// model is one loadable model in a repository: a single .gguf file or the
// ordered parts of a split one.
type model struct {
	parts []FileInfo
}

func (m model) first() string { return m.parts[0].Path }

// stem is the first part's base name without .gguf and the split suffix.
func (m model) stem() string {
	base := path.Base(m.first())
	if g := splitRE.FindStringSubmatch(base); g != nil {
		return g[1]
	}
	return strings.TrimSuffix(strings.TrimSuffix(base, ".gguf"), ".GGUF")
}

// models groups a repository's .gguf files into models, split parts joined
// in order. Incomplete split sets are errors only when selected, so they
// are kept with what is present and checked by complete.
func models(files []FileInfo) []model {
	type key struct{ dir, prefix, total string }
	groups := map[key][]FileInfo{}
	var out []model
	for _, f := range files {
		if !strings.HasSuffix(strings.ToLower(f.Path), ".gguf") {
			continue
		}
		base := path.Base(f.Path)
		if g := splitRE.FindStringSubmatch(base); g != nil {
			k := key{path.Dir(f.Path), g[1], g[3]}
			groups[k] = append(groups[k], f)
			continue
		}
		out = append(out, model{parts: []FileInfo{f}})
	}
	for _, parts := range groups {
		sort.Slice(parts, func(i, j int) bool { return splitIndex(parts[i].Path) < splitIndex(parts[j].Path) })
		out = append(out, model{parts: parts})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first() < out[j].first() })
	return out
}

func splitIndex(p string) int {
	g := splitRE.FindStringSubmatch(path.Base(p))
	if g == nil {
		return 0
	}
	n, _ := strconv.Atoi(g[2])
	return n
}

// complete checks that a split model has every part 1..N.
func (m model) complete() error {
	g := splitRE.FindStringSubmatch(path.Base(m.first()))
	if g == nil {
		return nil
	}
	total, _ := strconv.Atoi(g[3])
	if len(m.parts) != total {
		return fmt.Errorf("split model %s has %d of its %d parts in the repository", m.first(), len(m.parts), total)
	}
	for i, p := range m.parts {
		if splitIndex(p.Path) != i+1 {
			return fmt.Errorf("split model %s misses part %d of %d", m.first(), i+1, total)
		}
	}
	return nil
}

// matchesQuant reports whether the model's file name carries quant q
// (case-insensitive), bounded so that Q4_K does not match q4_k_m.
func (m model) matchesQuant(q string) bool {
	s, q := strings.ToLower(m.stem()), strings.ToLower(q)
	for i := 0; ; {
		j := strings.Index(s[i:], q)
		if j < 0 {
			return false
		}
		at := i + j
		end := at + len(q)
		before := at == 0 || strings.ContainsRune("-._", rune(s[at-1]))
		after := end == len(s) || strings.ContainsRune("-.", rune(s[end]))
		if before && after {
			return true
		}
		i = at + 1
	}
}

// quantOf guesses the quantization tag from a file stem: the text after
// its last '-' or '.' (qwen2.5-0.5b-instruct-q4_k_m → q4_k_m).
func quantOf(stem string) string {
	i := strings.LastIndexAny(stem, "-.")
	if i < 0 || i == len(stem)-1 {
		return ""
	}
	return strings.ToLower(stem[i+1:])
}

// choices lists the models of a repository for error messages.
func choices(ms []model) string {
	var b strings.Builder
	for _, m := range ms {
		b.WriteString("\n  ")
		b.WriteString(m.first())
		if len(m.parts) > 1 {
			fmt.Fprintf(&b, " (+%d parts)", len(m.parts)-1)
		}
		if q := quantOf(m.stem()); q != "" {
			b.WriteString("  → :" + strings.ToUpper(q))
		}
	}
	return b.String()
}

// selectModel picks the model the reference names from a repository's files.
func selectModel(r Ref, files []FileInfo) (model, error) {
	all := models(files)
	var cands []model
	for _, m := range all {
		if strings.HasPrefix(strings.ToLower(path.Base(m.first())), "mmproj") && r.File == "" {
			continue // vision projectors are not models on their own
		}
		cands = append(cands, m)
	}
	pick := func(m model) (model, error) { return m, m.complete() }
	switch {
	case r.File != "":
		for _, m := range all {
			for _, p := range m.parts {
				if p.Path == r.File {
					return pick(m)
				}
			}
		}
		return model{}, fmt.Errorf("%w: %s has no file %s; it has:%s", ErrNotFound, r.Repo, r.File, choices(cands))
	case r.Quant != "":
		var hit []model
		for _, m := range cands {
			if m.matchesQuant(r.Quant) {
				hit = append(hit, m)
			}
		}
		switch len(hit) {
		case 1:
			return pick(hit[0])
		case 0:
			return model{}, fmt.Errorf("%w: %s has no %s file; it has:%s", ErrNotFound, r.Repo, r.Quant, choices(cands))
		}
		return model{}, fmt.Errorf("%s:%s is ambiguous; name the file (%s/FILE.gguf), one of:%s", r.Repo, r.Quant, r.Repo, choices(hit))
	}
	if len(cands) == 0 {
		return model{}, fmt.Errorf("%w: %s has no .gguf files (shoal needs GGUF; look for a repository ending in -GGUF)", ErrNotFound, r.Repo)
	}
	var q4 []model
	for _, m := range cands {
		if m.matchesQuant("Q4_K_M") {
			q4 = append(q4, m)
		}
	}
	switch {
	case len(q4) == 1:
		return pick(q4[0])
	case len(q4) > 1:
		return model{}, fmt.Errorf("%s has several Q4_K_M models; name the file (%s/FILE.gguf), one of:%s", r.Repo, r.Repo, choices(q4))
	case len(cands) == 1:
		return pick(cands[0])
	}
	return model{}, fmt.Errorf("%s has several models and no Q4_K_M; choose one with %s:QUANT or %s/FILE.gguf:%s", r.Repo, r.Repo, r.Repo, choices(cands))
}

// defaultName derives a store name: the repository name without -GGUF,
// lowercased, and the quantization: qwen2.5-0.5b-instruct:q4_k_m.
func defaultName(r Ref, m model) string {
	base := r.Repo[strings.IndexByte(r.Repo, '/')+1:]
	lower := strings.ToLower(base)
	for _, suf := range []string{"-gguf", "_gguf", ".gguf"} {
		if strings.HasSuffix(lower, suf) {
			lower = lower[:len(lower)-len(suf)]
			break
		}
	}
	q := strings.ToLower(r.Quant)
	if q == "" {
		q = quantOf(m.stem())
	}
	if q == "" {
		q = "latest"
	}
	return lower + ":" + q
}
