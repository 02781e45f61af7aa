//go:build unix

package persist

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestOpenFile: a snapshot's path is opened only as a regular file, checked
// once open; a FIFO, which may be swapped in after the path was checked,
// is refused at once rather than waited on for a writer.
func TestOpenFile(t *testing.T) {
	dir := t.TempDir()
	file, fifo := filepath.Join(dir, "cache.snap"), filepath.Join(dir, "fifo.snap")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want string // want: "" for opened
	}{
		{file, ""},
		{fifo, "not a regular file"},
		{dir, "not a regular file"},
		{filepath.Join(dir, "none.snap"), "no such file"},
	} {
		f, err := openFile(tc.path)
		if err == nil {
			f.Close()
		}
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("openFile(%s): %v, want %q", tc.path, err, tc.want)
		}
	}
}
