package store

import (
	"bytes"
	"math/bits"
	"unsafe"

	"github.com/compactcache/compactcache/internal/entry"
)

// A shard's index is an open addressing table of slots (slot.go), linear
// probing in Robin Hood order: a slot's home is its tag scaled to the table's
// length, and an insert that meets a slot nearer its own home than the new
// one is to its own takes that slot and moves the other on. So every run of
// slots is in order of home, a probe for a missing key stops at the first
// slot whose home lies past its own, and the table can be kept seven eighths
// full with short probes either way.
//
// Scaling the tag (rather than masking it) lets a table have any length, so
// that a large one grows by about a quarter at a time (tableSizeAfter), not
// by doubling. It also keeps the homes in the order of the tags whatever the
// length, so that a rebuild reads the old table and writes the new one front
// to back.
const (
	// Entries a table takes before it grows, and before entries are dropped
	// for room where the budget does not let it grow, in sixteenths.
	growLoad = 14
	fullLoad = 15

	// minTableBytes is the size of a shard's first table.
	minTableBytes = 2 << 10

	cacheLine = 64
)

// distance returns how far slot i, holding v, lies past v's home.
func (sh *shard) distance(v uint64, i int) int {
	d := i - sh.table.home(sh.table.tag(v))
	if d < 0 {
		d += sh.table.n
	}
	return d
}

// next returns the slot after i.
func (sh *shard) next(i int) int {
	if i++; i == sh.table.n {
		return 0
	}
	return i
}

// find returns the table index of key's slot, or -1.
func (sh *shard) find(key []byte, h uint64) int {
	tag := sh.table.tagOf(h)
	i := sh.table.home(tag)
	for d := 0; ; d++ {
		v := sh.table.load(i)
		if v == 0 {
			return -1
		}
		if sh.table.tag(v) == tag {
			sh.prefetchTail(v)
			if bytes.Equal(sh.at(v).Key(), key) {
				return i
			}
		}
		if sh.distance(v, i) < d {
			return -1
		}
		i = sh.next(i)
	}
}

// prefetchTail asks for the two cache lines after the first of the entry
// slot value v locates. The key is compared in the first, and a hit reads
// its records from those after: asked for now, their misses overlap the
// first's instead of following it, which counts most where the store is
// larger than the TLB reaches. One past the chunk's end costs a fetch at most:
// a prefetch neither faults nor waits.
func (sh *shard) prefetchTail(v uint64) {
	loc := sh.table.loc(v)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(sh.chunks[loc>>chunkBits]))) + uintptr(loc&(chunkSize-1))
	prefetch(p + cacheLine)
	prefetch(p + 2*cacheLine)
}

// slotOf returns the table index of the slot that locates the entry at loc,
// or -1 when the entry is garbage (replaced or evicted).
func (sh *shard) slotOf(loc uint64, h uint64) int {
	i := sh.table.home(sh.table.tagOf(h))
	for d := 0; ; d++ {
		v := sh.table.load(i)
		if v == 0 {
			return -1
		}
		if sh.table.loc(v) == loc {
			return i
		}
		if sh.distance(v, i) < d {
			return -1
		}
		i = sh.next(i)
	}
}

// at returns the entry a slot value locates.
func (sh *shard) at(v uint64) entry.Entry {
	loc := sh.table.loc(v)
	b := sh.chunks[loc>>chunkBits][loc&(chunkSize-1):]
	n := entry.SizeAt(b)
	return entry.Entry(b[:n:n])
}

func location(chunk, off int) uint64 { return uint64(chunk)<<chunkBits | uint64(off) }

// insertSlot adds v to the table; the caller made room. v goes where a probe
// for it would stop, and the rest of that run moves on a slot, each one
// further from its home: a copy, rather than a swap at every slot.
func (sh *shard) insertSlot(v uint64) {
	t := &sh.table
	i := sh.table.home(t.tag(v))
	for d := 0; t.load(i) != 0 && sh.distance(t.load(i), i) >= d; d++ {
		i = sh.next(i)
	}
	if t.load(i) != 0 {
		sh.shiftOn(i)
		sh.slotMoves++
	}
	t.store(i, v)
	sh.count++
}

// shiftOn moves the slots from i up to the next empty one on by one, leaving
// slot i free.
func (sh *shard) shiftOn(i int) {
	t := &sh.table
	j := i
	for t.load(j) != 0 {
		if j++; j == t.n {
			// The run wraps around: its part at the start moves on,
			// the last slot's value becomes the first's.
			k := 0
			for t.load(k) != 0 {
				k++
			}
			t.move(1, 0, k)
			t.store(0, t.load(t.n-1))
			t.move(i+1, i, t.n-1-i)
			return
		}
	}
	t.move(i+1, i, j-i)
}

// deleteSlot empties slot i, moving the rest of its run back a slot until a
// slot at its home, so that lookups need no tombstones.
func (sh *shard) deleteSlot(i int) {
	t := &sh.table
	for j := sh.next(i); t.load(j) != 0 && sh.distance(t.load(j), j) > 0; j = sh.next(j) {
		t.store(i, t.load(j))
		i = j
	}
	t.store(i, 0)
	sh.count--
	sh.slotMoves++
}

// checkOrder reports the first slot out of Robin Hood order, or -1: a slot
// past its home whose predecessor is empty or lies further past its own.
func (sh *shard) checkOrder() int {
	t := &sh.table
	for i := range t.n {
		v := t.load(i)
		if v == 0 {
			continue
		}
		d := sh.distance(v, i)
		if d == 0 {
			continue
		}
		p := (i + t.n - 1) % t.n
		if w := t.load(p); w == 0 || sh.distance(w, p)+1 < d {
			return i
		}
	}
	return -1
}

// tableSizeAfter returns the bytes of the table that replaces one of size
// bytes: twice as many up to 128 KiB; then the next size of the form 2^k or
// 3<<k (a half or a third more) up to half a huge page; then a quarter more,
// rounded up to an eighth of a huge page, up to a huge page; then a quarter
// more, rounded up to whole huge pages. The smallest tables double, since
// every rebuild moves all their slots and small steps would move each several
// times while a shard fills; larger ones, which take a share of a small
// store's budget and hold most of a large store's index, grow in steps that
// keep them nearly as full as they may be. The sizes from minMappedTable to
// a huge page are multiples of it that the store's shared regions hold in
// huge pages (inRegions), and the larger tables are mapped alone in whole huge
// pages: a table that lay partly in small pages would cost a page fault
// every 4 KiB as it is filled, several microseconds each on a virtual
// machine, and most of its probes would miss the TLB. The sizes are the
// same whatever the width of the slots: a table of narrower ones holds more.
func tableSizeAfter(size int) int {
	switch {
	case size < 2*minMappedTable:
		return 2 * size
	case size < hugePage/2 && size&(size-1) == 0:
		return size + size/2
	case size < hugePage/2:
		return 1 << bits.Len(uint(size))
	case size < hugePage:
		return min(roundUp(size+size/4, hugePage/8), hugePage)
	}
	return roundUp(size+size/4, hugePage)
}

// roundUp returns n rounded up to a multiple of step.
func roundUp(n, step int) int { return (n + step - 1) / step * step }

// makeTableRoom keeps the table at most growLoad sixteenths full while the
// budget allows it to grow, and at most fullLoad sixteenths otherwise, when
// it gives up a chunk for it where the chunks have room to spare
// (giveUpChunk), and drops entries where they do not (shed).
func (sh *shard) makeTableRoom(now int64, d *Displaced) {
	for 16*(sh.count+1) > growLoad*sh.table.n {
		if sh.mayGrow() {
			sh.resize(tableSizeAfter(len(sh.table.b)))
			continue
		}
		if 16*(sh.count+1) <= fullLoad*sh.table.n {
			return // fuller, rather than drop entries the chunks hold
		}
		if sh.giveUpChunk(now, d) {
			continue
		}
		sh.shed(now, d)
	}
}

// mayGrow reports whether the budget holds the table grown. The bytes the
// larger table adds are weighed first: a shard at its budget, whose table
// stays between growLoad and fullLoad, has no room for them, and would
// otherwise ask the shared regions, under their store-wide lock, whether
// the table would be mapped alone, on every insert.
func (sh *shard) mayGrow() bool {
	size := len(sh.table.b)
	return sh.held+int64(tableSizeAfter(size)-size) <= sh.budget && sh.held+sh.growthRoom() <= sh.budget
}

// growthRoom is the budget that growing the table takes: the bytes it adds,
// and where the new table is mapped on its own, the old table's too, which
// stays mapped beside it while it is filled, so that the shard is within its
// budget throughout.
func (sh *shard) growthRoom() int64 {
	size := len(sh.table.b)
	next := tableSizeAfter(size)
	if sh.arena.mapsAlone(next) {
		return int64(next)
	}
	return int64(next - size)
}

// resize rebuilds the table in one of size bytes. The old table's runs are
// in order of home, so of tag, and so of home in the new table too, but for
// slots that share an old home: read from an empty slot on, most land at
// their home or just past the one before, with no probe; the few out of
// order, and those whose run would pass the end, take insertSlot.
func (sh *shard) resize(size int) {
	old := sh.table
	sh.held += int64(size - len(old.b))
	sh.table = newIndexTable(sh.arena.table(size), old.slotFormat)
	defer sh.publish()
	sh.slotMoves++
	sh.count = 0
	t := &sh.table
	next, last := 0, 0 // the slot after those placed in order, and the last one's home
	place := func(v uint64) {
		h := sh.table.home(t.tag(v))
		if p := max(h, next); h >= last && p < t.n && t.load(p) == 0 {
			t.store(p, v)
			sh.count++
			next, last = p+1, h
			return
		}
		sh.insertSlot(v)
		for next < t.n && t.load(next) != 0 {
			next++ // the insert moved the slots placed on
		}
	}
	start := 0
	for old.load(start) != 0 {
		start++ // a table is never full
	}
	for i := start; i < old.n; i++ {
		if v := old.load(i); v != 0 {
			place(v)
		}
	}
	for i := range start {
		if v := old.load(i); v != 0 {
			place(v)
		}
	}
	sh.arena.free(old.b)
}
