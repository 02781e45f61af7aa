package store

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/compactcache/compactcache/internal/entry"
)

// An index slot is width bytes, fixed per store: the entry's location plus
// one in its low locBits (zero means empty), and above them the tag, the top
// bits of the entry's hash. A location needs chunkBits and the bits of the
// shard's largest chunk index, which its budget bounds, so a small store
// needs fewer of them than maxChunks would: its slots can be narrower, and
// the bytes saved hold entries. The tag needs about log2 of the largest
// table the shard can have (the bits that place a slot at its home) and 8
// more, so that keys sharing a home seldom share a tag: a tag that matches
// another key's costs a read of that entry, most often a cache miss.
// The width is the narrowest, of 6, 7 and 8 bytes, whose tag keeps that
// many bits (slotFormatFor); 8 where none does.
//
// The shifts below are masked to 63, which they never exceed, so that the
// compiler need not make a shift by 64 or more come out as zero.
type slotFormat struct {
	width    int    // bytes a slot takes
	locBits  uint   // the bits of the location plus one, the low ones
	tagShift uint   // 64 minus the tag's bits: a tag is the hash's top bits
	mask     uint64 // the slot's 8*width bits
	locMask  uint64 // the location's bits
}

// tagMargin is the bits a tag keeps beyond those a home takes.
const tagMargin = 8

func newSlotFormat(width int, locBits uint) slotFormat {
	return slotFormat{
		width:    width,
		locBits:  locBits,
		tagShift: 64 - (8*uint(width) - locBits),
		mask:     ^uint64(0) >> (64 - 8*width),
		locMask:  1<<locBits - 1,
	}
}

// slotFormatFor returns the slot format of a store whose shards have budget
// bytes each. The largest location is below chunks<<chunkBits, as an entry
// starts at least entry.MinLen bytes before its chunk's end, so one plus it
// fits in chunkBits and the bits of the last chunk's index.
func slotFormatFor(budget int64) slotFormat {
	chunks := budget / chunkSize
	locBits := chunkBits + uint(bits.Len64(uint64(chunks-1)))
	for width := 6; width < 8; width++ {
		f := newSlotFormat(width, locBits)
		if f.tagBits() >= f.tagBitsFor(budget) {
			return f
		}
	}
	return newSlotFormat(8, locBits)
}

// tagBits returns the bits of the tag.
func (f *slotFormat) tagBits() int { return 64 - int(f.tagShift) }

// tagBitsFor returns the bits a tag should keep in a shard of budget bytes:
// those of the largest table its slots could have, and tagMargin more.
func (f *slotFormat) tagBitsFor(budget int64) int {
	return bits.Len(uint(f.largestTable(budget))) + tagMargin
}

// largestTable returns the slots of the largest table a shard of budget
// bytes could have. A table grows only when growLoad sixteenths full, and
// only where the budget holds its entries and the larger table; an entry
// takes at least entry.MinLen bytes.
func (f *slotFormat) largestTable(budget int64) int {
	size := minTableBytes
	for {
		next := tableSizeAfter(size)
		entries := int64(growLoad * f.slotsIn(size) / 16)
		if entries*entry.MinLen+int64(next) > budget {
			return f.slotsIn(size)
		}
		size = next
	}
}

// slotsIn returns the slots a table of size bytes holds. A slot is read as
// the 8 bytes at its start, one unaligned load, and masked to its width: the
// last slot's load reads 8-width bytes past it, which the table must hold.
func (f *slotFormat) slotsIn(size int) int { return (size-8)/f.width + 1 }

// indexTable is a shard's index table (index.go): n slots of the format's
// width, little endian, in b.
type indexTable struct {
	slotFormat
	b []byte
	n int
}

func newIndexTable(b []byte, f slotFormat) indexTable {
	return indexTable{slotFormat: f, b: b, n: f.slotsIn(len(b))}
}

// load returns the value of slot i.
func (t *indexTable) load(i int) uint64 {
	at := i * t.width
	return binary.LittleEndian.Uint64(t.b[at:at+8]) & t.mask
}

// store sets slot i to v, leaving the bytes past it as they are.
func (t *indexTable) store(i int, v uint64) {
	at := i * t.width
	b := t.b[at : at+8]
	binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)&^t.mask|v)
}

// move copies the n slots from src on to dst on.
func (t *indexTable) move(dst, src, n int) {
	w := t.width
	copy(t.b[dst*w:(dst+n)*w], t.b[src*w:(src+n)*w])
}

// slot returns the slot value of an entry whose hash is h at loc.
func (f *slotFormat) slot(h, loc uint64) uint64 { return f.tagOf(h)<<(f.locBits&63) | loc + 1 }

// tagOf returns the tag of hash h, tag the tag of slot value v.
func (f *slotFormat) tagOf(h uint64) uint64 { return h >> (f.tagShift & 63) }
func (f *slotFormat) tag(v uint64) uint64   { return v >> (f.locBits & 63) }

// loc returns the location that slot value v holds.
func (f *slotFormat) loc(v uint64) uint64 { return v&f.locMask - 1 }

// relocate points slot i at loc, keeping its tag.
func (t *indexTable) relocate(i int, loc uint64) {
	t.store(i, t.load(i)&^t.locMask|loc+1)
}

// slotAddr returns the address of the slot where a probe for hash h starts.
func (t *indexTable) slotAddr(h uint64) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(t.b))) + uintptr(t.home(t.tagOf(h))*t.width)
}

// home returns the slot where a probe for tag starts: the tag scaled to the
// table's length, so that homes keep the order of tags whatever the length.
func (t *indexTable) home(tag uint64) int {
	hi, _ := bits.Mul64(tag<<(t.tagShift&63), uint64(t.n))
	return int(hi)
}
