package transport

import (
	"bytes"
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
	n, err := readFrameLen(r, max)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("short frame: %w", err)
	}
	return buf, nil
}

// ReadFrameAsSent is ReadFrame for a frame from a peer that may announce
// more than it sends (a request, where ReadFrame's one allocation of the
// announced size would let each idle stream hold up to max): it
// allocates as the bytes arrive.
func ReadFrameAsSent(r io.Reader, max int) ([]byte, error) {
	n, err := readFrameLen(r, max)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, r, int64(n)); err != nil {
		return nil, fmt.Errorf("short frame: %w", err)
	}
	return buf.Bytes(), nil
}

// readFrameLen reads a frame's length prefix and checks it against max.
func readFrameLen(r io.Reader, max int) (uint32, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	return n, nil
}
