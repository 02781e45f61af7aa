// Package store keeps cache entries (internal/entry) as bytes in per-shard
// arenas, found through per-shard index tables of integers, under a byte
// budget. It owns its locks: callers reach entry bytes only inside a
// callback that runs with the entry's shard locked, and may not keep them
// after it returns, since a shard moves and overwrites entries as it
// reclaims chunks (a build with the compactcache_poison tag lends callbacks
// copies and poisons them afterwards, so that a use after the lock shows).
package store

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/compactcache/compactcache/internal/entry"
)

// The store keeps entries as bytes in per-shard arenas and finds them through
// per-shard open addressing tables of integers. Neither holds a Go pointer per
// entry, so garbage collection costs the same with ten entries or ten million.
//
// A shard's arena is a set of fixed-size chunks, allocated as the shard fills
// and never beyond its share of the byte budget, taken in turn by two FIFO
// queues of chunks, probation and main (S3-FIFO, evict.go): new entries
// enter probation and leave it after a tenth of the shard's inserts unless
// they were asked for again meanwhile; main keeps what is asked again,
// CLOCK style with a counter of hits per entry.
const (
	chunkBits = 17
	chunkSize = 1 << chunkBits // holds one maxEntryLen entry

	// An entry's location is its chunk's index, then its offset in the
	// chunk; an index slot holds it (slot.go).
	chunkIndexBits = 16
	maxChunks      = 1 << chunkIndexBits

	maxShards = 64

	// MinCapacity is the smallest byte budget a store accepts: one shard
	// of a few chunks and a small index.
	MinCapacity = 1 << 20
	// MaxCapacity keeps chunk indexes within chunkIndexBits.
	MaxCapacity = maxShards * maxChunks * chunkSize
)

// Entry kinds, counted apart: successes and denials as in the stock cache,
// and the cache's own bookkeeping (the lists of a name's ECS variants).
const (
	KindSuccess = iota
	KindDenial
	KindMeta
	NumKinds
)

// PerKind counts something for each kind of entry.
type PerKind [NumKinds]int

func KindOf(e entry.Entry) int {
	switch f := e.Flags(); {
	case f&entry.FlagMeta != 0:
		return KindMeta
	case f&entry.FlagDenial != 0:
		return KindDenial
	}
	return KindSuccess
}

type Store struct {
	seed     maphash.Seed
	shards   []shard
	capacity int64
	limits   PerKind // the entry caps as configured; shards apply their share
}

type shard struct {
	mu   sync.Mutex
	seed maphash.Seed

	arena  *arena   // where chunks and tables come from (arena.go)
	chunks [][]byte // nil where no chunk is allocated
	used   []uint32 // bytes written in each chunk; a turning chunk's older span ends there (spans)

	// The eviction policy's state (evict.go): the chunks in each queue, in
	// order, and the queue and place each allocated chunk is in; chunks are
	// allocated in order, the first allocated of them.
	queues    [numQueues]queue
	in        []uint8
	place     []uint16
	allocated int
	probation int      // chunks probation keeps once the shard is full
	ghost     []uint64 // marks of keys dropped from probation (ghost.go); nil until the first
	ghostLen  int      // the ghost's words, counted in held from the start
	coin      uint64

	// Each queue's chunk that turns an entry at a time (evict.go), -1 where
	// none does: it holds entries in [oldStart, used), the older, passed as
	// entries of queue from, and in [0, newEnd), written since its turn
	// began; newEnd <= oldStart.
	turning, newEnd, oldStart, from [numQueues]int
	// The turns begun, and the count when each queue's began: the older
	// span of the turn begun first is the older (evictOldest).
	turns     uint64
	turnBegan [numQueues]uint64
	// Where each queue's turning chunk was queued before its turn began
	// (placeOf): a walk that visited it there has visited its older span.
	turnedFrom [numQueues]uint64

	// The clocks of readmission from the ghost (evict.go): the marks the
	// ghost has pushed, that count when main last passed a chunk, and the
	// mean count between two of main's passes, in 256ths.
	ghostClock, mainPassed, mainGap uint64

	table     indexTable                // open addressing in Robin Hood order (index.go)
	ahead     atomic.Pointer[aheadView] // read without the lock by Prefetch
	count     int                       // entries in table
	slotMoves uint64                    // deletions, displacing inserts and rebuilds, which move slots

	kinds    PerKind            // entries per kind
	variants int                // entries tailored to a client subnet (ECS)
	limits   PerKind            // entries per kind allowed, 0 for no limit
	cursor   [NumKinds]position // where the search for a kind's oldest entry resumes

	// The location plus one of the entry that the put under way replaces,
	// 0 for none: making room for the put removes it without counting it
	// displaced or remembering it in the ghost.
	replacing uint64

	budget int64 // bytes this shard may hold
	held   int64 // bytes this shard holds: chunks, table, ghost, queues

	grace int64 // seconds an expired entry is kept for serve_stale

	lent entry.Entry // what a poison build lends callbacks (lend)
}

// position is a place in a shard's chunks; valid is false once its chunk is
// reclaimed.
type position struct {
	chunk int
	off   int
	valid bool
}

// newStore returns a store of capacity bytes. limits caps the entries of each
// kind, 0 meaning no cap; grace is the serve-stale window in seconds.
func New(capacity int64, limits PerKind, grace int64) (*Store, error) {
	return newStoreOn(runtime.GOMAXPROCS(0), capacity, limits, grace)
}

// newStoreOn is newStore for queries that run on procs cores.
func newStoreOn(procs int, capacity int64, limits PerKind, grace int64) (*Store, error) {
	if capacity < MinCapacity || capacity > MaxCapacity {
		return nil, fmt.Errorf("%d bytes is outside [%d, %d]", capacity, int64(MinCapacity), int64(MaxCapacity))
	}
	n := shardCount(capacity, procs)
	s := &Store{seed: maphash.MakeSeed(), shards: make([]shard, n), capacity: capacity, limits: limits}
	tables := newSharedTables(capacity)
	budget := (capacity - tables.reserve()) / int64(n)
	format := slotFormatFor(budget)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.seed = s.seed
		sh.budget = budget
		rings := int(sh.budget / chunkSize)
		sh.chunks = make([][]byte, rings)
		sh.used = make([]uint32, rings)
		sh.initQueues(rings)
		sh.arena = newArena(rings, tables)
		sh.table = newIndexTable(sh.arena.table(minTableBytes), format)
		sh.publish()
		sh.grace = grace
		for k, l := range limits {
			if l > 0 {
				sh.limits[k] = (l-1)/n + 1 // rounded up, without the overflow of l+n-1 for caps near MaxInt
			}
		}
		sh.ghostLen = ghostWords(sh.budget)
		sh.held = sh.overhead() + minTableBytes + int64(sh.ghostLen)*8
	}
	s.releaseWhenUnreachable()
	return s, nil
}

// shardsPerProc is how many shards a store has for each core that runs
// queries (GOMAXPROCS): enough that two queries seldom want the lock of one
// shard at the same time.
const shardsPerProc = 4

// targetShardBudget is the most of the budget a shard takes where maxShards
// allow. It bounds the shard's index table, which is rebuilt larger under
// the shard's lock, so that a larger shard holds its lock for longer each
// time its table grows (BENCHMARKS.md).
const targetShardBudget = 64 << 20

// minShardChunks is the fewest chunks a shard is made with where the budget
// allows. A shard has an index table, a ghost and a budget that is seldom
// a whole number of chunks, and its queues' turning chunks leave a few KiB
// empty (evict.go): the fewer its chunks, the less of its budget holds
// entries, and the lower the hit rate of a store of few large shards
// against one of many small ones (bench/trace).
const minShardChunks = 32

// shardCount returns the number of shards, a power of two, of a store of
// capacity bytes (at most MaxCapacity) whose queries run on procs cores:
// shardsPerProc for each, rounded down to a power of two, fewer where a shard
// would hold under minShardChunks chunks (but two of sixteen where the
// budget has them), more where a shard would take over targetShardBudget.
// More shards cost every insert time: each shard appends to a tail chunk of
// its own, into pages that a fault has just zeroed into the caches, and the
// more tails the inserts take turns on, the more of those lines have left
// the caches when they are written.
func shardCount(capacity int64, procs int) int {
	// Two shards of sixteen chunks rather than one lock.
	most := max(capacity/(minShardChunks*chunkSize), min(capacity/(16*chunkSize), 2))
	n := max(1, min(int64(shardsPerProc*procs), maxShards, most))
	n = 1 << (bits.Len64(uint64(n)) - 1)
	// Past targetShardBudget, more shards. That also keeps every shard within
	// the chunks an index slot can name: maxShards shards of maxChunks are
	// MaxCapacity.
	for n < maxShards && n*targetShardBudget < capacity {
		n *= 2
	}
	return int(n)
}

func (s *Store) Hash(key []byte) uint64 { return keyHash(s.seed, key) }

// Prefetch starts bringing in what storing an entry under hash h reads
// first with its shard locked, its index slot and its ghost bucket, and
// returns at once. A miss calls it as the reply comes in, so that the
// lines, which the upstream's work has pushed out of the caches since the
// lookup read them, arrive while the entry is built.
func (s *Store) Prefetch(h uint64) {
	if v := s.shard(h).ahead.Load(); v != nil {
		prefetch(v.table.slotAddr(h))
		if v.ghost != nil {
			prefetch(uintptr(unsafe.Pointer(ghostBucketOf(v.ghost, h))))
		}
	}
}

// aheadView is a shard's table and ghost as Prefetch reads them without the
// lock: published whenever either is replaced. A view that is out of date
// names memory that may be gone, which a prefetch does not mind.
type aheadView struct {
	table indexTable
	ghost []uint64
}

// publish makes the shard's table and ghost what Prefetch reads.
func (sh *shard) publish() { sh.ahead.Store(&aheadView{sh.table, sh.ghost}) }

func (s *Store) shard(h uint64) *shard { return &s.shards[h&uint64(len(s.shards)-1)] }

// Capacity returns the byte budget.
func (s *Store) Capacity() int64 { return s.capacity }

// Limits returns the entry caps of each kind it was made with, 0 for none.
func (s *Store) Limits() PerKind { return s.limits }

// Get runs f on the entry stored under key, whose hash is h (Hash), with the
// entry's shard locked, and returns what f returns: false when there is no
// entry. f may change the entry's bookkeeping in place (entry.Hit,
// SetFlag) but must not keep the entry.
func (s *Store) Get(key []byte, h uint64, f func(e entry.Entry) bool) bool {
	sh := s.shard(h)
	sh.mu.Lock()
	// Unlock even if f panics, so that one bad entry does not leave the
	// shard locked for every later query.
	defer sh.mu.Unlock()
	e := sh.get(key, h)
	if e == nil {
		return false
	}
	lent := sh.lend(e)
	found := f(lent)
	sh.takeBack(e, lent)
	return found
}

// Displaced counts the entries of each kind that a store dropped to make
// room: evicted, and refused admission (dropped from probation without
// being asked for again there), counted apart.
type Displaced struct {
	Evicted, Refused PerKind
}

// Put stores e, a complete entry, replacing any entry with the same key, and
// returns the entries dropped to make room. now is in unix seconds.
func (s *Store) Put(e entry.Entry, now int64) (dropped Displaced) {
	h := s.Hash(e.Key())
	s.locked(h, func(sh *shard) { sh.put(e, h, now, &dropped) })
	return dropped
}

// Update replaces the entry under key by what next makes of it (old is nil
// when there is none; next returns nil to leave things as they are), with
// the shard locked throughout, so that concurrent updates are not lost. old
// is only valid inside next, which may return it, or bytes of it, to store
// it again (as a replacement, in main).
func (s *Store) Update(key []byte, now int64, next func(old entry.Entry) entry.Entry) (dropped Displaced) {
	h := s.Hash(key)
	s.locked(h, func(sh *shard) {
		old := sh.get(key, h)
		var lent entry.Entry
		if old != nil {
			lent = sh.lend(old)
		}
		e := next(lent)
		if poison && old != nil {
			// Back in place before the put, which may move old's chunk.
			copy(old, lent)
		}
		if overlaps(e, lent) {
			// Making room for the put may move or overwrite the bytes
			// next was lent, as it compacts old's chunk.
			e = append(entry.Entry(nil), e...)
		}
		if e != nil {
			sh.put(e, h, now, &dropped)
		}
		if old != nil {
			sh.takeBack(nil, lent)
		}
	})
	return dropped
}

// overlaps reports whether a and b share bytes.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// locked runs f on the shard of hash h with its lock held.
func (s *Store) locked(h uint64, f func(sh *shard)) {
	sh := s.shard(h)
	sh.mu.Lock()
	// Unlock even if f panics, so that one bad entry does not leave the
	// shard locked for every later query.
	defer sh.mu.Unlock()
	f(sh)
}

// Usage is what a store holds.
type Usage struct {
	Kinds    PerKind // entries per kind
	Variants int     // entries tailored to a client subnet (ECS)
	Held     int64   // bytes: chunks, tables, eviction bookkeeping
}

// Usage sums what the shards hold, each read under its lock. It is read for
// metrics and Stats, seldom; the store keeps no running totals, which every
// insert would update with atomic adds, on a cache line that the inserts of
// every core would pull to their own.
func (s *Store) Usage() Usage {
	var u Usage
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, n := range sh.kinds {
			u.Kinds[k] += n
		}
		u.Variants += sh.variants
		u.Held += sh.held
		sh.mu.Unlock()
	}
	return u
}

// SameShape reports whether o was made with the budget, caps and stale
// window of s, so that it can serve in its place. The number of shards may
// differ: it follows GOMAXPROCS when a store is made, which Go changes with
// the container's CPU limit, and either number serves.
func (s *Store) SameShape(o *Store) bool {
	return s.capacity == o.capacity && s.limits == o.limits && s.shards[0].grace == o.shards[0].grace
}

// Remove drops the entry stored under key, if any.
func (s *Store) Remove(key []byte) {
	h := s.Hash(key)
	s.locked(h, func(sh *shard) {
		if i := sh.find(key, h); i >= 0 {
			sh.remove(i, sh.at(sh.table.load(i)))
		}
	})
}

// Cursor is where a walk of the store resumes; its zero value starts one.
type Cursor struct {
	shard, queue int
	seq          uint64   // the first chunk of the queue not visited, as queue.pushed counts them
	visitedAt    []uint64 // the place (placeOf) where the shard's chunk c was last visited, 0 for none
}

// placeOf returns a chunk's place in the shard's queues, the seq-th queued
// in queue q, as a number that is never 0.
func placeOf(q int, seq uint64) uint64 { return seq*numQueues + uint64(q) + 1 }

// Walk visits the entries of the next chunk of the store from c on, with its
// shard locked, so that a walk of the whole store holds no lock for longer
// than one chunk takes; visit returns true to remove the entry (a removal
// is not an eviction). It returns the cursor to resume from, and false once
// every shard has been walked. Each shard's chunks are visited in the order
// of its queues, probation's then main's, oldest first: entries move only
// to main's newest chunk (evict.go), and a chunk passed or turned is queued
// again as its queue's newest, so that every entry stored when the walk
// began is visited unless it is evicted or replaced meanwhile, and one
// moved while the walk runs may be visited twice. Entries stored after the
// walk passed their place are not visited.
//
// A turning chunk the walk visited at the place it turned from keeps in its
// older span entries that were there then, and that have not moved since:
// only its newer span is visited. One the walk visited only at an earlier
// place may have taken in entries it had not reached before it turned.
func (s *Store) Walk(c Cursor, visit func(e entry.Entry) (remove bool)) (Cursor, bool) {
	for ; c.shard < len(s.shards); c = (Cursor{shard: c.shard + 1}) {
		sh := &s.shards[c.shard]
		sh.mu.Lock()
		if c.visitedAt == nil {
			c.visitedAt = make([]uint64, len(sh.chunks))
		}
		for ; c.queue < numQueues; c.queue, c.seq = c.queue+1, 0 {
			qu := &sh.queues[c.queue]
			first := qu.first()
			for c.seq = max(c.seq, first); c.seq < qu.pushed; {
				chunk := qu.at(int(c.seq - first))
				c.seq++
				if sh.used[chunk] > 0 {
					x := sh.turningIn(chunk)
					older := x < 0 || c.visitedAt[chunk] != sh.turnedFrom[x]
					c.visitedAt[chunk] = placeOf(c.queue, c.seq-1)
					sh.walkChunk(chunk, older, visit)
					sh.mu.Unlock()
					return c, true
				}
			}
		}
		sh.mu.Unlock()
	}
	return c, false
}

// Walker walks a store's entries a chunk at a time: visit under the chunk's
// shard lock, between (when given) after each chunk with no lock held,
// whose error ends the walk.
type Walker func(visit func(e entry.Entry) (remove bool), between func() error) error

// Paced is the Walker of s that rests rest times as long as each chunk
// took before the next; with 0 it goes from one chunk to the next at once.
// A goroutine that walked without resting (or only yielded) would keep the
// scheduler from polling the network on a server with one core, so that
// the queries wait for the walk's end; resting, it lets them in after
// every chunk.
func (s *Store) Paced(rest time.Duration) Walker {
	return func(visit func(e entry.Entry) bool, between func() error) error {
		for c, more := (Cursor{}), true; more; {
			start := time.Now()
			c, more = s.Walk(c, visit)
			if between != nil {
				if err := between(); err != nil {
					return err
				}
			}
			time.Sleep(rest * time.Since(start))
		}
		return nil
	}
}

// walkChunk visits the live entries of chunk c, but for those of a turning
// chunk's older span unless older; the caller holds sh.mu.
func (sh *shard) walkChunk(c int, older bool, visit func(e entry.Entry) bool) {
	b := sh.chunks[c]
	a0, a1, b0, b1 := sh.spans(c)
	if !older && sh.turningIn(c) >= 0 {
		a0, a1 = 0, 0
	}
	for _, span := range [2][2]int{{a0, a1}, {b0, b1}} {
		for off := span[0]; off < span[1]; {
			e := entry.Entry(b[off:])
			e = e[:e.Size():e.Size()]
			i := sh.slotOf(location(c, off), keyHash(sh.seed, e.Key()))
			off += len(e)
			if i < 0 {
				continue // garbage: replaced or removed
			}
			lent := sh.lend(e)
			remove := visit(lent)
			sh.takeBack(e, lent)
			if remove {
				sh.remove(i, e)
			}
		}
	}
}

// lend returns e for a callback: e itself, or in a poison build a copy that
// takeBack poisons.
func (sh *shard) lend(e entry.Entry) entry.Entry {
	if !poison {
		return e
	}
	sh.lent = append(sh.lent[:0], e...)
	return sh.lent
}

// takeBack writes what a callback changed of lent back to e (nil when the
// caller did), and in a poison build poisons lent, so that a caller that
// kept it reads garbage.
func (sh *shard) takeBack(e, lent entry.Entry) {
	if !poison {
		return
	}
	copy(e, lent)
	for i := range lent {
		lent[i] = poisonByte
	}
}

// Check verifies what the store's accounting rests on, shard by shard under
// its lock: the index locates entries whose keys hash to their slots, the
// counts (which Usage sums) are those of the entries indexed, the bytes
// held are those of the chunks, table and bookkeeping, and none exceeds its
// budget. It is for tests and debugging: it walks every index slot. It may
// run while the store changes, as each shard is checked as it stands.
func (s *Store) Check() error {
	var held int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n, err := sh.check(s)
		sh.mu.Unlock()
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
		held += n
	}
	if held > s.capacity {
		return fmt.Errorf("the store holds %d bytes, capacity %d", held, s.capacity)
	}
	return nil
}

// check is Check for one shard, whose lock the caller holds; it returns the
// bytes the shard holds.
func (sh *shard) check(s *Store) (int64, error) {
	n, kinds, variants := 0, PerKind{}, 0
	for i := range sh.table.n {
		v := sh.table.load(i)
		if v == 0 {
			continue
		}
		n++
		e := sh.at(v)
		if h := s.Hash(e.Key()); sh.table.tagOf(h) != sh.table.tag(v) {
			return 0, errors.New("slot hash bits do not match the entry's key")
		}
		kinds[KindOf(e)]++
		if e.Flags()&entry.FlagVariant != 0 {
			variants++
		}
	}
	if i := sh.checkOrder(); i >= 0 {
		return 0, fmt.Errorf("slot %d of %d is out of Robin Hood order", i, sh.table.n)
	}
	if n != sh.count || kinds != sh.kinds || variants != sh.variants {
		return 0, fmt.Errorf("%d slots, %v kinds, %d variants; the shard says %d, %v, %d", n, kinds, variants, sh.count, sh.kinds, sh.variants)
	}
	var chunks int64
	for _, c := range sh.chunks {
		if c != nil {
			chunks += int64(len(c))
		}
	}
	held := chunks + int64(len(sh.table.b)) + int64(sh.ghostLen)*8 + sh.overhead()
	if held != sh.held || held > sh.budget {
		return 0, fmt.Errorf("holds %d bytes, accounted %d, budget %d", held, sh.held, sh.budget)
	}
	if err := sh.checkQueues(); err != nil {
		return 0, err
	}
	return held, nil
}

// overhead is what a shard holds besides its chunks, its table and its
// ghost: per chunk, its slice, its bytes used and its place in the queues.
func (sh *shard) overhead() int64 {
	return int64(len(sh.chunks))*(24+4+2*2+1+2) + 256
}

// get returns the entry stored under key, or nil. The caller holds sh.mu and
// must not use the entry after releasing it.
func (sh *shard) get(key []byte, h uint64) entry.Entry {
	if i := sh.find(key, h); i >= 0 {
		return sh.at(sh.table.load(i))
	}
	return nil
}
