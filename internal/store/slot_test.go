package store

import (
	"fmt"
	"math/bits"
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
)

// TestSlotWidths checks the slot width stores of a few budgets get, and
// that it is the narrowest whose tag keeps the bits designed for, and whose
// location holds the last place an entry of the shard's last chunk can
// start at.
func TestSlotWidths(t *testing.T) {
	for _, tt := range []struct {
		capacity int64
		procs    int
		width    int
	}{
		{MinCapacity, 1, 6},
		{4 << 20, 2, 6},
		{16 << 20, 2, 6},
		{64 << 20, 4, 6}, // sixteen shards of 4 MiB
		{64 << 20, 2, 7}, // eight of 8 MiB
		{1 << 30, 16, 7},
		{4 << 30, 2, 7}, // sixty-four of 64 MiB
		{16 << 30, 2, 8},
		{MaxCapacity, 2, 8},
	} {
		s, err := newStoreOn(tt.procs, tt.capacity, PerKind{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		sh := &s.shards[0]
		f := sh.table.slotFormat
		name := fmt.Sprintf("%d MiB in %d shards of %d chunks", tt.capacity>>20, len(s.shards), len(sh.chunks))
		if f.width != tt.width {
			t.Errorf("%s: slots of %d bytes, want %d", name, f.width, tt.width)
		}
		last := location(len(sh.chunks)-1, chunkSize-entry.MinLen) + 1
		if last>>f.locBits != 0 || f.loc(last) != last-1 {
			t.Errorf("%s: %d location bits do not hold %#x", name, f.locBits, last)
		}
		if f.loc(f.slot(^uint64(0), last-1)) != last-1 || f.tag(f.slot(^uint64(0), last-1)) != f.tagOf(^uint64(0)) {
			t.Errorf("%s: a slot of the last location and the largest tag loses bits of either", name)
		}
		want := f.tagBitsFor(sh.budget)
		if got := f.tagBits(); got < want && f.width < 8 {
			t.Errorf("%s: tags of %d bits in slots of %d bytes, want at least %d", name, got, f.width, want)
		}
		if f.width > 6 {
			if narrower := newSlotFormat(f.width-1, f.locBits); narrower.tagBits() >= narrower.tagBitsFor(sh.budget) {
				t.Errorf("%s: slots of %d bytes where %d would keep tags of %d bits", name, f.width, f.width-1, narrower.tagBits())
			}
		}
		if f.width*8 != int(f.locBits)+f.tagBits() {
			t.Errorf("%s: %d-byte slots of %d location bits and %d tag bits", name, f.width, f.locBits, f.tagBits())
		}
	}
}

// TestLastChunkFound fills a store until every shard has written its last
// chunk, whose index takes the top location bit of its slots, and looks up
// every entry that chunk holds: a slot one location bit short would point
// its entries at a chunk half the store away.
func TestLastChunkFound(t *testing.T) {
	s, err := newStoreOn(2, 16<<20, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	putNames(t, s, 400_000)
	for k := range s.shards {
		sh := &s.shards[k]
		f := sh.table.slotFormat
		last := sh.allocated - 1
		if f.width == 8 || int(f.locBits) != chunkBits+bits.Len(uint(last)) {
			t.Fatalf("shard %d: slots of %d bytes, %d location bits; its last chunk, %d, does not take the top one", k, f.width, f.locBits, last)
		}
		var keys [][]byte
		sh.walkChunk(last, true, func(e entry.Entry) bool {
			keys = append(keys, append([]byte(nil), e.Key()...))
			return false
		})
		if len(keys) == 0 {
			t.Fatalf("shard %d: its last chunk holds no entry", k)
		}
		for _, key := range keys {
			h := s.Hash(key)
			i := sh.find(key, h)
			if i < 0 {
				t.Fatalf("shard %d: an entry of its last chunk is not found", k)
			}
			if c := int(f.loc(sh.table.load(i)) >> chunkBits); c != last {
				t.Fatalf("shard %d: an entry of chunk %d found in chunk %d", k, last, c)
			}
		}
	}
}
