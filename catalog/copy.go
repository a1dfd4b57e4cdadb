package catalog

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/placement"
	"shoal/shard"
)

// copyFile copies m's file from the first of from that serves it whole,
// verifies it against the manifest the state names and the file's digest,
// and registers it; it reports the copy's state as it goes.
func (r *replicator) copyFile(ctx context.Context, m coordinator.Model, from []*coordinator.Node, index uint64) error {
	h := coordinator.ModelHolder{Node: r.id, Digest: m.Digest, State: coordinator.HolderCopying}
	r.reportNow(m.Name, h)
	t0 := time.Now()
	src, err := r.copyFrom(ctx, m, from, index)
	if ctx.Err() != nil {
		return ctx.Err() // unloaded or stopping: nothing to report
	}
	if err != nil {
		r.log.Warn("copying a model file failed", zap.String("model", m.Name), zap.Error(err))
		h.State, h.Error = coordinator.HolderFailed, err.Error()
		r.reportNow(m.Name, h)
		return err
	}
	r.log.Info("copied a model file", zap.String("model", m.Name), zap.String("from", src),
		zap.String("bytes", placement.GiB(m.Bytes)), zap.Duration("took", time.Since(t0)))
	h.State = coordinator.HolderReady
	r.reportNow(m.Name, h)
	return nil
}

// copyFrom tries each node of from in turn; it returns the name of the
// one the verified copy came from.
func (r *replicator) copyFrom(ctx context.Context, m coordinator.Model, from []*coordinator.Node, index uint64) (string, error) {
	var errs []string
	for _, n := range from {
		err := r.copyOne(ctx, m, n, index)
		if err == nil {
			return n.Name, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		errs = append(errs, fmt.Sprintf("from %s: %v", n.Name, err))
	}
	return "", fmt.Errorf("%s", strings.Join(errs, "; "))
}

func (r *replicator) copyOne(ctx context.Context, m coordinator.Model, n *coordinator.Node, index uint64) error {
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	raw, held, err := r.net.Holdings(hctx, n.RPCAddr, m.Digest)
	cancel()
	if err != nil {
		return err
	}
	if raw == nil {
		return fmt.Errorf("no manifest of the file")
	}
	man, err := shard.ParseManifest(raw, m.Manifest, m.Digest)
	if err != nil {
		return err
	}
	size := int64(m.Bytes)
	if len(held) != 1 || held[0].Off != 0 || held[0].N != size {
		return fmt.Errorf("it does not hold the whole file")
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return err
	}
	final := filepath.Join(r.dir, m.Digest+".gguf")
	tmp := final + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			_ = os.Remove(tmp)
		}
	}()
	v := shard.NewFileVerifier(man)
	w := io.MultiWriter(f, v)
	fetch := r.net.Ranges(n.RPCAddr)
	for off := int64(0); off < size; off += replicaChunk {
		k := min(int64(replicaChunk), size-off)
		rc, err := fetch.Fetch(ctx, m.Digest, off, k)
		if err != nil {
			return err
		}
		got, err := io.Copy(w, io.LimitReader(rc, k))
		rc.Close()
		if err == nil && got != k {
			err = fmt.Errorf("bytes [%d,+%d): got %d", off, k, got)
		}
		if err != nil {
			return err
		}
	}
	if err := v.Check(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	ok = true
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	st, err := os.Stat(final)
	if err == nil {
		err = r.reg.saveManifest(m.Digest, raw)
	}
	if err == nil {
		err = r.reg.addReplica(m.Digest, final, st, index)
	}
	if err != nil {
		_ = os.Remove(final)
		return err
	}
	return nil
}
