package store

import (
	"github.com/compactcache/compactcache/internal/entry"

	"runtime"
	"testing"
	"time"
)

// filledStore returns the arenas of a store filled past minMappedTable in
// every shard, and the bytes they should have mapped; the store itself is
// unreachable once it returns.
func filledStore(t *testing.T) ([]*arena, int64) {
	t.Helper()
	s, err := New(8*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	putNames(t, s, 60_000)
	var arenas []*arena
	var want int64
	for i := range s.shards {
		sh := &s.shards[i]
		if len(sh.table.b) < minMappedTable {
			t.Fatalf("shard %d: table of %d bytes is on the heap; fill more", i, len(sh.table.b))
		}
		want += int64(len(sh.table.b))
		for _, c := range sh.chunks {
			if c != nil {
				want += chunkSize
			}
		}
		arenas = append(arenas, sh.arena)
	}
	return arenas, want
}

func mappedBy(arenas []*arena) (n int64) {
	for _, a := range arenas {
		n += a.mapped()
	}
	return n
}

// waitReleased runs GC cycles until the arenas hold nothing mapped.
func waitReleased(t *testing.T, arenas []*arena) {
	t.Helper()
	for range 100 {
		runtime.GC()
		if mappedBy(arenas) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d bytes still mapped after the store became unreachable", mappedBy(arenas))
}

func TestArenaMapsWhatIsCountedAndReleasesIt(t *testing.T) {
	if !mapsMemory {
		t.Skip("arenas are on the Go heap in this build")
	}
	arenas, want := filledStore(t)
	got := mappedBy(arenas)
	if got != want {
		t.Fatalf("%d bytes mapped, the store counts %d in chunks and tables", got, want)
	}
	if total := OffHeapBytes(); total < got {
		t.Fatalf("OffHeapBytes() = %d, less than this store's %d", total, got)
	}
	waitReleased(t, arenas)
}

// TestArenaKeptWhileShardHeld holds a shard, as a request does from
// store.shard to its Unlock, with nothing else referring to the store, and
// reads entries across GC cycles: the memory must stay mapped (unmapped, the
// reads would fault) until the shard is dropped too.
func TestArenaKeptWhileShardHeld(t *testing.T) {
	if !mapsMemory {
		t.Skip("arenas are on the Go heap in this build")
	}
	s, err := New(8*MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := entry.NewBuilder()
	e, key := testEntry(t, b, "held.example.org.", 7, 3600, KindSuccess)
	s.Put(e, 0)
	h := s.Hash(key)
	sh := s.shard(h)
	arenas := []*arena{sh.arena}
	s = nil

	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // cleanups run on a goroutine of their own
		sh.mu.Lock()
		e := sh.get(key, h)
		if e == nil {
			sh.mu.Unlock()
			t.Fatal("entry gone while its shard is held")
		}
		var r entry.Record
		off := e.Records(new([3]int))
		e.Record(off, &r)
		v := r.Rdata[3]
		sh.mu.Unlock()
		if v != 7 {
			t.Fatalf("read %d from the held shard, stored 7", v)
		}
		if mappedBy(arenas) == 0 {
			t.Fatal("the shard's memory was released while the shard is held")
		}
	}
	runtime.KeepAlive(sh)
	sh = nil
	waitReleased(t, arenas)
}
