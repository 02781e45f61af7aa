package persist

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	_ "github.com/coredns/coredns/plugin/bind"
)

// testCache is a store as a block's cache, with the fence f, or a new
// one at each call, and serve_stale's window grace.
type testCache struct {
	s     *store.Store
	f     *flush.Fence
	grace int64
}

func (c testCache) Store() *store.Store               { return c.s }
func (c testCache) Fingerprint() snapshot.Fingerprint { return snapshot.Fingerprint{1} }
func (c testCache) Now() int64                        { return time.Now().Unix() }
func (c testCache) Grace() int64                      { return c.grace }
func (c testCache) MaxTTL() int64                     { return 3600 }
func (c testCache) Fence() *flush.Fence {
	if c.f != nil {
		return c.f
	}
	return &flush.Fence{}
}

// filled returns a cache holding the first n entries of the workload.
func filled(t *testing.T, n int) testCache {
	t.Helper()
	s, err := store.New(64<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := testCache{s: s}
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

// TestSnapshotPathNotAFile: a PATH that names a directory (the one meant to
// hold the file) is refused at startup, and one that became a directory
// after it is loaded cold, left where it is with what it holds: only a
// file whose contents are wrong is moved aside.
func TestSnapshotPathNotAFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "coredns")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other-block.snap")
	if err := os.WriteFile(other, []byte("another block's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSnapshot([]string{dir}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("snapshot %s, a directory: error %v, want it refused as not a regular file", dir, err)
	}
	s, err := store.New(store.MinCapacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	Load(testCache{s: s}, dir)
	if _, err := os.Stat(other); err != nil {
		moved, _ := filepath.Glob(dir + ".bad-*")
		t.Errorf("loading %s, a directory, moved it away with its files (now %v): %v", dir, moved, err)
	}
}

// TestRemoveTemporary: the temporary files that killed writes left beside
// PATH are removed at startup; the file, other blocks' files and their
// temporary files stay.
func TestRemoveTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.snap")
	names := map[string]bool{ // name: removed
		"cache.snap":                 false,
		"cache.snap.tmp-123456789":   true,
		"cache.snap.tmp-987654321":   true,
		"cache.snap.bad-1800000000":  false,
		"other.snap.tmp-123456789":   false,
		"cache.snapshot.tmp-1234567": false,
	}
	for name := range names {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removeTemporary(path)
	for name, removed := range names {
		if _, err := os.Stat(filepath.Join(dir, name)); (err != nil) != removed {
			t.Errorf("%s: removed %v, want %v", name, err != nil, removed)
		}
	}
}

// TestSnapshotFlushDuringWrite: a flush that begins while a write walks
// the store holds at the next start, for the entries the write copied
// before the flush began as for the rest.
func TestSnapshotFlushDuringWrite(t *testing.T) {
	c := filled(t, 20000)
	c.f = &flush.Fence{}
	path := filepath.Join(t.TempDir(), "cache.snap")
	var flushed []byte // the key of an entry of the first chunk
	walk := func(visit func(e entry.Entry) bool, between func() error) error {
		return c.s.Paced(0)(func(e entry.Entry) bool {
			if flushed == nil {
				flushed = slices.Clone(e.Key())
			}
			return visit(e)
		}, func() error {
			if flushed != nil && c.s.Get(flushed, c.s.Hash(flushed), func(entry.Entry) bool { return true }) {
				c.f.Begin(func(e entry.Entry) bool { return bytes.Equal(e.Key(), flushed) })
				c.s.Remove(flushed)
			}
			return between()
		})
	}
	n, err := WriteFile(c, path, walk)
	if err != nil {
		t.Fatal(err)
	}
	to := testCache{s: filled(t, 0).s, f: &flush.Fence{}}
	Load(to, path)
	if got := to.s.Usage().Kinds[store.KindSuccess]; got != 19999 || n != 19999 {
		t.Errorf("wrote %d entries and loaded %d, want 19999 of each", n, got)
	}
	if to.s.Get(flushed, to.s.Hash(flushed), func(entry.Entry) bool { return true }) {
		t.Errorf("the entry flushed during the write is back")
	}
}

// TestSnapshotFlushExpiredDuringWrite: a flush of expired entries that
// begins while a write walks the store holds at the next start within the
// serve_stale window, for the stale entries the write copied before the
// flush began as for the rest.
func TestSnapshotFlushExpiredDuringWrite(t *testing.T) {
	s, err := store.New(64<<20, store.PerKind{}, 86400)
	if err != nil {
		t.Fatal(err)
	}
	c := testCache{s: s, f: &flush.Fence{}, grace: 86400}
	b := entry.NewBuilder()
	for i := range 20000 {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
		if err != nil {
			t.Fatal(err)
		}
		stored := c.Now()
		if i%2 == 0 {
			stored -= 7200 // expired an hour ago: stale
		}
		e, err := b.Build(m, key, m.Question[0].Name, uint32(stored), 3600, 0, 0, entry.MaxLen)
		if err != nil {
			t.Fatal(err)
		}
		s.Put(e, c.Now())
	}
	path := filepath.Join(t.TempDir(), "cache.snap")
	flushed := false
	walk := func(visit func(e entry.Entry) bool, between func() error) error {
		return c.s.Paced(0)(visit, func() error {
			if !flushed {
				flushed = true
				f := flush.Flush{Scope: flush.Expired}
				now := c.Now()
				c.f.BeginFlush(f, now)
				c.s.Paced(0)(func(e entry.Entry) bool { return f.Covers(e, now) }, nil)
			}
			return between()
		})
	}
	n, err := WriteFile(c, path, walk)
	if err != nil {
		t.Fatal(err)
	}
	to := testCache{s: filled(t, 0).s, f: &flush.Fence{}, grace: 86400}
	Load(to, path)
	stale := 0
	to.s.Paced(0)(func(e entry.Entry) bool {
		if to.Now() >= e.Expires() {
			stale++
		}
		return false
	}, nil)
	if stale != 0 || n != 10000 {
		t.Errorf("wrote %d entries, want the 10000 fresh ones; %d stale entries flushed during the write are back", n, stale)
	}
}

// TestSnapshotFinalWriteLast: the write at shutdown is the file the next
// start reads, though a write every INTERVAL that had walked the store
// before it was still under way.
func TestSnapshotFinalWriteLast(t *testing.T) {
	c := filled(t, 100)
	path := filepath.Join(t.TempDir(), "cache.snap")
	walked, release := make(chan struct{}), make(chan struct{})
	timed := func(visit func(e entry.Entry) bool, between func() error) error {
		err := c.s.Paced(0)(visit, between)
		close(walked)
		<-release
		return err
	}
	timedDone, finalDone := make(chan struct{}), make(chan struct{})
	go func() { write(c, path, timed); close(timedDone) }()
	<-walked
	var gone []byte
	c.s.Walk(store.Cursor{}, func(e entry.Entry) bool {
		gone = slices.Clone(e.Key())
		return true
	})
	go func() { write(c, path, c.s.Paced(0)); close(finalDone) }()
	select {
	case <-finalDone:
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-timedDone
	<-finalDone
	to := testCache{s: filled(t, 0).s}
	Load(to, path)
	if to.s.Get(gone, to.s.Hash(gone), func(entry.Entry) bool { return true }) {
		t.Errorf("the file is the write every INTERVAL's, not the final write's: it holds an entry removed before the final write")
	}
}

// TestSnapshotPathSpelledTwice: a path another block gives is refused
// however it is spelled, through a symbolic link too (/var/run is /run on
// most systems): both blocks would read and write the one file.
func TestSnapshotPathSpelledTwice(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cache.snap"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(t.TempDir(), "run")
	if err := os.Symlink(dir, linked); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "cache.snap"), filepath.Join(dir, "alias.snap")); err != nil {
		t.Fatal(err)
	}
	c := caddy.NewTestController("dns", "")
	ca := filled(t, 0)
	for i, path := range []string{filepath.Join(dir, "cache.snap"), dir + "/./cache.snap", dir + "//cache.snap",
		filepath.Join(linked, "cache.snap"), filepath.Join(dir, "alias.snap")} {
		sc, err := ParseSnapshot([]string{path})
		if err != nil {
			t.Fatal(err)
		}
		err = sc.Setup(c, ca)
		if (err == nil) != (i == 0) {
			t.Errorf("%s, block %d to give it: error %v", path, i+1, err)
		}
	}
}

// The test plugin "snapshotted PATH" gives its block `snapshot PATH` of
// block's cache, and a source of flushes that stops with the instance
// (lifecycle.OnStop), as the shared tier's and the Kubernetes API's do,
// applying block's lastFlush as it stops.
var block struct {
	ca        testCache
	lastFlush func()
}

func init() {
	plugin.Register("snapshotted", func(c *caddy.Controller) error {
		c.Next()
		sc, err := ParseSnapshot(c.RemainingArgs())
		if err != nil {
			return err
		}
		if err := sc.Setup(c, block.ca); err != nil {
			return err
		}
		lifecycle.OnStop(c, func() { block.lastFlush() })
		return nil
	})
	dnsserver.Directives = append(dnsserver.Directives, "snapshotted")
}

// TestSnapshotAfterLastFlush: the write at the process's stop comes after
// the last flush its block's sources apply, which they do until they stop,
// after health's lameduck: the next start does not serve what it flushed.
// The write came first, and a flush during the stop was undone at the
// next start.
func TestSnapshotAfterLastFlush(t *testing.T) {
	c := filled(t, 100)
	c.f = &flush.Fence{}
	var gone []byte
	c.s.Walk(store.Cursor{}, func(e entry.Entry) bool {
		if gone == nil {
			gone = slices.Clone(e.Key())
		}
		return false
	})
	want := c.s.Usage().Kinds[store.KindSuccess] - 1
	block.ca = c
	block.lastFlush = func() {
		c.f.Begin(func(e entry.Entry) bool { return bytes.Equal(e.Key(), gone) })
		c.s.Remove(gone)
	}
	path := filepath.Join(t.TempDir(), "cache.snap")
	inst, err := caddy.Start(caddy.CaddyfileInput{ServerTypeName: "dns",
		Contents: []byte(".:0 {\n\tbind 127.0.0.1\n\tsnapshotted " + path + "\n}\n")})
	if err != nil {
		t.Fatal(err)
	}
	inst.ShutdownCallbacks() // the process's stop: the shutdown callbacks, then the final ones
	inst.Stop()
	to := testCache{s: filled(t, 0).s}
	Load(to, path)
	if to.s.Get(gone, to.s.Hash(gone), func(entry.Entry) bool { return true }) {
		t.Error("the entry flushed during the process's stop is back")
	}
	if got := to.s.Usage().Kinds[store.KindSuccess]; got != want {
		t.Errorf("%d entries loaded, want the %d not flushed", got, want)
	}
}

// TestSnapshotThroughSymlink: a PATH that is a symbolic link (to a file on
// a volume of its own) is written where it points, not replaced by a file
// beside it, whether the file it names exists yet or not; a damaged one
// is moved aside there, and the link stays.
func TestSnapshotThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "volume"), 0o755); err != nil {
		t.Fatal(err)
	}
	path, target := filepath.Join(dir, "cache.snap"), filepath.Join(dir, "volume", "cache.snap")
	if err := os.Symlink(filepath.Join("volume", "cache.snap"), path); err != nil {
		t.Fatal(err)
	}
	c := filled(t, 100)
	for _, state := range []string{"not yet there", "there"} {
		if _, err := WriteFile(c, path, c.Store().Paced(0)); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSymlink {
			t.Fatalf("the file %s: the link replaced (%v)", state, err)
		}
		if fi, err := os.Stat(target); err != nil || fi.Size() == 0 {
			t.Fatalf("the file %s: not written where the link points (%v)", state, err)
		}
	}
	if err := os.WriteFile(target, []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := store.New(store.MinCapacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	Load(testCache{s: s}, path)
	if aside, _ := filepath.Glob(target + ".bad-*"); len(aside) != 1 {
		t.Errorf("the damaged file was not moved aside beside it: %v", aside)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("the link moved aside in place of the damaged file (%v)", err)
	}
}
