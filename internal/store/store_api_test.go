package store

import (
	"fmt"
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
)

// TestGetLendsUnderTheLock: Get finds what Put stored, lets the callback
// change the entry's bookkeeping in place, and reports absence.
func TestGetLendsUnderTheLock(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, key := testEntry(t, entry.NewBuilder(), "a.example.org.", 7, 300, KindSuccess)
	s.Put(e, 0)
	h := s.Hash(key)
	if !s.Get(key, h, func(e entry.Entry) bool { e.Hit(1, 60); return true }) {
		t.Fatal("Get did not find the entry Put stored")
	}
	var hits int
	s.Get(key, h, func(e entry.Entry) bool { hits = e.Popularity(); return true })
	if hits != 1 {
		t.Errorf("hits %d after one Hit in a callback, want 1: the change did not stay", hits)
	}
	other, _ := entry.KeyFor("b.example.org.", 1, 1, false)
	if s.Get(other, s.Hash(other), func(entry.Entry) bool { t.Error("callback for an absent key"); return true }) {
		t.Error("Get found an entry never stored")
	}
}

// TestWalkVisitsEachLiveEntryOnce fills a store past its budget, so that
// entries were evicted and replaced, and walks it a chunk at a time: every
// live entry is visited once, garbage never, and what visit removes is gone
// and not counted as evicted.
func TestWalkVisitsEachLiveEntryOnce(t *testing.T) {
	s, err := New(4*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	live := map[string]uint32{}
	for i := range 40_000 {
		name := fmt.Sprintf("n%d.example.org.", i%30_000) // the last 10,000 replace earlier ones
		e, _ := testEntry(t, b, name, uint32(i), 3600, KindSuccess)
		s.Put(e, 0)
		live[name] = uint32(i)
	}
	for name := range live {
		key, _ := entry.KeyFor(name, 1, 1, false)
		if _, ok := s.lookup(key); !ok {
			delete(live, name) // evicted
		}
	}
	seen := map[string]int{}
	var c Cursor
	removed := 0
	for more := true; more; {
		calls := 0
		c, more = s.Walk(c, func(e entry.Entry) bool {
			calls++
			name := string(e.QName())
			seen[name]++
			var r entry.Record
			off := e.Records(new([3]int))
			e.Record(off, &r)
			if got := uint32(r.Rdata[0])<<24 | uint32(r.Rdata[1])<<16 | uint32(r.Rdata[2])<<8 | uint32(r.Rdata[3]); got != live[wireToText(name)] {
				t.Errorf("%s: visited version %d, the live one is %d", wireToText(name), got, live[wireToText(name)])
			}
			if len(seen)%2 == 0 {
				removed++
				return true
			}
			return false
		})
		if calls > chunkSize/int(headerLenOfTestEntry) {
			t.Fatalf("one Walk call visited %d entries: more than a chunk holds", calls)
		}
	}
	if len(seen) != len(live) {
		t.Errorf("walk visited %d names, %d are live", len(seen), len(live))
	}
	for name, n := range seen {
		if n != 1 {
			t.Errorf("%s visited %d times", wireToText(name), n)
		}
	}
	u := s.Usage()
	if got := u.Kinds[KindSuccess]; got != len(live)-removed {
		t.Errorf("%d entries after removing %d of %d, want %d", got, removed, len(live), len(live)-removed)
	}
}

// headerLenOfTestEntry bounds a test entry from below, for the most a chunk
// can hold.
const headerLenOfTestEntry = 32

// wireToText turns a wire name into presentation form.
func wireToText(w string) string {
	out := ""
	for i := 0; w[i] != 0; i += int(w[i]) + 1 {
		out += w[i+1:i+1+int(w[i])] + "."
	}
	return out
}

// TestUpdateReturnsItsOwn: next may hand back the entry it was lent, as
// one that keeps it as it is but for the queue (a replacement goes to
// main): here the put that stores it makes its room by turning the very
// span it lies in, compacting the entries after it over its bytes.
func TestUpdateReturnsItsOwn(t *testing.T) {
	s, sh, b := smallestStore(t)
	var keys [][]byte
	for i := range 40_000 {
		e, key := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), uint32(i), 3600, KindSuccess)
		s.Put(e, 0)
		for range 3 {
			s.touch(key) // kept by every pass
		}
		keys = append(keys, key)
	}
	// Entries stored again go to main, until its turning chunk has no
	// room left for one before its older span.
	for i := 0; sh.turning[mainQ] < 0 || sh.oldStart[mainQ]-sh.newEnd[mainQ] >= 64; i++ {
		if i == len(keys) {
			t.Fatal("main never turned a chunk with its room used up")
		}
		e, _ := testEntry(t, b, fmt.Sprintf("n%d.example.org.", i), uint32(i), 3600, KindSuccess)
		s.Put(e, 0)
	}
	for _, key := range keys {
		s.touch(key) // so that the entries after it are kept, compacted
	}
	c := sh.turning[mainQ]
	old := entry.Entry(sh.chunks[c][sh.oldStart[mainQ]:])
	key := append([]byte(nil), old.Key()...)
	want, _ := s.lookup(key)
	s.Update(key, 0, func(old entry.Entry) entry.Entry { return old })
	if got, ok := s.lookup(key); !ok || got != want {
		t.Errorf("after Update returned the entry it was lent, %s holds %d (found %t), want %d", dnsName(key), got, ok, want)
	}
	checkShards(t, s)
}
