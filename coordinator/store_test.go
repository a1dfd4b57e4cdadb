package coordinator

import (
	"bytes"
	"compress/gzip"
	"io"
	stdlog "log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// testdata/raft-boltdb-v1.db.gz is the raft/raft.db of a one-server cluster
// (node-0, --bootstrap-expect 1) written by the coordinator of commit
// 290aa2e, the last one on hashicorp/raft-boltdb and boltdb v1: the server
// bootstrapped, applied ModelUpsert for fixture-a and fixture-b and stopped
// at term 2, last index 7, with no snapshot.
const boltV1Fixture = "testdata/raft-boltdb-v1.db.gz"

// writeBoltV1Fixture lays the fixture out as dataDir/raft/raft.db and
// returns the raft folder.
func writeBoltV1Fixture(t *testing.T, dataDir string) string {
	t.Helper()
	gz, err := os.ReadFile(boltV1Fixture)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	db, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, boltV1FileName), db, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestStoreMigratesBoltV1DataDir starts a server on a data dir written by
// the raft-boltdb coordinator: it keeps its cluster state, its term and its
// membership, leads again, and the migration is done once.
func TestStoreMigratesBoltV1DataDir(t *testing.T) {
	c := newTestCluster(t)
	s := &testServer{id: "node-0", dir: filepath.Join(c.base, "node-0"), addr: "127.0.0.1:0", expect: 1}
	raftDir := writeBoltV1Fixture(t, s.dir)
	// What an interrupted earlier attempt would leave: discarded, redone.
	if err := os.MkdirAll(filepath.Join(raftDir, walDirName+migratingSuffix), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(raftDir, walDirName+migratingSuffix, "partial"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.addServer(s)
	c.start(s)

	l := c.leader(10 * time.Second)
	if l != s {
		t.Fatalf("leader %s, want the migrated server", l.id)
	}
	hasModels := func(names ...string) func() bool {
		return func() bool {
			st := s.srv.FSM().State()
			for _, n := range names {
				if _, ok := st.Models[n]; !ok {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 5*time.Second, "the fixture's models", hasModels("fixture-a", "fixture-b"))
	// The fixture stopped at term 2: a store that lost CurrentTerm would
	// campaign at term 1.
	stats := s.srv.Raft().Stats()
	if term, _ := strconv.Atoi(stats["term"]); term < 3 {
		t.Errorf("term %s after the migration, want > 2 (the stored term was 2)", stats["term"])
	}
	if last, _ := strconv.Atoi(stats["last_log_index"]); last < 8 {
		t.Errorf("last log index %s, want > 7 (the stored log ended at 7)", stats["last_log_index"])
	}
	for path, want := range map[string]bool{
		filepath.Join(raftDir, boltV1FileName):                false,
		filepath.Join(raftDir, boltV1FileName+migratedSuffix): true,
		filepath.Join(raftDir, walDirName):                    true,
		filepath.Join(raftDir, walDirName+migratingSuffix):    false,
	} {
		if got := exists(t, path); got != want {
			t.Errorf("%s exists=%v, want %v", path, got, want)
		}
	}
	if segs, _ := filepath.Glob(filepath.Join(raftDir, walDirName, "*.wal")); len(segs) == 0 {
		t.Error("no WAL segment after the migration")
	}

	// The migrated store takes new entries and survives a restart without
	// a second migration.
	if err := s.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "after-migration"}}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	c.stop(s)
	c.start(s)
	c.leader(10 * time.Second)
	waitFor(t, 5*time.Second, "every model after a restart", hasModels("fixture-a", "fixture-b", "after-migration"))
	if exists(t, filepath.Join(raftDir, boltV1FileName)) || !exists(t, filepath.Join(raftDir, boltV1FileName+migratedSuffix)) {
		t.Error("the restart touched the set-aside raft.db")
	}
}

// TestStoreMigrationFailsClearly: an old store that cannot be read stops
// the start with an error that names the file and what to do, and leaves
// the data dir as it was.
func TestStoreMigrationFailsClearly(t *testing.T) {
	for _, tc := range []struct {
		name string
		prep func(t *testing.T, old string) func()
		want string
	}{
		{"corrupt", func(t *testing.T, old string) func() {
			if err := os.WriteFile(old, bytes.Repeat([]byte("not a bolt file "), 1024), 0o600); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}, "invalid"},
		{"locked", func(t *testing.T, old string) func() {
			// An agent still running on the data dir holds the file lock.
			writeBoltV1Fixture(t, filepath.Dir(filepath.Dir(old)))
			db, err := bbolt.Open(old, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			saved := storeLockTimeout
			storeLockTimeout = 200 * time.Millisecond
			return func() { storeLockTimeout = saved; db.Close() }
		}, "locked by another process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raftDir := filepath.Join(t.TempDir(), "raft")
			if err := os.MkdirAll(raftDir, 0o700); err != nil {
				t.Fatal(err)
			}
			old := filepath.Join(raftDir, boltV1FileName)
			done := tc.prep(t, old)
			before, err := os.ReadFile(old)
			if err != nil {
				t.Fatal(err)
			}
			st, err := openStore(raftDir, hclog.NewNullLogger(), zap.NewNop())
			done()
			if err == nil {
				st.Close()
				t.Fatal("opened a store whose migration must fail")
			}
			msg := err.Error()
			t.Log(msg)
			for _, w := range []string{tc.want, old, "cannot migrate", "Nothing was changed", "move " + raftDir + " aside"} {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not say %q: %s", w, msg)
				}
			}
			after, err := os.ReadFile(old)
			if err != nil || !bytes.Equal(before, after) {
				t.Errorf("raft.db changed or gone after a failed migration (%v)", err)
			}
			for _, p := range []string{walDirName, walDirName + migratingSuffix, boltV1FileName + migratedSuffix} {
				if exists(t, filepath.Join(raftDir, p)) {
					t.Errorf("%s left behind by a failed migration", p)
				}
			}
		})
	}
}

// TestStoreMigrationFinishesSettingAside: a start that stopped after the
// WAL was renamed into place but before raft.db was set aside keeps the
// WAL as it is (it is complete) and only sets the old file aside.
func TestStoreMigrationFinishesSettingAside(t *testing.T) {
	dataDir := t.TempDir()
	raftDir := writeBoltV1Fixture(t, dataDir)
	st, err := openStore(raftDir, hclog.NewNullLogger(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	last, err := st.LastIndex()
	if err != nil || last != 7 {
		t.Fatalf("migrated last index %d (%v), want 7", last, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// Put the old file back as if the rename had not happened, and give
	// it one more entry that must not reach the WAL.
	old := filepath.Join(raftDir, boltV1FileName)
	if err := os.Rename(old+migratedSuffix, old); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(old, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(boltLogsBucket).Put([]byte{0, 0, 0, 0, 0, 0, 0, 8}, []byte{0x80})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	st, err = openStore(raftDir, hclog.NewNullLogger(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if last, err := st.LastIndex(); err != nil || last != 7 {
		t.Errorf("last index %d (%v) after the second start, want 7: the WAL was migrated again", last, err)
	}
	if exists(t, old) || !exists(t, old+migratedSuffix) {
		t.Error("raft.db was not set aside")
	}
}

// TestStdLogKeepsDefaults: importing raft-wal does not leave the standard
// logger taken over by capnslog.
func TestStdLogKeepsDefaults(t *testing.T) {
	if w := stdlog.Writer(); w != os.Stderr {
		t.Errorf("the standard logger writes to %T, want os.Stderr", w)
	}
	if f, p := stdlog.Flags(), stdlog.Prefix(); f != stdlog.LstdFlags || p != "" {
		t.Errorf("the standard logger has flags %d prefix %q, want %d and none", f, p, stdlog.LstdFlags)
	}
}
