package persist

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLoadIntoSmallerCapacity: a file written by a block of a larger
// capacity, read after the operator lowered it, loads the most recently
// used entries the budget holds; it is not damaged, and stays in place.
func TestLoadIntoSmallerCapacity(t *testing.T) {
	big := filled(t, 100000) // a 64 MiB store
	path := filepath.Join(t.TempDir(), "cache.snap")
	if n, err := WriteFile(big, path, big.s.Paced(0)); err != nil || n != 100000 {
		t.Fatalf("wrote %d entries: %v", n, err)
	}
	small, err := store.New(store.MinCapacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	Load(testCache{s: small}, path)
	if aside, _ := filepath.Glob(path + ".bad-*"); len(aside) != 0 {
		t.Errorf("a good file moved aside as damaged when read into a store of %d bytes: %v", small.Capacity(), aside)
	}
	if u := small.Usage(); u.Kinds[store.KindSuccess] == 0 {
		t.Errorf("nothing loaded into the smaller store")
	}
}

// onlyReader hides every method of a reader but Read, as a peer's stream
// has no Seek.
type onlyReader struct{ io.Reader }

// TestReadStream: a peer's stream, which cannot be read twice, loads as the
// file does, copied to a temporary file that it leaves no trace of (and
// read a frame at a time, as the file is), or held in memory where no
// temporary file can be made; a stream over the bound loads nothing.
func TestReadStream(t *testing.T) {
	c := filled(t, 60000) // a file of about 7 MiB
	path := filepath.Join(t.TempDir(), "cache.snap")
	if _, err := WriteFile(c, path, c.s.Paced(0)); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bound := 4*int64(store.MinCapacity) + 1<<20; int64(len(file)) <= bound {
		t.Fatalf("a file of %d bytes, within the bound of %d of the smallest store", len(file), bound)
	}
	for _, tc := range []struct {
		name     string
		tmp      string // TMPDIR
		capacity int64
		want     int // entries loaded
	}{
		{"a temporary file", t.TempDir(), 64 << 20, 60000},
		{"no temporary file", filepath.Join(t.TempDir(), "missing"), 64 << 20, 60000},
		{"over the bound", t.TempDir(), store.MinCapacity, 0},
		{"over the bound, no temporary file", filepath.Join(t.TempDir(), "missing"), store.MinCapacity, 0},
	} {
		t.Setenv("TMPDIR", tc.tmp)
		s, err := store.New(tc.capacity, store.PerKind{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		l, err := read(testCache{s: s}, onlyReader{bytes.NewReader(file)}, 0)
		runtime.ReadMemStats(&after)
		spilled := !strings.HasSuffix(tc.tmp, "missing")
		if n := after.TotalAlloc - before.TotalAlloc; spilled && store.OffHeapBytes() > 0 && n > uint64(len(file)/2) {
			t.Errorf("%s: reading a stream of %d bytes allocated %d bytes", tc.name, len(file), n)
		}
		if l.Entries != tc.want || (err != nil) != (tc.want == 0) {
			t.Errorf("%s: loaded %+v: %v, want %d entries", tc.name, l, err, tc.want)
		}
		if u := s.Usage(); u.Kinds[store.KindSuccess] != tc.want {
			t.Errorf("%s: the store holds %d entries, want %d", tc.name, u.Kinds[store.KindSuccess], tc.want)
		}
		if left, _ := os.ReadDir(tc.tmp); len(left) != 0 {
			t.Errorf("%s: left in TMPDIR: %v", tc.name, left)
		}
	}
}

// TestLoadPeakMemory: a block of capacity 512MiB whose store is full
// restarts from its file within the container memory docs/operations.md
// sizes for it (capacity*5/4 + 64MiB + 96MiB, GOMEMLIMIT capacity/4 +
// 64MiB). It takes about a GiB and 20 seconds, so it runs only with
// COMPACTCACHE_LOAD_PEAK=1; internal/snapshot's TestReadHoldsAFrame checks
// what it rests on in every run.
func TestLoadPeakMemory(t *testing.T) {
	const capacity = 512 << 20
	if path := os.Getenv("COMPACTCACHE_LOAD_PEAK_CHILD"); path != "" {
		debug.SetMemoryLimit(capacity/4 + 64<<20)
		s, err := store.New(capacity, store.PerKind{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		Load(testCache{s: s}, path)
		fmt.Printf("PEAK %d ENTRIES %d\n", peakResident(t), s.Usage().Kinds[store.KindSuccess])
		return
	}
	if os.Getenv("COMPACTCACHE_LOAD_PEAK") == "" {
		t.Skip("set COMPACTCACHE_LOAD_PEAK=1 to run it")
	}
	s, err := store.New(capacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := testCache{s: s}
	b := entry.NewBuilder()
	now := c.Now()
	for i := 0; ; i++ {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
		if err != nil {
			t.Fatal(err)
		}
		e, err := b.Build(m, key, m.Question[0].Name, uint32(now), 3600, 0, 0, entry.MaxLen)
		if err != nil {
			t.Fatal(err)
		}
		if d := s.Put(e, now); d.Evicted[store.KindSuccess]+d.Refused[store.KindSuccess] > 0 {
			break // full
		}
	}
	path := filepath.Join(t.TempDir(), "cache.snap")
	n, err := WriteFile(c, path, s.Paced(0))
	if err != nil {
		t.Fatal(err)
	}
	s = nil
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLoadPeakMemory$", "-test.count=1")
	cmd.Env = append(os.Environ(), "COMPACTCACHE_LOAD_PEAK_CHILD="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the loading process: %v\n%s", err, out)
	}
	var peak, loaded int64
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, "entries loaded in") {
			t.Log(line)
		}
		fmt.Sscanf(line, "PEAK %d ENTRIES %d", &peak, &loaded)
	}
	limit := int64(capacity)*5/4 + 64<<20 + 96<<20
	t.Logf("a file of %d entries: %d loaded, peak resident %d MiB of a limit of %d MiB", n, loaded, peak>>20, limit>>20)
	if peak > limit {
		t.Errorf("loading the file of a full %d MiB store peaks at %d MiB resident, over the %d MiB limit", capacity>>20, peak>>20, limit>>20)
	}
}

// peakResident returns the process's peak resident memory, bytes.
func peakResident(t *testing.T) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmHWM in /proc/self/status")
	return 0
}

// TestReadFenced: entries that a flush begun since the fetch covers are
// left out, and not counted as loaded.
func TestReadFenced(t *testing.T) {
	c := filled(t, 1000)
	path := filepath.Join(t.TempDir(), "cache.snap")
	if _, err := WriteFile(c, path, c.s.Paced(0)); err != nil {
		t.Fatal(err)
	}
	s, err := store.New(64<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	to := testCache{s: s, f: &flush.Fence{}}
	gen := to.f.Gen()
	to.f.Begin(func(e entry.Entry) bool { // about half of them
		sum := 0
		for _, b := range e.Key() {
			sum += int(b)
		}
		return sum&1 == 0
	})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := read(to, f, gen)
	if err != nil {
		t.Fatal(err)
	}
	held := s.Usage().Kinds[store.KindSuccess]
	if held == 0 || held == 1000 {
		t.Fatalf("the store holds %d of 1000 entries: the flush covered none or all", held)
	}
	if l.Entries != held {
		t.Errorf("loaded %d entries, the store holds %d", l.Entries, held)
	}
}

// TestReadKeepsNewerEntries: a warm-up's entry does not replace one the
// block stored since the fill began, newer than the peer's copy: the
// client would be answered from the older (stale, or without the DNSSEC
// records a DO client's fetch added) until it expired.
func TestReadKeepsNewerEntries(t *testing.T) {
	now := time.Now().Unix()
	m := workload.Reply(0, workload.Plain)
	key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
	if err != nil {
		t.Fatal(err)
	}
	at := func(c testCache, stored int64) {
		e, err := entry.NewBuilder().Build(m, key, m.Question[0].Name, uint32(stored), 3600, 0, 0, entry.MaxLen)
		if err != nil {
			t.Fatal(err)
		}
		c.s.Put(e, now)
	}
	peer, local := filled(t, 0), filled(t, 0)
	at(peer, now-100)
	var stream bytes.Buffer
	if _, err := snapshot.Write(&stream, peer.s.Paced(0), peer.Fingerprint(), now); err != nil {
		t.Fatal(err)
	}
	at(local, now)
	if _, err := read(local, onlyReader{&stream}, 0); err != nil {
		t.Fatal(err)
	}
	var stored int64
	local.s.Get(key, local.s.Hash(key), func(e entry.Entry) bool {
		stored = int64(e.Stored())
		return false
	})
	if stored != now {
		t.Errorf("the entry stored at %d, want the block's own, stored at %d: the peer's older copy replaced it", stored, now)
	}
}

// TestLoadOtherVersion: a file of another format version (written by a
// newer build, read after a rollback; or an older one's, after an upgrade)
// leaves the block cold as a file of other settings does: logged, neither
// counted as an error nor moved aside as damaged.
func TestLoadOtherVersion(t *testing.T) {
	c := filled(t, 1000)
	path := filepath.Join(t.TempDir(), "cache.snap")
	if _, err := WriteFile(c, path, c.s.Paced(0)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[6]++ // the header's version, after the magic
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := store.New(store.MinCapacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	errs := cachemetrics.SnapshotErrors.WithLabelValues(path, "read")
	Load(testCache{s: s}, path)
	if aside, _ := filepath.Glob(path + ".bad-*"); len(aside) != 0 {
		t.Errorf("a file of another version moved aside as damaged: %v", aside)
	}
	if n := testutil.ToFloat64(errs); n != 0 {
		t.Errorf("a file of another version counted as %v read errors, want 0", n)
	}
	if u := s.Usage(); u.Kinds[store.KindSuccess] != 0 {
		t.Errorf("%d entries loaded from a file of another version", u.Kinds[store.KindSuccess])
	}
}
