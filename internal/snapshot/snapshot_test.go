package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"runtime"
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
	n, err := Write(&file, s.Paced(0), fp, t0+3000) // after the last was stored
	if err != nil || n != 3000 {
		t.Fatalf("wrote %d entries: %v", n, err)
	}
	into, err := store.New(16<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Read(bytes.NewReader(file.Bytes()), into, fp, t0+3100, 0, 1<<32)
	if err != nil {
		t.Fatal(err)
	}
	if l.Entries != 3000 || l.Expired != 0 || l.Written != t0+3000 {
		t.Errorf("loaded %+v, want 3000 entries written at %d", l, t0+3000)
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
	l, err := Read(bytes.NewReader(file.Bytes()), into, fp, t0+2000, 50, 1<<32)
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
	if _, err := Write(&file, s.Paced(0), fp, t0+20000); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(bytes.NewReader(file.Bytes()), small, fp, t0+20000, 0, 1<<32); err != nil {
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
		l, err := Read(bytes.NewReader(b), into, fp, t0, 0, 1<<32)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
		if l.Entries != 0 || len(contents(into)) != 0 {
			t.Errorf("%s: %d entries loaded from a damaged file", tc.name, len(contents(into)))
		}
	}
}

// TestReadRefusesEveryCut: a file cut short anywhere (a disk that lost its
// tail, a copy that stopped) is refused, and puts nothing.
func TestReadRefusesEveryCut(t *testing.T) {
	s, _ := filled(t, 16<<20, 3, 3600)
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
		t.Fatal(err)
	}
	for n := range file.Len() {
		into, _ := store.New(store.MinCapacity, store.PerKind{}, 0)
		_, err := Read(bytes.NewReader(file.Bytes()[:n]), into, fp, t0, 0, 1<<32)
		want := ErrDamaged
		if n < headerLen {
			want = ErrNotSnapshot
		}
		if !errors.Is(err, want) || len(contents(into)) != 0 {
			t.Fatalf("cut to %d bytes of %d: error %v, want %v; %d entries put", n, file.Len(), err, want, len(contents(into)))
		}
	}
}

// FuzzRead: whatever the file, Read returns, and a store it loaded is
// consistent and holds only entries that entry.Check passes, which a hit
// reads without bounds checks. The header and the frames' checksums are
// set right, so that the fuzzer's changes reach the entries and the checks
// of each; the seeds include files whose entries are damaged so.
func FuzzRead(f *testing.F) {
	s, _ := filled(f, 16<<20, 30, 3600)
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0); err != nil {
		f.Fatal(err)
	}
	f.Add(file.Bytes())
	first := headerLen + 8 // the first entry
	for _, damage := range []func(b []byte){
		func(b []byte) { b[first+3]++ },                         // its name length
		func(b []byte) { b[first]-- },                           // its size
		func(b []byte) { b[first+13] |= entry.FlagMeta >> 8 },   // a variant list's flag on an answer
		func(b []byte) { b[first+8], b[first+11] = 0xff, 0xff }, // its TTL
		func(b []byte) { b[first+18] = 63 },                     // its name's first label
	} {
		b := bytes.Clone(file.Bytes())
		damage(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sealed(b)
		into, _ := store.New(store.MinCapacity, store.PerKind{}, 0)
		if _, err := Read(bytes.NewReader(b), into, fp, t0, 0, 3600); err != nil {
			if n := len(contents(into)); n != 0 {
				t.Fatalf("%d entries put from a file refused: %v", n, err)
			}
			return
		}
		if err := into.Check(); err != nil {
			t.Fatal(err)
		}
		for _, e := range contents(into) {
			if err := entry.Check([]byte(e)); err != nil {
				t.Fatalf("an entry the check refuses was put: %v", err)
			}
		}
	})
}

// sealed sets the header of the file in b to fp's and its checksums right,
// the header's and those of the frames that lie within b.
func sealed(b []byte) {
	if len(b) < headerLen {
		return
	}
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[6:], version)
	copy(b[16:48], fp[:])
	binary.LittleEndian.PutUint32(b[48:], crc32.Checksum(b[:48], castagnoli))
	for off := headerLen; off+8 <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		if n == 0 || n > maxFrame || off+8+n > len(b) {
			return
		}
		binary.LittleEndian.PutUint32(b[off+4:], crc32.Checksum(b[off+8:off+8+n], castagnoli))
		off += 8 + n
	}
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
		l, err := Read(bytes.NewReader(file.Bytes()), into, fp, t0, 0, 1<<32)
		if err != nil || l.Entries != n {
			b.Fatalf("read %+v: %v", l, err)
		}
		b.ReportMetric(write.Seconds()*1e6/n, "s-write/1M-entries")
		b.ReportMetric(time.Since(start).Seconds()*1e6/n, "s-load/1M-entries")
		b.ReportMetric(float64(file.Len())/n, "file-B/entry")
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

// TestReadFromTheFuture: a file written by a clock an hour ahead of the
// reader's (a peer's, or this host's before it was set back) has its times
// moved back by the hour, and an entry stored after the file's own time
// (its writer's clock set back since) is taken as stored now, so that no
// entry is served unaged past its TTL: the reply writer ages an entry
// stored after now by 0.
func TestReadFromTheFuture(t *testing.T) {
	s, keys := filled(t, 16<<20, 30, 100) // entry i stored at t0+i, TTL 100
	for _, tc := range []struct {
		name         string
		written, now int64
		stored       func(i int) int64 // by the reader's clock
	}{
		{"a clock an hour ahead", t0 + 30, t0 - 3600, func(i int) int64 { return t0 - 3600 - 30 + int64(i) }},
		{"stored after the file's time", t0, t0 + 10, func(i int) int64 { return min(t0+int64(i), t0+10) }},
	} {
		var file bytes.Buffer
		if _, err := Write(&file, s.Paced(0), fp, tc.written); err != nil {
			t.Fatal(err)
		}
		into, _ := store.New(16<<20, store.PerKind{}, 0)
		l, err := Read(bytes.NewReader(file.Bytes()), into, fp, tc.now, 0, 1<<32)
		if err != nil || l.Entries != len(keys) {
			t.Fatalf("%s: loaded %+v: %v, want %d entries", tc.name, l, err, len(keys))
		}
		right := 0
		for i, key := range keys {
			into.Get(key, into.Hash(key), func(e entry.Entry) bool {
				if int64(e.Stored()) == tc.stored(i) {
					right++
				}
				return true
			})
		}
		if right != len(keys) {
			t.Errorf("%s: %d entries of %d stored at the reader's time of their store", tc.name, right, len(keys))
		}
	}
}

// TestReadKeepsTheNewestUnderEntryCaps: under a `success` cap lower than
// the file's success entries (a cap lowered, or given, across a restart),
// the most recently used are kept, as under the byte budget.
func TestReadKeepsTheNewestUnderEntryCaps(t *testing.T) {
	s, keys := filled(t, 16<<20, 3000, 3600) // entry i stored (used) at t0+i; i%5 == 0 a denial
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0+3000); err != nil {
		t.Fatal(err)
	}
	const limit = 500
	into, _ := store.New(16<<20, store.PerKind{store.KindSuccess: limit}, 0)
	if _, err := Read(bytes.NewReader(file.Bytes()), into, fp, t0+3000, 0, 1<<32); err != nil {
		t.Fatal(err)
	}
	kept, newest, seen := 0, 0, 0
	for i := len(keys) - 1; i >= 0; i-- {
		if i%5 == 0 {
			continue // a denial
		}
		seen++
		if into.Get(keys[i], into.Hash(keys[i]), func(entry.Entry) bool { return true }) {
			kept++
			if seen <= limit {
				newest++
			}
		}
	}
	if newest < limit*3/4 {
		t.Errorf("kept %d success entries under a cap of %d; only %d of the %d most recently used among them", kept, limit, newest, limit)
	}
}

// TestReadHoldsAFrame: Read holds a frame of the file at a time, not the
// file: a store's file is about as large as the store, and the process
// that reads it holds the store too.
func TestReadHoldsAFrame(t *testing.T) {
	s, _ := filled(t, 64<<20, 80000, 1<<20)
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0+80000); err != nil {
		t.Fatal(err)
	}
	into, _ := store.New(64<<20, store.PerKind{}, 0)
	if store.OffHeapBytes() == 0 {
		t.Skip("the store's arenas are on the Go heap in this build")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	l, err := Read(bytes.NewReader(file.Bytes()), into, fp, t0+80000, 0, 1<<32)
	runtime.ReadMemStats(&after)
	if err != nil || l.Entries != 80000 {
		t.Fatalf("loaded %+v: %v", l, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > uint64(file.Len()/2) {
		t.Errorf("reading a file of %d bytes allocated %d bytes", file.Len(), n)
	}
}

// TestBands: the most recently used entries the budget holds, in up to
// maxBands bands of about as many bytes, the least recently used first.
func TestBands(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bytes  map[int64]int // by age
		budget int64
		want   []band
	}{
		{"empty", nil, 100, nil},
		{"one age", map[int64]int{5: 1000}, 100, []band{{5, 5}}},
		{"all fit", map[int64]int{0: 10, 1: 10, 2: 10, 3: 10, 4: 10, 5: 10, 6: 10, 7: 10}, 100,
			[]band{{7, 7}, {6, 6}, {5, 5}, {4, 4}, {3, 3}, {2, 2}, {1, 1}, {0, 0}}},
		{"the oldest left out", map[int64]int{0: 40, 10: 40, 20: 40}, 100, []band{{10, 10}, {0, 9}}},
		{"the budget crossed in a bucket", map[int64]int{0: 60, 1: 60}, 100, []band{{0, 0}}},
		{"more ages than bands", func() map[int64]int {
			m := map[int64]int{}
			for a := range int64(16) {
				m[a] = 10
			}
			return m
		}(), 1000, []band{{14, 15}, {12, 13}, {10, 11}, {8, 9}, {6, 7}, {4, 5}, {2, 3}, {0, 1}}},
		{"ages past the exact ones", map[int64]int{0: 10, exactAges: 10, 3 * exactAges: 10}, 1000,
			[]band{{exactAges + 1, exactAges + 1}, {exactAges, exactAges}, {0, exactAges - 1}}},
	} {
		var u tally
		for age, n := range tc.bytes {
			u.add(age, n, store.KindSuccess)
		}
		if got := u.bands(tc.budget); !slices.Equal(got, tc.want) {
			t.Errorf("%s: bands %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestFits: a file whose entries a store holds with room to spare, in
// bytes and in each kind's cap, is put in one pass; one it may not is put
// by bands, the most recently used last.
func TestFits(t *testing.T) {
	for _, tc := range []struct {
		name            string
		success, denial int // entries of 100 bytes
		budget          int64
		limits          store.PerKind
		want            bool
	}{
		{"empty", 0, 0, 1000, store.PerKind{}, true},
		{"three quarters of the budget", 6, 0, 800, store.PerKind{}, true},
		{"past three quarters", 7, 0, 800, store.PerKind{}, false},
		{"under the caps", 3, 3, 10000, store.PerKind{store.KindSuccess: 4, store.KindDenial: 4}, true},
		{"past a cap's three quarters", 3, 4, 10000, store.PerKind{store.KindSuccess: 4, store.KindDenial: 4}, false},
		{"no cap of a kind", 3, 90, 100000, store.PerKind{store.KindSuccess: 4}, true},
	} {
		var u tally
		for range tc.success {
			u.add(0, 100, store.KindSuccess)
		}
		for range tc.denial {
			u.add(0, 100, store.KindDenial)
		}
		if got := u.fits(tc.budget, tc.limits); got != tc.want {
			t.Errorf("%s: fits %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestReadRefusesTTLOverMax: a file holding an answer of a TTL over the
// longest the reader's block stores is refused whole, as a damaged one; at
// that longest TTL it loads.
func TestReadRefusesTTLOverMax(t *testing.T) {
	s, _ := filled(t, 16<<20, 100, 3600)
	var file bytes.Buffer
	if _, err := Write(&file, s.Paced(0), fp, t0+100); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		maxTTL int64
		want   error
	}{{3599, ErrDamaged}, {3600, nil}} {
		into, _ := store.New(16<<20, store.PerKind{}, 0)
		l, err := Read(bytes.NewReader(file.Bytes()), into, fp, t0+100, 0, tc.maxTTL)
		if !errors.Is(err, tc.want) || (err != nil) != (len(contents(into)) == 0) {
			t.Errorf("maxTTL %d: %d entries loaded, error %v; want %v", tc.maxTTL, l.Entries, err, tc.want)
		}
	}
}
