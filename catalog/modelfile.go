package catalog

import (
	"context"
	"io"
	"io/fs"
	"os"
	"syscall"

	"shoal/engine/gguf"
)

// maxHubHeader bounds the bytes read to find the end of a GGUF header.
const maxHubHeader = 256 << 20

// readHeader reads the start of r until the GGUF header and tensor table
// parse (the buffer grows by doubling from 64 KiB), returning what it read.
func readHeader(ctx context.Context, r io.Reader, size int64) ([]byte, *gguf.File, error) {
	var buf []byte
	want := int64(64 << 10)
	for {
		want = min(want, size, maxHubHeader)
		if int64(len(buf)) < want {
			more := make([]byte, want-int64(len(buf)))
			n, err := io.ReadFull(r, more)
			buf = append(buf, more[:n]...)
			if err != nil && int64(len(buf)) < want {
				return nil, nil, err
			}
		}
		f, err := gguf.ParseTable(buf, size)
		if err == nil {
			return buf, f, nil
		}
		if int64(len(buf)) >= size || int64(len(buf)) >= maxHubHeader {
			return nil, nil, err
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		want *= 2
	}
}

// notRegularError is the error of a model path that names something
// other than a regular file.
type notRegularError struct{ what string }

func (e *notRegularError) Error() string { return "it is " + e.what + ", not a regular file" }

// kindOf names a file mode that is not a regular file's.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// openModelFile opens the model file at path for reading, refusing
// anything but a regular file: opening a FIFO for reading waits for a
// writer, and a device or socket never ends. It stats the path first, then
// opens it without blocking and checks what it opened, so a path swapped
// for a FIFO in between cannot hang the caller either.
func openModelFile(path string) (*os.File, os.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, &notRegularError{kindOf(st.Mode())}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	if st, err = f.Stat(); err == nil && !st.Mode().IsRegular() {
		err = &notRegularError{kindOf(st.Mode())}
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// CheckModelFile is openModelFile for code that opens path itself.
func CheckModelFile(path string) error {
	f, _, err := openModelFile(path)
	if err == nil {
		f.Close()
	}
	return err
}
