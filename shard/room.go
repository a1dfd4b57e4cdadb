package shard

import (
	"fmt"
	"os"

	"shoal/placement"
)

// NoRoomError says a node's disk cannot take a shard: the plan should move
// off it (the node reports it with its shard's status).
type NoRoomError struct {
	Need, Free uint64 // the shard's bytes still to write; the disk's free bytes
	Dir        string
}

func (e *NoRoomError) Error() string {
	return fmt.Sprintf("no room on disk for the shard: it needs %s more in %s, %s is free",
		placement.GiB(e.Need), e.Dir, placement.GiB(e.Free))
}

// roomSpare is what a shard leaves free on the disk: writing it to the
// last byte would starve the node's logs, Raft log and manifests.
const roomSpare = 64 << 20

// roomFor checks, before a shard of n bytes is assembled at path, that the
// disk has room for what is not there yet (a resumed file holds some).
func (m *Manager) roomFor(path string, n int64) error {
	free, ok := m.diskFree()
	if !ok {
		return nil
	}
	need := uint64(n)
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		need -= min(need, uint64(fi.Size()))
	}
	if free < need+roomSpare {
		return &NoRoomError{Need: need, Free: free, Dir: m.cfg.Dir}
	}
	return nil
}

// diskFree is the free disk under Dir, if ManagerConfig.DiskFree knows it.
func (m *Manager) diskFree() (uint64, bool) {
	if m.cfg.DiskFree == nil {
		return 0, false
	}
	return m.cfg.DiskFree(m.cfg.Dir)
}
