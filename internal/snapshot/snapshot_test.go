package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

const t0 = 1_800_000_000 // the stores' clock, unix seconds

var fp = Fingerprint{1, 2, 3}

// filled returns a store of capacity bytes holding n entries of the
// workload's plain, DNSSEC and ECS variants, each stored at t0+i with a TTL
// of ttl, and their keys.
func filled(t testing.TB, capacity int64, n int, ttl uint32) (*store.Store, [][]byte) {
	t.Helper()
	s, err := store.New(capacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	var keys [][]byte
	for i := range n {
		v := []workload.Variant{workload.Plain, workload.CNAME | workload.DNSSEC, workload.ECS}[i%3]
		m := workload.Reply(i, v)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, i%7 == 0)
		if err != nil {
			t.Fatal(err)
		}
		flags := uint16(0)
		if i%5 == 0 {
			flags = entry.FlagDenial | dns.RcodeNameError
		}
		e, err := b.Build(m, key, m.Question[0].Name, uint32(t0+i), ttl, 0, flags, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		s.Put(e, t0)
		keys = append(keys, key)
	}
	return s, keys
}

// contents returns every entry of s, by key.
func contents(s *store.Store) map[string]string {
	out := map[string]string{}
	for c, more := (store.Cursor{}), true; more; {
		c, more = s.Walk(c, func(e entry.Entry) bool {
			out[string(e.Key())] = string(e)
			return false
		})
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	s, _ := filled(t, 16<<20, 3000, 3600)
	var file bytes.Buffer
	n, err := Write(&file, s.Paced(0), fp, t0+10)
	if err != nil || n != 3000 {
		t.Fatalf("wrote %d entries: %v", n, err)
	}
	into, err := store.New(16<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Read(bytes.NewReader(file.Bytes()), int64(file.Len()), into, fp, t0+100, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.Entries != 3000 || l.Expired != 0 || l.Written != t0+10 {
		t.Errorf("loaded %+v, want 3000 entries written at %d", l, t0+10)
	}
	want, got := contents(s), contents(into)
	if len(got) != len(want) {
		t.Fatalf("%d entries back of %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("entry %q came back changed", k)
		}
	}
	if err := into.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestReadAgesAndHoldsTheBudget: entries expired beyond the serve-stale
// window stay out; into a smaller store the most recently used go last, so
// that they are the ones kept.
func TestReadAgesAndHoldsTheBudget(t *testing.T) {
	s, keys := filled(t, 16<<20, 3000, 100) // entry i expires at t0+i+100
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
		t.Fatal(err)
	}
	into, _ := store.New(16<<20, store.PerKind{}, 50)
	l, err := Read(bytes.NewReader(file.Bytes()), int64(file.Len()), into, fp, t0+2000, 50)
	if err != nil {
		t.Fatal(err)
	}
	// Kept: expires+50 >= t0+2000, so i >= 1850.
	if l.Entries != 1150 || l.Expired != 1850 {
		t.Errorf("loaded %+v, want 1150 entries, 1850 expired", l)
	}
	for i, want := range map[int]bool{0: false, 1849: false, 1850: true, len(keys) - 1: true} {
		if got := into.Get(keys[i], into.Hash(keys[i]), func(entry.Entry) bool { return true }); got != want {
			t.Errorf("entry %d loaded: %v, want %v", i, got, want)
		}
	}
	small, _ := store.New(store.MinCapacity, store.PerKind{}, 0)
	s, keys = filled(t, 16<<20, 20000, 3600)
	file.Reset()
	if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(bytes.NewReader(file.Bytes()), int64(file.Len()), small, fp, t0, 0); err != nil {
		t.Fatal(err)
	}
	if u := small.Usage(); u.Held > small.Capacity() {
		t.Fatalf("%d bytes held, over the budget of %d", u.Held, small.Capacity())
	}
	has := func(key []byte) bool { return small.Get(key, small.Hash(key), func(entry.Entry) bool { return true }) }
	if !has(keys[len(keys)-1]) || has(keys[0]) {
		t.Errorf("a small store kept the oldest entry (%v) or lost the newest (%v)", has(keys[0]), !has(keys[len(keys)-1]))
	}
}

// TestReadRefusesDamage damages a file every way the reader checks: each
// gives a clear error, and nothing goes into the store.
func TestReadRefusesDamage(t *testing.T) {
	s, _ := filled(t, 16<<20, 500, 3600)
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
		t.Fatal(err)
	}
	good := file.Bytes()
	firstFrame := headerLen + 8
	for _, tc := range []struct {
		name   string
		damage func(b []byte) []byte
		want   error
	}{
		{"empty", func(b []byte) []byte { return nil }, ErrNotSnapshot},
		{"another file", func(b []byte) []byte { return []byte("# zone file\nexample.org. 300 IN A 192.0.2.1\n") }, ErrNotSnapshot},
		{"another version", func(b []byte) []byte { b[6] = 9; return b }, ErrVersion},
		{"header checksum", func(b []byte) []byte { b[8]++; return b }, ErrDamaged},
		{"other settings", func(b []byte) []byte {
			b[20]++
			binary.LittleEndian.PutUint32(b[48:], crc32.Checksum(b[:48], castagnoli))
			return b
		}, ErrSettings},
		{"cut in a frame", func(b []byte) []byte { return b[:len(b)/2] }, ErrDamaged},
		{"cut before the end frame", func(b []byte) []byte { return b[:len(b)-8] }, ErrDamaged},
		{"a frame's checksum", func(b []byte) []byte { b[firstFrame+100]++; return b }, ErrDamaged},
		{"a frame too large", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[headerLen:], maxFrame+1)
			return b
		}, ErrDamaged},
		{"an entry's structure, checksum right", func(b []byte) []byte {
			n := binary.LittleEndian.Uint32(b[headerLen:])
			blk := b[firstFrame : firstFrame+int(n)]
			blk[3] = 250 // the first entry's name length (internal/entry)
			binary.LittleEndian.PutUint32(b[headerLen+4:], crc32.Checksum(blk, castagnoli))
			return b
		}, ErrDamaged},
		{"bytes past the end", func(b []byte) []byte { return append(b, 0) }, ErrDamaged},
	} {
		b := tc.damage(append([]byte(nil), good...))
		into, _ := store.New(store.MinCapacity, store.PerKind{}, 0)
		l, err := Read(bytes.NewReader(b), 1<<30, into, fp, t0, 0)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
		if l.Entries != 0 || len(contents(into)) != 0 {
			t.Errorf("%s: %d entries loaded from a damaged file", tc.name, len(contents(into)))
		}
	}
	into, _ := store.New(store.MinCapacity, store.PerKind{}, 0)
	if _, err := Read(bytes.NewReader(good), int64(len(good)-1), into, fp, t0, 0); !errors.Is(err, ErrDamaged) {
		t.Errorf("a file over the limit: %v", err)
	}
}

// FuzzRead: whatever the file, Read returns, and a store it loaded is
// consistent and can be walked.
func FuzzRead(f *testing.F) {
	s, _ := filled(f, 16<<20, 30, 3600)
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
		f.Fatal(err)
	}
	f.Add(file.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= headerLen {
			copy(b, magic)
			binary.LittleEndian.PutUint16(b[6:], version)
			copy(b[16:48], fp[:])
			binary.LittleEndian.PutUint32(b[48:], crc32.Checksum(b[:48], castagnoli))
		}
		into, _ := store.New(store.MinCapacity, store.PerKind{}, 0)
		if _, err := Read(bytes.NewReader(b), 1<<20, into, fp, t0, 0); err != nil {
			return
		}
		if err := into.Check(); err != nil {
			t.Fatal(err)
		}
		_ = fmt.Sprint(len(contents(into)))
	})
}

// BenchmarkSnapshot writes and reads back a store of the reference
// workload: go test -run '^$' -bench Snapshot -benchtime 1x ./internal/snapshot
// reports the seconds per million entries of each.
func BenchmarkSnapshot(b *testing.B) {
	const n = 1_000_000
	s, _ := filled(b, 512<<20, n, 3600)
	for b.Loop() {
		var file bytes.Buffer
		start := time.Now()
		if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
			b.Fatal(err)
		}
		write := time.Since(start)
		into, _ := store.New(512<<20, store.PerKind{}, 0)
		start = time.Now()
		l, err := Read(bytes.NewReader(file.Bytes()), int64(file.Len()), into, fp, t0, 0)
		if err != nil || l.Entries != n {
			b.Fatalf("read %+v: %v", l, err)
		}
		b.ReportMetric(write.Seconds()*1e6/n, "s-write/1M-entries")
		b.ReportMetric(time.Since(start).Seconds()*1e6/n, "s-load/1M-entries")
		b.ReportMetric(float64(file.Len())/n, "file-B/entry")
	}
}

// TestSortByUse: least recently used first, and entries used in the same
// second in the order they came, as a stable sort leaves them.
func TestSortByUse(t *testing.T) {
	b := entry.NewBuilder()
	var entries []entry.Entry
	for i, stored := range []uint32{5, 3, 5, 1, 3, 5} {
		m := workload.Reply(i, workload.Plain)
		key, err := entry.KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
		if err != nil {
			t.Fatal(err)
		}
		e, err := b.Build(m, key, m.Question[0].Name, t0+stored, 3600, 0, 0, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, slices.Clone(e))
	}
	want := []entry.Entry{entries[3], entries[1], entries[4], entries[0], entries[2], entries[5]}
	sortByUse(entries)
	for k := range want {
		if !bytes.Equal(entries[k], want[k]) {
			t.Errorf("place %d: the entry of %s used at %d, want %s used at %d", k, entries[k].QName(), entries[k].LastUsed(), want[k].QName(), want[k].LastUsed())
		}
	}
}

// failAfter is a writer that fails once it has taken n bytes.
type failAfter struct{ n int }

func (w *failAfter) Write(b []byte) (int, error) {
	if len(b) > w.n {
		return 0, errors.New("no space left on device")
	}
	w.n -= len(b)
	return len(b), nil
}

// TestWriteStopsOnError: a write that fails ends the walk there, rather than
// copying the rest of the store for nothing.
func TestWriteStopsOnError(t *testing.T) {
	const n = 20000 // about 4 MB: the first 1 MiB frame is written early
	s, _ := filled(t, 16<<20, n, 3600)
	chunks := 0
	walk := func(visit func(entry.Entry) bool, between func() error) error {
		return s.Paced(0)(visit, func() error {
			chunks++
			return between()
		})
	}
	written, err := Write(&failAfter{n: 1 << 10}, walk, fp, t0)
	if err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("wrote %d entries: %v, want the writer's error", written, err)
	}
	if written >= n {
		t.Errorf("%d entries copied of %d: the walk went on after the error", written, n)
	}
	all := 0
	for c, more := (store.Cursor{}), true; more; all++ {
		c, more = s.Walk(c, func(entry.Entry) bool { return false })
	}
	if chunks >= all {
		t.Errorf("%d chunks walked of %d", chunks, all)
	}
}
