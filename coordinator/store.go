package coordinator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	stdlog "log"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

// The Raft log and stable store live in raft/wal below the data dir
// (hashicorp/raft-wal: append-only segment files and a small bbolt file of
// metadata and stable values). Before it, shoal kept them in raft/raft.db
// with hashicorp/raft-boltdb on boltdb v1, which trips the race detector's
// pointer checks; such a file is migrated once on start and then set aside
// as raft.db.migrated.
const (
	walDirName      = "wal"
	boltV1FileName  = "raft.db"
	migratedSuffix  = ".migrated"
	migratingSuffix = ".migrating"

	// The cluster log holds small records (nodes, models, plans, tokens);
	// raft-wal's default 64 MiB segments would preallocate 64 MiB on every
	// server for a few kilobytes. A larger entry still fits: it seals the
	// segment it is written to.
	walSegmentSize = 8 << 20

	// A batch of log entries copied per append during a migration.
	migrateBatch = 256
)

// The buckets and keys of the raft-boltdb file, and which stable keys hold
// a big-endian uint64 there (raft-wal keeps them little-endian behind
// SetUint64, so they are converted, not copied).
var (
	boltLogsBucket = []byte("logs")
	boltConfBucket = []byte("conf")
	uint64Keys     = map[string]bool{"CurrentTerm": true, "LastVoteTerm": true}

	// How long opening an old store waits for its file lock (a variable for
	// tests).
	storeLockTimeout = 5 * time.Second
)

// capnslog, which raft-wal imports through etcd's fileutil, takes the
// standard log package over when it initializes (no flags, its own format,
// journald under systemd). Packages initialize after what they import, so
// this gives the standard logger its defaults back: what libraries write
// there (net/http, quic-go) looks as it did before raft-wal.
func init() {
	stdlog.SetOutput(os.Stderr)
	stdlog.SetFlags(stdlog.LstdFlags)
	stdlog.SetPrefix("")
}

// openStore opens (or creates) the Raft log and stable store in dir, the
// data dir's raft folder, first migrating a raft.db left by an earlier shoal.
func openStore(dir string, hl hclog.Logger, log *zap.Logger) (*wal.WAL, error) {
	walDir := filepath.Join(dir, walDirName)
	old := filepath.Join(dir, boltV1FileName)
	switch _, err := os.Stat(old); {
	case err == nil:
		if err := migrateBoltV1(old, walDir, hl, log); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("raft store: %w", err)
	}
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return nil, fmt.Errorf("raft store: %w", err)
	}
	return openWAL(walDir, hl)
}

func openWAL(dir string, hl hclog.Logger) (*wal.WAL, error) {
	w, err := wal.Open(dir, wal.WithLogger(hl.Named("wal")), wal.WithSegmentSize(walSegmentSize))
	if err != nil {
		return nil, fmt.Errorf("raft store %s: %w", dir, err)
	}
	return w, nil
}

// migrateBoltV1 copies the log and stable values of the raft-boltdb file old
// into a new WAL at walDir, then sets old aside. The WAL is built beside its
// final place and renamed into it only once complete, so an interrupted
// migration is redone from the start on the next start, and a WAL that
// exists beside old is complete.
func migrateBoltV1(old, walDir string, hl hclog.Logger, log *zap.Logger) error {
	if _, err := os.Stat(walDir); err == nil {
		log.Warn("the Raft store was migrated before but the old file is still there; setting it aside",
			zap.String("old", old), zap.String("store", walDir))
		return setAside(old)
	}
	tmp := walDir + migratingSuffix
	if err := os.RemoveAll(tmp); err != nil { // left by an interrupted migration
		return migrationError(old, walDir, err)
	}
	n, err := copyBoltV1(old, tmp, hl)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return migrationError(old, walDir, err)
	}
	if err := os.Rename(tmp, walDir); err != nil {
		_ = os.RemoveAll(tmp)
		return migrationError(old, walDir, err)
	}
	if err := syncDir(filepath.Dir(walDir)); err != nil {
		return migrationError(old, walDir, err)
	}
	if err := setAside(old); err != nil {
		return err
	}
	log.Warn("migrated the Raft store from raft-boltdb to raft-wal; the old file can be deleted",
		zap.String("store", walDir), zap.Int("entries", n), zap.String("old", old+migratedSuffix))
	return nil
}

// migrationError says what failed and what the operator can do: nothing was
// changed, so a retry after fixing the cause is safe.
func migrationError(old, walDir string, err error) error {
	if errors.Is(err, bolterrors.ErrTimeout) {
		err = fmt.Errorf("%s is locked by another process (is another agent running on this data dir?)", old)
	}
	raftDir := filepath.Dir(old)
	return fmt.Errorf("raft store: cannot migrate %s (written by an earlier shoal) to %s: %w. "+
		"Nothing was changed and the agent did not start. Fix the cause and start it again; "+
		"or, to rejoin the cluster without this server's Raft data, stop the agent, move %s aside and start it again: "+
		"the leader adds the server back and sends it the cluster state "+
		"(do not do this on the only server of a cluster: it would start a new, empty cluster)",
		old, walDir, err, raftDir)
}

// copyBoltV1 writes every log entry and stable value of the file old into a
// new WAL in dir and returns how many log entries it copied. bbolt reads the
// file format of boltdb v1; the entries are msgpack-encoded raft.Logs, which
// go-msgpack v2 decodes whichever time format they were written with.
func copyBoltV1(old, dir string, hl hclog.Logger) (n int, err error) {
	db, err := bbolt.Open(old, 0o600, &bbolt.Options{ReadOnly: true, Timeout: storeLockTimeout})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	w, err := openWAL(dir, hl)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := w.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	err = db.View(func(tx *bbolt.Tx) error {
		if n, err = copyLogs(tx.Bucket(boltLogsBucket), w); err != nil {
			return err
		}
		return copyStable(tx.Bucket(boltConfBucket), w)
	})
	return n, err
}

func copyLogs(b *bbolt.Bucket, w *wal.WAL) (int, error) {
	if b == nil {
		return 0, nil
	}
	n := 0
	batch := make([]*raft.Log, 0, migrateBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := w.StoreLogs(batch)
		batch = batch[:0]
		return err
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return n, fmt.Errorf("log key %x is not an 8-byte index", k)
		}
		l := new(raft.Log)
		if err := codec.NewDecoderBytes(v, &codec.MsgpackHandle{}).Decode(l); err != nil {
			return n, fmt.Errorf("log entry %d: %w", binary.BigEndian.Uint64(k), err)
		}
		if idx := binary.BigEndian.Uint64(k); l.Index != idx {
			return n, fmt.Errorf("log entry under key %d has index %d", idx, l.Index)
		}
		batch = append(batch, l)
		n++
		if len(batch) == migrateBatch {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	return n, flush()
}

func copyStable(b *bbolt.Bucket, w *wal.WAL) error {
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if !uint64Keys[string(k)] {
			return w.Set(k, v)
		}
		if len(v) != 8 {
			return fmt.Errorf("stable value %s is %d bytes, want 8", k, len(v))
		}
		return w.SetUint64(k, binary.BigEndian.Uint64(v))
	})
}

func setAside(old string) error {
	if err := os.Rename(old, old+migratedSuffix); err != nil {
		return fmt.Errorf("raft store: the migration is complete but %s could not be set aside (remove it by hand): %w", old, err)
	}
	return syncDir(filepath.Dir(old))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
