package store

import (
	"fmt"
	"unsafe"

	"github.com/compactcache/compactcache/internal/entry"
)

// Eviction is S3-FIFO (Yang et al., "FIFO queues are all you need for cache
// eviction", SOSP 2023) on a shard's chunks, in bytes. Two FIFO queues of
// chunks take the shard's chunks between them:
//
//   - probation, where new entries are appended. When it needs room, its
//     oldest entries are passed: the entries hit since they were stored are
//     promoted to main, the others dropped (refused admission, counted apart
//     from evictions) and their keys remembered in the ghost. So a name
//     asked once, by a scan, a crawler or a flood of random names, holds its
//     bytes for a short while and never pushes out the names asked again.
//   - main, where promoted entries go, and new entries whose key the ghost
//     remembers (asked again since probation dropped it), and entries that
//     replace one of the same key (a refresh, an answer fetched again). When
//     it needs room, its oldest chunk is passed CLOCK style: the entries
//     with hits left are compacted to its front, one hit spent, and the
//     chunk becomes main's newest; the others are evicted.
//
// As in S3-FIFO, whose queues evict only once the cache is full, probation
// holds what main does not use: it gives main its oldest chunk whenever
// main needs one, as long as it keeps probationShare of the chunks, and
// passes its own oldest chunk otherwise, copying what it promotes to main's
// newest chunk, whose room main makes by passing its own oldest.
//
// A queue passes such a chunk an entry at a time (turn): the chunk moves to
// the end of the queue as it is, new entries are written from its start on,
// and its entries pass a few KiB ahead of them, so that every chunk holds
// entries throughout, rather than one of each queue starting again with all
// the room its pass freed.
//
// Each entry counts its hits, 0 to 3, in two bits of its header
// (entry.Freq): a hit is one write to the entry the hit has just read, under
// the shard lock it already holds, and the policy keeps no state outside the
// chunks but the ghost. An entry expired beyond the serve-stale window is
// dropped whatever its hits. An expired one within it, kept only for
// serve_stale, survives a pass only if it was hit since the last, and leaves
// it with no hit to spend: it holds its bytes for at most one more round
// unless clients still ask for it.
//
// The ghost (ghost.go) remembers the keys probation dropped, a 12-bit mark
// each, about five for every four entries of the reference workload the
// budget holds: its bytes are counted in the budget from the start, and it
// is made when the shard first drops an entry from probation. It forgets
// them oldest first, in buckets of ten marks. Entries over trustedSize bytes
// are remembered only tentatively but for a chance of trustedSize/size: a
// tentative key asked again goes through probation once more, remembered in
// full when dropped again. A large entry asked twice costs main the bytes of
// several small ones asked as often; one asked three times is as likely to
// be asked again. A tentative mark takes a lane of its bucket without moving
// the others, so that the keys remembered in full last as many drops of such
// keys however many large names probation drops between them.
//
// Passing a chunk works on that one chunk. Entries move between chunks only
// to main's newest chunk, which a walk visits after every other (Walk); a
// turning chunk holds the entries written since its turn began in [0,
// newEnd) and the older ones not yet passed in [oldStart, used) (spans).
//
// A key the ghost remembers in full goes to main only if it was asked again
// within a readmitShare-th of main's round, the time an entry spends in main
// from one pass of its chunk to the next, which an entry not hit in it does
// not outlive. Time here is the ghost's clock, the marks it has pushed, so
// that a mark's lane tells its age (ghost.go); main's round is its chunks
// times the mean ticks between two of its passes. A key asked again later
// than that goes through probation once more, its mark the newest when
// probation drops it again: in main it would likely have been dropped before
// its next ask, pushing out names asked more often on its way. So a name
// asked about once per round of main, of a Zipf tail or of a scan of the same
// names, comes back to main only when asked twice close together, and main,
// turning the slower for it, keeps longer the names it holds: more of a
// scan's names stay in main from one scan to the next, as W-TinyLFU keeps
// them, whose sketch refuses the names asked less often than those they
// would push out. Before main's first pass its round is unknown, and the
// ghost readmits every key it remembers in full.
//
// The probation share, the ghost's size, trustedSize and readmitShare were
// chosen on the traces of bench/trace (BENCHMARKS.md). The names of a flood
// asked again and those of a scan of the same names come back after about as
// many drops, so that no length of the ghost alone keeps the ones and
// forgets the others: a shorter ghost forgets the hottest names of a flood
// between their asks, and readmits too few of a scan's names to hold any; a
// longer one, or a larger trustedSize, readmits more of them than main holds
// until they are asked again, pushing out names asked more often. What tells
// them apart is the flood's large names, asked once: they take no lifetime
// from the marks of the names asked again, while their own tentative marks,
// pushed off by the next marks in full, last too short a time for a scan's
// large names to come back through them. The gate on main's round lets the
// ghost be longer than that tension allowed without it (a mark for 128 bytes
// rather than 160): the keys a longer ghost would readmit only for main to
// drop them unasked are those it sends through probation again.
const (
	probationQ = iota
	mainQ
	numQueues
	noQueue = numQueues
)

const (
	// probationShare is the percent of the chunks probation keeps when
	// main needs every other one; at least minProbation chunks.
	probationShare = 5
	minProbation   = 1

	// ghostBytes is the budget for each byte of the ghost: a mark, a byte
	// and a half, for every 128 bytes, about four fifths of what an entry
	// of the reference workload takes with its index slot.
	ghostBytes = 85

	// trustedSize is the largest entry the ghost remembers in full at its
	// first drop.
	trustedSize = 192

	// readmitShare: a key the ghost remembers in full goes to main only if
	// it was asked again within this share of main's round.
	readmitShare = 5
)

// queue is a FIFO of chunks: ids holds them from head on, oldest first.
// pushed counts the chunks ever queued: the chunk at position k from the
// head was the (pushed-n+k)-th, so that a walk can tell the chunks queued
// since it passed.
type queue struct {
	ids    []uint16
	head   int
	n      int
	pushed uint64
}

// at returns the k-th oldest chunk of q.
func (q *queue) at(k int) int { return int(q.ids[(q.head+k)%len(q.ids)]) }

// first returns the number pushed gave q's oldest chunk as it was queued.
func (q *queue) first() uint64 { return q.pushed - uint64(q.n) }

// tail returns q's newest chunk, -1 when q has none.
func (q *queue) tail() int {
	if q.n == 0 {
		return -1
	}
	return q.at(q.n - 1)
}

// initQueues readies the queues for a shard of rings chunks.
func (sh *shard) initQueues(rings int) {
	for q := range sh.queues {
		sh.queues[q].ids = make([]uint16, rings)
	}
	sh.in = make([]uint8, rings)
	for c := range sh.in {
		sh.in[c] = noQueue
	}
	sh.place = make([]uint16, rings)
	sh.turning = [numQueues]int{-1, -1}
	sh.probation = min(max(rings*probationShare/100, minProbation), rings/2)
	sh.coin = 0x9e3779b97f4a7c15
}

// enqueue makes chunk c queue q's newest.
func (sh *shard) enqueue(q, c int) {
	qu := &sh.queues[q]
	i := (qu.head + qu.n) % len(qu.ids)
	qu.ids[i] = uint16(c)
	qu.n++
	qu.pushed++
	sh.in[c], sh.place[c] = uint8(q), uint16(i)
}

// dequeue takes queue q's oldest chunk out of it and returns it. Its entries
// are about to move: cursors into it are forgotten.
func (sh *shard) dequeue(q int) int {
	qu := &sh.queues[q]
	if qu.n == 0 {
		panic("compactcache: store: a shard's queue ran out of chunks")
	}
	c := int(qu.ids[qu.head])
	qu.head = (qu.head + 1) % len(qu.ids)
	qu.n--
	sh.in[c] = noQueue
	sh.forget(c)
	if q == mainQ {
		sh.passedMain()
	}
	return c
}

// tick counts a mark the ghost pushed.
func (sh *shard) tick() { sh.ghostClock++ }

// passedMain times a pass of main's oldest chunk on the ghost's clock: the
// mean of the gaps between passes moves a sixteenth of the way to this one.
func (sh *shard) passedMain() {
	sh.mainGap += (sh.ghostClock-sh.mainPassed)<<8/16 - sh.mainGap/16
	sh.mainPassed = sh.ghostClock
}

// mainRound returns main's round in ticks of the ghost's clock: its chunks,
// and the one it passes, times the mean ticks between two passes.
func (sh *shard) mainRound() uint64 {
	return sh.mainGap * uint64(sh.queues[mainQ].n+1) >> 8
}

// readmit reports whether the key of hash h, whose entry probation dropped,
// goes to main: when the ghost remembers it in full, and it was asked again
// within a readmitShare-th of main's round or main has not passed a chunk
// yet. The ghost forgets it either way (recall).
func (sh *shard) readmit(h uint64) bool {
	age := sh.recall(h)
	if age < 0 {
		return false
	}
	if sh.mainGap == 0 {
		return true
	}
	return uint64(age)*uint64(len(sh.ghost)/ghostBucketWords)*readmitShare <= sh.mainRound()
}

func (sh *shard) put(e entry.Entry, h uint64, now int64, d *Displaced) {
	if len(e) > entry.MaxLen {
		panic("compactcache: entry over maxEntryLen reached the store")
	}
	q, freq := probationQ, e.Freq()
	i := sh.find(e.Key(), h)
	if i >= 0 {
		// Asked again: a refresh, or an answer fetched again. It keeps
		// the hits of the entry it replaces, which making room removes
		// uncounted where it reaches it (passSpan): replaced, not
		// displaced.
		v := sh.table.load(i)
		q, freq = mainQ, max(freq, sh.at(v).Freq())
		sh.replacing = sh.table.loc(v) + 1
	}
	moves := sh.slotMoves
	sh.makeTableRoom(now, d)
	if i < 0 && sh.readmit(h) {
		q = mainQ
	}
	chunk, off := sh.reserve(q, len(e), now, d)
	if i >= 0 {
		sh.replacing = 0
	}
	stored := entry.Entry(sh.chunks[chunk][off : off+len(e)])
	copy(stored, e)
	stored.SetFreq(freq)
	v := sh.table.slot(h, location(chunk, off))

	if sh.slotMoves != moves {
		i = sh.find(e.Key(), h) // making room dropped entries, and maybe the old one
	}
	if i >= 0 {
		sh.tally(sh.at(sh.table.load(i)), -1)
		sh.table.store(i, v)
	} else {
		sh.insertSlot(v)
	}
	sh.tally(stored, 1)
	if k := KindOf(stored); sh.limits[k] > 0 && sh.kinds[k] > sh.limits[k] {
		sh.evictOldest(k, location(chunk, off), d)
	}
}

// reserve returns a place for n bytes at the end of queue q: in its newest
// chunk, in a chunk allocated while the budget allows, or in room that
// passing entries makes.
func (sh *shard) reserve(q, n int, now int64, d *Displaced) (chunk, off int) {
	for {
		if t := sh.queues[q].tail(); t >= 0 {
			if t != sh.turning[q] {
				if int(sh.used[t])+n <= len(sh.chunks[t]) {
					off = int(sh.used[t])
					sh.used[t] += uint32(n)
					return t, off
				}
			} else if sh.newEnd[q]+n <= sh.oldStart[q] {
				off = sh.newEnd[q]
				sh.newEnd[q] += n
				return t, off
			}
		}
		if c, size := sh.allocated, sh.nextChunkSize(); c < len(sh.chunks) && size > 0 {
			sh.chunks[c] = sh.arena.chunk(c, size)
			sh.allocated++
			sh.held += int64(size)
			sh.enqueue(q, c)
			continue
		}
		if sh.turn(q, n, now, d) {
			continue
		}
		sh.makeRoom(q, now, d)
	}
}

// turnRoom is the least room turn makes at a time, so that the inserts
// into a turning chunk do not each take a turn of their own.
const turnRoom = 4 << 10

// turn makes room for n bytes at the end of queue q by turning the chunk
// that makeRoom would pass whole: passed whole, it would start again at
// the end of its queue with all the room its pass freed, to fill again,
// about half of that holding no entry on average. Turned, it moves to the
// end of q as it is, and its entries pass oldest first, at least turnRoom
// bytes of them at a time, as the entries written at its start need their
// room: probation's leave it
// for main or are dropped; in main, those kept are compacted to the front,
// among the new ones. Once it has passed them all the chunk is an ordinary
// one. It reports false where makeRoom is to pass a chunk instead: where
// probation takes a chunk from main or main has none, and where another
// chunk of q is turning, or would be passed.
func (sh *shard) turn(q, n int, now int64, d *Displaced) bool {
	p, m := &sh.queues[probationQ], &sh.queues[mainQ]
	c := sh.queues[q].tail()
	if c < 0 || c != sh.turning[q] {
		from := q
		switch {
		case sh.turning[q] >= 0 || m.n == 0:
			return false
		case q == probationQ && (p.n == 0 || p.n < sh.probation && m.n > 1):
			return false
		case q == mainQ && p.n > sh.probation:
			// Probation's oldest chunk passes to main, as in makeRoom.
			if p.at(0) == sh.turning[probationQ] {
				return false
			}
			from = probationQ
		}
		sh.turnedFrom[q] = placeOf(from, sh.queues[from].first())
		c = sh.dequeue(from)
		sh.enqueue(q, c)
		sh.turning[q], sh.newEnd[q], sh.oldStart[q], sh.from[q] = c, 0, 0, from
		sh.turns++
		sh.turnBegan[q] = sh.turns
	}
	sh.forget(c)
	want := max(n, turnRoom)
	for sh.oldStart[q]-sh.newEnd[q] < want && sh.oldStart[q] < int(sh.used[c]) {
		// Main keeps what it passes in place, probation moves it to main.
		until := min(sh.newEnd[q]+want, int(sh.used[c]))
		var w int
		sh.oldStart[q], w = sh.passSpan(c, sh.from[q], sh.oldStart[q], until, q == mainQ, sh.newEnd[q], now, d)
		if q == mainQ {
			sh.newEnd[q] = w
		}
	}
	if sh.oldStart[q] >= int(sh.used[c]) {
		sh.used[c] = uint32(sh.newEnd[q])
		sh.turning[q] = -1
	}
	return true
}

// turningIn returns the queue chunk c is turning in, or -1.
func (sh *shard) turningIn(c int) int {
	for q := range numQueues {
		if c == sh.turning[q] {
			return q
		}
	}
	return -1
}

// spans returns the parts of chunk c that hold entries, older first:
// [a0, a1) and [b0, b1).
func (sh *shard) spans(c int) (a0, a1, b0, b1 int) {
	if q := sh.turningIn(c); q >= 0 {
		return sh.oldStart[q], int(sh.used[c]), 0, sh.newEnd[q]
	}
	return 0, int(sh.used[c]), 0, 0
}

// filled returns the bytes of chunk c that hold entries, live or not.
func (sh *shard) filled(c int) int {
	a0, a1, b0, b1 := sh.spans(c)
	return a1 - a0 + b1 - b0
}

// minShortChunk is the least a shard's last chunk may hold when its budget
// has no room for a whole one: any entry, so that every chunk holds any.
const minShortChunk = (entry.MaxLen + 4095) &^ 4095

// nextChunkSize returns the bytes of the next chunk the budget holds: a
// whole chunk, or, as the last, what is left of the budget when that holds
// any entry and the index table could not grow in it anyway; 0 for none.
func (sh *shard) nextChunkSize() int {
	room := sh.budget - sh.held
	switch {
	case room >= chunkSize:
		return chunkSize
	case room >= minShortChunk && room < sh.growthRoom():
		return int(room) &^ 4095
	}
	return 0
}

// makeRoom passes a chunk to make room in queue q.
func (sh *shard) makeRoom(q int, now int64, d *Displaced) {
	p, m := &sh.queues[probationQ], &sh.queues[mainQ]
	switch {
	case q == mainQ && (p.n > sh.probation || m.n == 0):
		// Probation's oldest chunk passes to main, with what was hit in
		// it: main's newest chunk is full.
		c := sh.dequeue(probationQ)
		sh.pass(c, probationQ, true, now, d)
		sh.enqueue(mainQ, c)
	case q == mainQ:
		c := sh.dequeue(mainQ)
		sh.pass(c, mainQ, true, now, d)
		sh.enqueue(mainQ, c)
	case p.n < sh.probation && m.n > 1:
		// Probation holds less than its share: main's oldest chunk
		// passes to it, what main keeps of it copied to main's newest.
		c := sh.dequeue(mainQ)
		sh.pass(c, mainQ, false, now, d)
		sh.enqueue(probationQ, c)
	default:
		c := sh.dequeue(probationQ)
		sh.pass(c, probationQ, false, now, d)
		sh.enqueue(probationQ, c)
	}
}

// shed drops entries when the index table is full and may not grow: from
// probation, or from main when probation holds nothing to pass. Probation
// turns a few KiB of entries further where it can, rather than pass a
// whole chunk, which would leave the chunk's bytes empty until the inserts
// fill them again while the table stays full.
func (sh *shard) shed(now int64, d *Displaced) {
	if p := &sh.queues[probationQ]; p.n > 0 && sh.used[p.at(0)] > 0 {
		gap := 0
		if c := p.tail(); c == sh.turning[probationQ] {
			gap = sh.oldStart[probationQ] - sh.newEnd[probationQ]
		}
		if !sh.turn(probationQ, gap+turnRoom, now, d) {
			sh.makeRoom(probationQ, now, d)
		}
		return
	}
	sh.makeRoom(mainQ, now, d)
}

// giveUpChunk releases a chunk so that the index table can grow, when the
// table is full and the budget has no room for a larger one while the
// chunks have a chunk's worth of room to spare: the entries are small for
// the table the chunks left, as where large entries took the budget first.
// Probation's oldest chunk passes (main's when probation has none), what it
// keeps copied to main, and its memory is given back. It reports whether it
// released one.
func (sh *shard) giveUpChunk(now int64, d *Displaced) bool {
	q := probationQ
	if sh.queues[q].n == 0 {
		q = mainQ
	}
	if sh.queues[probationQ].n+sh.queues[mainQ].n <= 2 {
		return false
	}
	c := sh.queues[q].at(0)
	size := len(sh.chunks[c])
	if sh.held-int64(size)+sh.growthRoom() > sh.budget {
		return false
	}
	spare := 0
	for k := range sh.allocated {
		if b := sh.chunks[k]; b != nil {
			spare += len(b) - sh.filled(k)
		}
	}
	if spare < size {
		return false
	}
	sh.dequeue(q)
	sh.pass(c, q, false, now, d)
	sh.arena.freeChunk(c, size)
	sh.chunks[c], sh.used[c] = nil, 0
	sh.held -= int64(size)
	return true
}

// pass empties chunk c, the oldest of queue q, taken out of it: the entries
// kept stay, compacted to its front, with inPlace, and move to the end of
// main otherwise; the others are dropped.
//
// A turning chunk's older span passes as entries of the queue it turned
// from, the newer as entries of q.
func (sh *shard) pass(c, q int, inPlace bool, now int64, d *Displaced) {
	a0, a1, b0, b1 := sh.spans(c)
	qa := q
	if x := sh.turningIn(c); x >= 0 {
		qa = sh.from[x]
		sh.turning[x] = -1
	}
	w := 0
	if inPlace {
		// The span at the chunk's start first, so that compacting
		// overwrites only entries already passed.
		_, w = sh.passSpan(c, q, b0, b1, true, w, now, d)
		_, w = sh.passSpan(c, qa, a0, a1, true, w, now, d)
	} else {
		sh.passSpan(c, qa, a0, a1, false, 0, now, d)
		sh.passSpan(c, q, b0, b1, false, 0, now, d)
	}
	sh.used[c] = uint32(w)
}

// passSpan passes the entries of chunk c, of queue q, that start at off and
// on before until: each is dropped or spends one of its hits and stays,
// compacted to w on with inPlace, moved to the end of main otherwise. It
// returns the offset past the last entry passed, and w past the last one
// compacted.
func (sh *shard) passSpan(c, q, off, until int, inPlace bool, w int, now int64, d *Displaced) (int, int) {
	b := sh.chunks[c]
	sh.prefetchSpan(c, q, off, until)
	for off < until {
		e := entry.Entry(b[off:])
		n := e.Size()
		h := keyHash(sh.seed, e.Key())
		i := sh.slotOf(location(c, off), h)
		f := e.Freq()
		switch {
		case i < 0: // garbage: replaced or removed
		case location(c, off)+1 == sh.replacing:
			// The entry being put replaces it. Its place may hold
			// another entry before the put ends.
			sh.remove(i, e)
			sh.replacing = 0
		case now > e.Expires()+sh.grace:
			sh.drop(i, e, &d.Evicted)
		case f == 0 && q == probationQ:
			sh.remember(h, n)
			sh.drop(i, e, &d.Refused)
		case f == 0:
			sh.drop(i, e, &d.Evicted)
		default:
			// A hit spent, whether it stays in main or leaves probation
			// for it; none left to an expired entry, which needs a hit to
			// stay another round.
			e.SetFreq(f - 1)
			if now > e.Expires() {
				e.SetFreq(0)
			}
			if inPlace {
				copy(b[w:], b[off:off+n])
				sh.table.relocate(i, location(c, w))
				w += n
				break
			}
			moves := sh.slotMoves
			mc, mo := sh.reserve(mainQ, n, now, d)
			copy(sh.chunks[mc][mo:], b[off:off+n])
			if sh.slotMoves != moves {
				// Passing main's oldest chunk to make that room moved
				// slots, maybe the entry's.
				i = sh.slotOf(location(c, off), h)
			}
			sh.table.relocate(i, location(mc, mo))
		}
		off += n
	}
	return off, w
}

// prefetchSpan starts bringing in the index slots that passing the entries
// of chunk c in [off, until) reads, and for probation's the ghost buckets
// their marks may go in. The entries lie one after another, their slots and
// buckets anywhere: read as each entry is passed, each would wait for the
// one before it.
func (sh *shard) prefetchSpan(c, q, off, until int) {
	b := sh.chunks[c]
	for off < until {
		e := entry.Entry(b[off:])
		h := keyHash(sh.seed, e.Key())
		prefetch(sh.table.slotAddr(h))
		if q == probationQ && sh.ghost != nil && e.Freq() == 0 {
			prefetch(uintptr(unsafe.Pointer(sh.ghostBucket(h))))
		}
		off += e.Size()
	}
}

// drop removes the entry e in slot i for room, counting it in counted.
func (sh *shard) drop(i int, e entry.Entry, counted *PerKind) {
	counted[KindOf(e)]++
	sh.remove(i, e)
}

// remove removes the entry e in slot i.
func (sh *shard) remove(i int, e entry.Entry) {
	sh.tally(e, -1)
	sh.deleteSlot(i)
}

// tally counts e in (d = 1) or out (d = -1) of the shard's counts.
func (sh *shard) tally(e entry.Entry, d int) {
	sh.kinds[KindOf(e)] += d
	if e.Flags()&entry.FlagVariant != 0 {
		sh.variants += d
	}
}

// forget invalidates the cursors into chunk c, whose entries move.
func (sh *shard) forget(c int) {
	for k := range sh.cursor {
		if sh.cursor[k].chunk == c {
			sh.cursor[k].valid = false
		}
	}
}

// evictOldest drops the oldest live entry of kind k but the one at keep, for
// the per-kind entry caps of the stock cache: the first in probation, oldest
// first, then in main. keep is the entry just put, which the stock cache
// keeps: found first when every other entry of its kind is in main, it
// would evict itself at every put. The cursor makes repeated calls walk the chunks once rather than
// once per call. A valid cursor's chunk is in a queue: scanFor sets it to a
// queued chunk, and the chunk leaves its queue only through dequeue, which
// forgets it (checkQueues checks this), as does each step of its turn.
func (sh *shard) evictOldest(k int, keep uint64, d *Displaced) {
	if pos := sh.cursor[k]; pos.valid {
		if q, seg := sh.segmentOf(pos); sh.scanFor(k, q, seg, pos.off, keep, d) {
			return
		}
	}
	if !sh.scanFor(k, probationQ, 0, 0, keep, d) {
		sh.cursor[k].valid = false
	}
}

// A queue's entries, oldest first, lie in segments: the older spans of the
// turning chunks that hold its entries, the turn begun first first (its own
// turning chunk was its oldest chunk when the turn began, and main may turn
// one it took from probation, whose older span is probation's), then each
// of its chunks in queue order, its turning chunk's newer span in its place.

// turnsOf returns the queues whose turning chunk's older span holds entries
// of queue q, the turn begun first first, and how many there are.
func (sh *shard) turnsOf(q int) (xs [numQueues]int, n int) {
	for x := range numQueues {
		if sh.turning[x] >= 0 && sh.from[x] == q {
			xs[n] = x
			n++
		}
	}
	if n == 2 && sh.turnBegan[xs[1]] < sh.turnBegan[xs[0]] {
		xs[0], xs[1] = xs[1], xs[0]
	}
	return xs, n
}

// segment returns the chunk and the offsets [from, to) of segment seg of
// queue q; chunk -1 past its last segment.
func (sh *shard) segment(q, seg int) (c, from, to int) {
	xs, n := sh.turnsOf(q)
	if seg < n {
		t := sh.turning[xs[seg]]
		return t, sh.oldStart[xs[seg]], int(sh.used[t])
	}
	if seg -= n; seg >= sh.queues[q].n {
		return -1, 0, 0
	}
	c = sh.queues[q].at(seg)
	if c == sh.turning[q] {
		return c, 0, sh.newEnd[q]
	}
	return c, 0, int(sh.used[c])
}

// segmentOf returns the queue and the segment that pos, a cursor into a
// queued chunk, points into. A cursor into a turning chunk's older span is
// past oldStart, one into its newer span at most at newEnd, which is not
// past oldStart.
func (sh *shard) segmentOf(pos position) (q, seg int) {
	if x := sh.turningIn(pos.chunk); x >= 0 && pos.off > sh.newEnd[x] {
		q = sh.from[x]
		xs, _ := sh.turnsOf(q)
		if xs[0] == x {
			return q, 0
		}
		return q, 1
	}
	q = int(sh.in[pos.chunk])
	_, n := sh.turnsOf(q)
	qu := &sh.queues[q]
	return q, n + (int(sh.place[pos.chunk])-qu.head+len(qu.ids))%len(qu.ids)
}

// scanFor drops the first live entry of kind k but the one at keep from
// segment seg of queue q, at offset off on (off 0: from the segment's
// start), through the later segments of q and of the queues after it, and
// reports whether it found one.
func (sh *shard) scanFor(k, q, seg, off int, keep uint64, d *Displaced) bool {
	for ; q < numQueues; q, seg, off = q+1, 0, 0 {
		for ; ; seg, off = seg+1, 0 {
			c, from, to := sh.segment(q, seg)
			if c < 0 {
				break
			}
			for off = max(off, from); off < to; {
				e := entry.Entry(sh.chunks[c][off:])
				next := off + e.Size()
				if KindOf(e) == k && location(c, off) != keep {
					if i := sh.slotOf(location(c, off), keyHash(sh.seed, e.Key())); i >= 0 {
						sh.drop(i, e, &d.Evicted)
						sh.cursor[k] = position{chunk: c, off: next, valid: true}
						return true
					}
				}
				off = next
			}
		}
	}
	return false
}

// checkQueues verifies that every chunk the shard holds is in one queue, at
// the place the shard says, and no other chunk is.
func (sh *shard) checkQueues() error {
	n := 0
	for q := range sh.queues {
		qu := &sh.queues[q]
		n += qu.n
		for at := range qu.n {
			c := qu.at(at)
			if sh.chunks[c] == nil || sh.in[c] != uint8(q) || int(sh.place[c]) != (qu.head+at)%len(qu.ids) {
				return fmt.Errorf("chunk %d at %d of queue %d: held %t, in queue %d at %d", c, at, q, sh.chunks[c] != nil, sh.in[c], sh.place[c])
			}
		}
	}
	held := 0
	for c := range sh.chunks {
		switch {
		case sh.chunks[c] == nil && sh.in[c] != noQueue:
			return fmt.Errorf("chunk %d is not held and in queue %d", c, sh.in[c])
		case sh.chunks[c] != nil && c >= sh.allocated:
			return fmt.Errorf("chunk %d held, %d chunks allocated", c, sh.allocated)
		case sh.chunks[c] != nil:
			held++
		}
	}
	if n != held {
		return fmt.Errorf("%d chunks in the queues, %d held", n, held)
	}
	for k, pos := range sh.cursor {
		if pos.valid && sh.in[pos.chunk] == noQueue {
			return fmt.Errorf("the cursor of kind %d is valid in chunk %d, in no queue", k, pos.chunk)
		}
	}
	for q, c := range sh.turning {
		if c < 0 {
			continue
		}
		if c >= len(sh.chunks) || sh.in[c] != uint8(q) || sh.newEnd[q] > sh.oldStart[q] || sh.oldStart[q] > int(sh.used[c]) || int(sh.used[c]) > len(sh.chunks[c]) {
			return fmt.Errorf("chunk %d turns in queue %d from %d, in queue %d: newEnd %d, oldStart %d, used %d", c, q, sh.from[q], sh.in[c], sh.newEnd[q], sh.oldStart[q], sh.used[c])
		}
	}
	if sh.ghost != nil && len(sh.ghost) != sh.ghostLen {
		return fmt.Errorf("a ghost of %d words, want %d", len(sh.ghost), sh.ghostLen)
	}
	return nil
}
