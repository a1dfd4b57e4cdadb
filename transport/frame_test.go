package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	msgs := [][]byte{{}, []byte("a"), bytes.Repeat([]byte("xyz"), 1000)}
	for _, m := range msgs {
		if err := WriteFrame(&buf, m); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range msgs {
		got, err := ReadFrame(&buf, 1<<20)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, m) {
			t.Fatalf("frame %d: got %d bytes, want %d", i, len(got), len(m))
		}
	}
	if _, err := ReadFrame(&buf, 1<<20); err != io.EOF {
		t.Fatalf("after last frame: got %v, want EOF", err)
	}
}

// countingReader fails the test if more than the header is read.
type headerOnly struct {
	hdr  []byte
	read int
}

func (h *headerOnly) Read(p []byte) (int, error) {
	if h.read >= len(h.hdr) {
		return 0, errors.New("payload must not be read")
	}
	n := copy(p, h.hdr[h.read:])
	h.read += n
	return n, nil
}

func TestFrameOversizedRejectedWithoutAllocation(t *testing.T) {
	hdr := make([]byte, 4)
	binary.BigEndian.PutUint32(hdr, 0xFFFFFFF0) // ~4 GiB announced
	allocs := testing.AllocsPerRun(10, func() {
		_, err := ReadFrame(&headerOnly{hdr: hdr}, 1<<20)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("got %v, want ErrFrameTooLarge", err)
		}
	})
	// The error value itself allocates a little; a 4 GiB buffer would not
	// pass unnoticed either way, but make sure nothing big happens.
	if allocs > 8 {
		t.Fatalf("%v allocations for a rejected frame", allocs)
	}
}

func TestFrameTruncated(t *testing.T) {
	var buf bytes.Buffer
	_ = WriteFrame(&buf, []byte("hello world"))
	b := buf.Bytes()[:8]
	if _, err := ReadFrame(bytes.NewReader(b), 100); err == nil {
		t.Fatal("truncated frame accepted")
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ReadFrame(bytes.NewReader(b), 64)
		if err == nil && len(p) > 64 {
			t.Fatalf("frame of %d bytes above limit", len(p))
		}
	})
}

// TestFrameAsSentAllocatesWhatArrives: a frame that announces 4 MiB and
// sends 10 bytes costs ReadFrameAsSent about what arrived, where ReadFrame
// allocates the announced size; whole frames read the same with both, and
// an oversized one is refused.
func TestFrameAsSentAllocatesWhatArrives(t *testing.T) {
	var buf bytes.Buffer
	for _, m := range [][]byte{{}, []byte("a"), bytes.Repeat([]byte("xyz"), 100_000)} {
		buf.Reset()
		_ = WriteFrame(&buf, m)
		got, err := ReadFrameAsSent(&buf, 1<<20)
		if err != nil || !bytes.Equal(got, m) {
			t.Fatalf("%d-byte frame: %d bytes, %v", len(m), len(got), err)
		}
	}
	hdr := binary.BigEndian.AppendUint32(nil, 4<<20)
	short := append(hdr, "0123456789"...)
	var ms runtime.MemStats
	allocated := func(read func(io.Reader, int) ([]byte, error)) uint64 {
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		if _, err := read(bytes.NewReader(short), 4<<20); err == nil {
			t.Fatal("a short frame was accepted")
		}
		runtime.ReadMemStats(&ms)
		return ms.TotalAlloc - before
	}
	full, asSent := allocated(ReadFrame), allocated(ReadFrameAsSent)
	t.Logf("a frame announcing 4 MiB with 10 bytes sent: ReadFrame allocated %d bytes, ReadFrameAsSent %d", full, asSent)
	if asSent > 64<<10 || full < 4<<20 {
		t.Errorf("ReadFrameAsSent allocated %d bytes (ReadFrame %d) for 10 bytes sent", asSent, full)
	}
	if _, err := ReadFrameAsSent(bytes.NewReader(binary.BigEndian.AppendUint32(nil, 1<<20+1)), 1<<20); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
}
