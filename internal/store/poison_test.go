//go:build compactcache_poison

package store

import (
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
)

// TestPoisonShowsUseAfterTheLock keeps the entries Get, Update and Walk
// lend past their callbacks, as a caller must not: in this build every byte
// of them is poison by then, so that a test of the caller reads garbage.
func TestPoisonShowsUseAfterTheLock(t *testing.T) {
	s, err := New(MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, key := testEntry(t, entry.NewBuilder(), "a.example.org.", 7, 300, KindSuccess)
	s.Put(e, 0)
	var kept entry.Entry
	check := func(what string) {
		t.Helper()
		if len(kept) == 0 {
			t.Fatalf("%s lent nothing", what)
		}
		for _, b := range kept {
			if b != poisonByte {
				t.Fatalf("the entry %s lent, kept past the callback, still reads as an entry", what)
			}
		}
		kept = nil
	}
	s.Get(key, s.Hash(key), func(e entry.Entry) bool { kept = e; return true })
	check("Get")
	s.Update(key, 0, func(old entry.Entry) entry.Entry { kept = old; return nil })
	check("Update")
	s.Walk(Cursor{}, func(e entry.Entry) bool { kept = e; return false })
	check("Walk")
	if _, ok := s.lookup(key); !ok {
		t.Fatal("the entry itself is gone")
	}
}
