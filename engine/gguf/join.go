package gguf

import (
	"fmt"
	"io"
	"strings"
)

// Split GGUF: a model published as NAME-00001-of-0000N.gguf, ... carries
// split.no (0-based), split.count and split.tensors.count in every part;
// the first part holds the model's metadata, every part a run of its
// tensors with their data.

// Split reads a file's split metadata: its 0-based index, the number of
// parts and the model's tensor count; ok is false for a file that is not
// a part of a split model.
func Split(f *File) (no, count, tensors int, ok bool) {
	c, ok := f.Int("split.count")
	if !ok {
		return 0, 0, 0, false
	}
	n, _ := f.Int("split.no")
	t, _ := f.Int("split.tensors.count")
	return int(n), int(c), int(t), true
}

// Join writes the parts of a split model, given in order, as one GGUF
// file: the first part's metadata without the split.* keys, then every
// part's tensors in order, their data copied. It checks that the parts are
// the model's (numbered 0..count-1 with the same count and tensor count,
// every tensor once) before it writes anything.
func Join(paths []string, w io.Writer) error {
	files := make([]*File, 0, len(paths))
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	seen := map[string]string{}
	total := 0
	var count, tensors int
	for i, p := range paths {
		f, err := Open(p)
		if err != nil {
			return err
		}
		files = append(files, f)
		no, c, t, ok := Split(f)
		switch {
		case !ok:
			return fmt.Errorf("gguf: join: %s has no split.count: not a part of a split model", p)
		case i == 0:
			count, tensors = c, t
			if c != len(paths) {
				return fmt.Errorf("gguf: join: the model has %d parts (split.count), %d were given", c, len(paths))
			}
		case c != count || t != tensors:
			return fmt.Errorf("gguf: join: %s says %d parts and %d tensors, the first part %d and %d: parts of different models", p, c, t, count, tensors)
		}
		if no != i {
			return fmt.Errorf("gguf: join: %s is part %d (split.no, from 0), expected part %d: give the parts in order", p, no, i)
		}
		for _, ti := range f.Tensors {
			if prev, dup := seen[ti.Name]; dup {
				return fmt.Errorf("gguf: join: tensor %q is in %s and in %s", ti.Name, prev, p)
			}
			seen[ti.Name] = p
		}
		total += len(f.Tensors)
	}
	if total != tensors {
		return fmt.Errorf("gguf: join: the parts hold %d tensors, split.tensors.count says %d", total, tensors)
	}
	out := NewWriter(w)
	for _, kv := range files[0].KVs {
		if strings.HasPrefix(kv.Key, "split.") {
			continue
		}
		if err := out.AddKV(kv.Key, kv.Value); err != nil {
			return fmt.Errorf("gguf: join: %w", err)
		}
	}
	for _, f := range files {
		for _, ti := range f.Tensors {
			if err := out.AddTensor(ti.Name, ti.Type, ti.Dims...); err != nil {
				return fmt.Errorf("gguf: join: %w", err)
			}
		}
	}
	for _, f := range files {
		for i := range f.Tensors {
			ti := &f.Tensors[i]
			if err := out.WriteTensor(ti.Name, f.Data(ti)); err != nil {
				return fmt.Errorf("gguf: join: %w", err)
			}
			f.Release(f.Data(ti))
		}
	}
	return out.Close()
}
