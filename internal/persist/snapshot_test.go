package persist

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/workload"
)

// testCache is a store as a block's cache.
type testCache struct{ s *store.Store }

func (c testCache) Store() *store.Store               { return c.s }
func (c testCache) Fingerprint() snapshot.Fingerprint { return snapshot.Fingerprint{1} }
func (c testCache) Now() int64                        { return time.Now().Unix() }
func (c testCache) Grace() int64                      { return 0 }

// filled returns a cache holding the first n entries of the workload.
func filled(t *testing.T, n int) testCache {
	t.Helper()
	s, err := store.New(64<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := testCache{s}
	b := entry.NewBuilder()
	for i := range n {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
		if err != nil {
			t.Fatal(err)
		}
		e, err := b.Build(m, key, m.Question[0].Name, uint32(c.Now()), 3600, 0, 0, entry.MaxLen)
		if err != nil {
			t.Fatal(err)
		}
		s.Put(e, c.Now())
	}
	return c
}

// TestSnapshotWriteGivenUp: a write every INTERVAL that the instance's
// shutdown overtakes stops at the next chunk, renames nothing and leaves no
// temporary file; one that runs to its end writes the whole store.
func TestSnapshotWriteGivenUp(t *testing.T) {
	c := filled(t, 20000)
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.snap")
	stop := make(chan struct{})
	close(stop)
	if n, err := WriteFile(c, path, pacedWalk(c, stop)); !errors.Is(err, errStopping) {
		t.Fatalf("wrote %d entries after the shutdown: %v", n, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("files left after a write given up: %v", left)
	}
	n, err := WriteFile(c, path, pacedWalk(c, make(chan struct{})))
	if err != nil || n != 20000 {
		t.Fatalf("wrote %d entries of 20000: %v", n, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 || left[0].Name() != "cache.snap" {
		t.Errorf("files after a write: %v, want cache.snap alone", left)
	}
}
