package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxFrame bounds control-plane frames (rpc, join). Data kinds that
// move tensors set their own, larger limits.
const DefaultMaxFrame = 4 << 20

// ErrFrameTooLarge is returned by ReadFrame when the peer announces a frame
// above the limit; the payload is never allocated.
var ErrFrameTooLarge = errors.New("frame too large")

// WriteFrame writes a 4-byte big-endian length followed by p.
func WriteFrame(w io.Writer, p []byte) error {
	if uint64(len(p)) > 0xFFFFFFFF {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(p))
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

// ReadFrame reads one frame written by WriteFrame. A frame announcing more
// than max bytes is rejected before any allocation.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("short frame: %w", err)
	}
	return buf, nil
}
