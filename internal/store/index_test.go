package store

import (
	"math/rand/v2"
	"testing"
)

func TestTableSizeAfter(t *testing.T) {
	huge := hugePage / slotBytes
	tests := []struct{ n, want int }{
		{256, 512},
		{huge / 4, huge / 2},
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
	for n := minTableSlots; n < 1<<28; n = tableSizeAfter(n) {
		next := tableSizeAfter(n)
		switch {
		case n < huge/2 && next != 2*n,
			n >= huge/2 && n < huge && (next%(huge/8) != 0 || next > huge || 4*next < 5*n && next != huge),
			n >= huge && (next%huge != 0 || 4*next < 5*n || next-n > n/4+huge):
			t.Fatalf("%d slots grow to %d", n, next)
		}
		if n*slotBytes >= minMappedTable && n*slotBytes%minMappedTable != 0 {
			t.Fatalf("a mapped table of %d slots is not a whole number of %d-byte pages", n, minMappedTable)
		}
	}
}

// slotTable is a shard with an index alone, whose slots locate nothing: the
// index's own operations (insertSlot, deleteSlot, slotOf) read only slots.
func slotTable(n int) *shard { return &shard{table: make([]uint64, n)} }

// slotValue is a slot for tag and a location loc unique to the test.
func slotValue(tag, loc uint64) uint64 { return tag<<locBits | loc + 1 }

// TestIndexRobinHood inserts and deletes slots at random, tags crowding the
// table's end so that runs wrap around to its start, and checks after each
// step that every slot present is found from its home, every one deleted is
// not, and the table stays in Robin Hood order.
func TestIndexRobinHood(t *testing.T) {
	for _, n := range []int{256, 320, 448} {
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		sh := slotTable(n)
		present := map[uint64]uint64{} // loc to tag
		var locs []uint64
		nextLoc := uint64(0)
		for step := range 20_000 {
			full := 16*(sh.count+1) > fullLoad*n
			if !full && (len(locs) == 0 || rng.IntN(2) == 0) {
				tag := rng.Uint64N(1 << tagBits)
				if rng.IntN(4) == 0 {
					tag = 1<<tagBits - 1 - rng.Uint64N(1<<tagBits/64) // the last sixty-fourth of homes
				}
				nextLoc++
				sh.insertSlot(slotValue(tag, nextLoc))
				present[nextLoc] = tag
				locs = append(locs, nextLoc)
			} else {
				k := rng.IntN(len(locs))
				loc := locs[k]
				i := sh.slotOf(loc, present[loc]<<locBits)
				if i < 0 {
					t.Fatalf("%d slots, step %d: slot of location %d not found before its deletion", n, step, loc)
				}
				sh.deleteSlot(i)
				if sh.slotOf(loc, present[loc]<<locBits) >= 0 {
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
			if sh.slotOf(loc, tag<<locBits) < 0 {
				t.Fatalf("%d slots: location %d not found", n, loc)
			}
		}
	}
}

// TestIndexResizeKeepsSlots checks that rebuilds keep every slot, in order:
// doubling from the smallest table to the largest kept on the heap, growing
// by eighths of a huge page from half of one, and in whole huge pages from
// one huge page to three; tags
// crowd the table's end, so that runs wrap around to its start.
func TestIndexResizeKeepsSlots(t *testing.T) {
	huge := hugePage / slotBytes
	for _, tc := range []struct{ from, to, want int }{
		{minTableSlots, minMappedTable/slotBytes - 1, minMappedTable / slotBytes},
		{huge, 2*huge + huge/8, 3 * huge}, // just past the growth to three
		// From 1 MiB to 1.25 and 1.75, in the regions of a large store.
		{huge / 2, 3 * huge / 4, 7 * huge / 8},
	} {
		rng := rand.New(rand.NewPCG(7, uint64(tc.from)))
		sh := slotTable(tc.from)
		sh.arena = newArena(0, newSharedTables(1<<30))
		defer sh.arena.release()
		tags := map[uint64]uint64{}
		wrapped := 0 // rebuilds that left a run wrapped around
		for loc := uint64(1); 16*sh.count < growLoad*tc.to; loc++ {
			if 16*(sh.count+1) > growLoad*len(sh.table) {
				sh.resize(tableSizeAfter(len(sh.table)))
				if i := sh.checkOrder(); i >= 0 {
					t.Fatalf("after a rebuild to %d slots, slot %d is out of order", len(sh.table), i)
				}
				if v := sh.table[0]; v != 0 && sh.distance(v, 0) > 0 {
					wrapped++
				}
			}
			tag := rng.Uint64N(1 << tagBits)
			if rng.IntN(64) == 0 {
				tag = 1<<tagBits - 1 - rng.Uint64N(1<<tagBits/128) // twice as dense there
			}
			sh.insertSlot(slotValue(tag, loc))
			tags[loc] = tag
		}
		for loc, tag := range tags {
			if sh.slotOf(loc, tag<<locBits) < 0 {
				t.Fatalf("location %d lost in the rebuilds from %d to %d slots", loc, tc.from, len(sh.table))
			}
		}
		if len(sh.table) != tc.want {
			t.Fatalf("from %d slots: %d after the rebuilds, want %d", tc.from, len(sh.table), tc.want)
		}
		if wrapped == 0 {
			t.Fatalf("from %d slots: no rebuild left a run wrapped around the table's end", tc.from)
		}
	}
}
