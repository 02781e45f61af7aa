package store

import (
	"math/rand/v2"
	"testing"
)

func TestTableSizeAfter(t *testing.T) {
	const huge = hugePage
	tests := []struct{ n, want int }{
		{minTableBytes, 2 * minTableBytes},
		{minMappedTable, 2 * minMappedTable},
		{huge / 16, 3 * huge / 32}, // 128 KiB, a half more
		{3 * huge / 32, huge / 8},  // a third more
		{huge / 4, 3 * huge / 8},
		{3 * huge / 8, huge / 2},
		{huge / 2, 5 * huge / 8},     // a quarter more: 1.25 MiB
		{5 * huge / 8, 7 * huge / 8}, // 1.5625 MiB, rounded up to an eighth
		{7 * huge / 8, huge},         // 2.1875 MiB: at most a huge page
		{huge, 2 * huge},             // 1.25 huge pages, rounded up
		{2 * huge, 3 * huge},         // 2.5, rounded up
		{4 * huge, 5 * huge},         // a quarter more: whole huge pages
		{5 * huge, 7 * huge},         // 6.25, rounded up
		{16 * huge, 20 * huge},
	}
	for _, tt := range tests {
		if got := tableSizeAfter(tt.n); got != tt.want {
			t.Errorf("tableSizeAfter(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
	for n := minTableBytes; n < 1<<31; n = tableSizeAfter(n) {
		next := tableSizeAfter(n)
		switch {
		case n < 2*minMappedTable && next != 2*n,
			n >= 2*minMappedTable && n < huge/2 && next != n+n/2 && 3*next != 4*n,
			n >= huge/2 && n < huge && (next%(huge/8) != 0 || next > huge || 4*next < 5*n && next != huge),
			n >= huge && (next%huge != 0 || 4*next < 5*n || next-n > n/4+huge):
			t.Fatalf("%d bytes grow to %d", n, next)
		}
		if n >= minMappedTable && n%minMappedTable != 0 {
			t.Fatalf("a mapped table of %d bytes is not a whole number of %d-byte pages", n, minMappedTable)
		}
	}
}

// testFormats are slot formats of each width: those of a store of 16 MiB
// in four shards, of one of 1 GiB in sixteen, and of the largest store.
var testFormats = []slotFormat{
	newSlotFormat(6, chunkBits+5),
	newSlotFormat(7, chunkBits+9),
	newSlotFormat(8, chunkBits+chunkIndexBits),
}

// indexAlone is a shard with an index table of size bytes alone, whose
// slots locate nothing: the index's own operations (insertSlot, deleteSlot,
// slotOf) read only slots.
func indexAlone(size int, f slotFormat) *shard {
	return &shard{table: newIndexTable(make([]byte, size), f)}
}

// bytesFor returns the bytes of a table of n slots of format f.
func bytesFor(n int, f slotFormat) int { return (n-1)*f.width + 8 }

// randomTag returns a random tag of f, one in every of them from the last
// part of the tags, so that runs wrap around the table's end.
func randomTag(rng *rand.Rand, f slotFormat, every, part uint64) uint64 {
	if rng.Uint64N(every) == 0 {
		return 1<<f.tagBits() - 1 - rng.Uint64N(1<<f.tagBits()/part)
	}
	return rng.Uint64N(1 << f.tagBits())
}

// TestIndexRobinHood inserts and deletes slots at random, tags crowding the
// table's end so that runs wrap around to its start, and checks after each
// step that every slot present is found from its home, every one deleted is
// not, and the table stays in Robin Hood order.
func TestIndexRobinHood(t *testing.T) {
	for _, f := range testFormats {
		for _, n := range []int{256, 320, 448} {
			testRobinHood(t, f, n)
		}
	}
}

func testRobinHood(t *testing.T, f slotFormat, n int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), uint64(f.width)))
	sh := indexAlone(bytesFor(n, f), f)
	if sh.table.n != n {
		t.Fatalf("a table of %d bytes holds %d slots of %d, want %d", bytesFor(n, f), sh.table.n, f.width, n)
	}
	present := map[uint64]uint64{} // loc to tag
	var locs []uint64
	nextLoc := uint64(0)
	for step := range 20_000 {
		full := 16*(sh.count+1) > fullLoad*n
		if !full && (len(locs) == 0 || rng.IntN(2) == 0) {
			tag := randomTag(rng, f, 4, 64) // homes crowd the last sixty-fourth
			nextLoc++
			sh.insertSlot(f.slot(tag<<f.tagShift, nextLoc))
			present[nextLoc] = tag
			locs = append(locs, nextLoc)
		} else {
			k := rng.IntN(len(locs))
			loc := locs[k]
			i := sh.slotOf(loc, present[loc]<<f.tagShift)
			if i < 0 {
				t.Fatalf("%d slots, step %d: slot of location %d not found before its deletion", n, step, loc)
			}
			sh.deleteSlot(i)
			if sh.slotOf(loc, present[loc]<<f.tagShift) >= 0 {
				t.Fatalf("%d slots, step %d: location %d found after its deletion", n, step, loc)
			}
			delete(present, loc)
			locs[k] = locs[len(locs)-1]
			locs = locs[:len(locs)-1]
		}
		if i := sh.checkOrder(); i >= 0 {
			t.Fatalf("%d slots, step %d: slot %d out of order", n, step, i)
		}
		if sh.count != len(present) {
			t.Fatalf("%d slots, step %d: count %d, %d present", n, step, sh.count, len(present))
		}
	}
	for loc, tag := range present {
		if sh.slotOf(loc, tag<<f.tagShift) < 0 {
			t.Fatalf("%d slots: location %d not found", n, loc)
		}
	}
}

// TestIndexResizeKeepsSlots checks that rebuilds keep every slot, in order,
// in slots of each width: doubling from the smallest table to the largest
// kept on the heap, growing by eighths of a huge page from half of one, and
// in whole huge pages from one huge page to three; tags crowd the table's
// end, so that runs wrap around to its start.
func TestIndexResizeKeepsSlots(t *testing.T) {
	const huge = hugePage
	for _, f := range testFormats {
		testResizeKeepsSlots(t, f, minTableBytes, minMappedTable-8, minMappedTable)
		// From 1 MiB to 1.25 and 1.75, in the regions of a large store.
		testResizeKeepsSlots(t, f, huge/2, 3*huge/4, 7*huge/8)
	}
	// Just past the growth to three huge pages, the slowest case under the
	// race detector, in the narrowest slots alone.
	testResizeKeepsSlots(t, testFormats[0], huge, 2*huge+huge/8, 3*huge)
}

// testResizeKeepsSlots fills a table of from bytes of format f until it
// holds as many slots as it may in to bytes, which takes a table of want.
func testResizeKeepsSlots(t *testing.T, f slotFormat, from, to, want int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, uint64(from)))
	sh := indexAlone(from, f)
	sh.arena = newArena(0, newSharedTables(1<<30))
	defer sh.arena.release()
	tags := map[uint64]uint64{}
	wrapped := 0 // rebuilds that left a run wrapped around
	for loc := uint64(1); 16*sh.count < growLoad*f.slotsIn(to); loc++ {
		if 16*(sh.count+1) > growLoad*sh.table.n {
			sh.resize(tableSizeAfter(len(sh.table.b)))
			if i := sh.checkOrder(); i >= 0 {
				t.Fatalf("after a rebuild to %d slots of %d bytes, slot %d is out of order", sh.table.n, f.width, i)
			}
			if v := sh.table.load(0); v != 0 && sh.distance(v, 0) > 0 {
				wrapped++
			}
		}
		tag := randomTag(rng, f, 64, 128) // twice as dense in the last 128th
		sh.insertSlot(f.slot(tag<<f.tagShift, loc))
		tags[loc] = tag
	}
	for loc, tag := range tags {
		if sh.slotOf(loc, tag<<f.tagShift) < 0 {
			t.Fatalf("location %d lost in the rebuilds of %d-byte slots from %d to %d bytes", loc, f.width, from, len(sh.table.b))
		}
	}
	if len(sh.table.b) != want {
		t.Fatalf("%d-byte slots from %d bytes: %d after the rebuilds, want %d", f.width, from, len(sh.table.b), want)
	}
	if wrapped == 0 {
		t.Fatalf("%d-byte slots from %d bytes: no rebuild left a run wrapped around the table's end", f.width, from)
	}
}
