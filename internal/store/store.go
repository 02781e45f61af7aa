// Package store keeps cache entries (internal/entry) as bytes in per-shard
// arenas, found through per-shard index tables of integers, under a byte
// budget. It owns its locks: callers reach entry bytes only inside a
// callback that runs with the entry's shard locked, and may not keep them
// after it returns, since the ring moves and overwrites entries as it
// reclaims chunks (a build with the compactcache_poison tag lends callbacks
// copies and poisons them afterwards, so that a use after the lock shows).
package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"sync"

	"github.com/compactcache/compactcache/internal/entry"
)

// The store keeps entries as bytes in per-shard arenas and finds them through
// per-shard open addressing tables of uint64. Neither holds a Go pointer per
// entry, so garbage collection costs the same with ten entries or ten million.
//
// A shard's arena is a ring of fixed-size chunks, allocated as the shard fills
// and never beyond its share of the byte budget. When the ring is full, the
// oldest chunk is reclaimed: entries hit since the ring last passed them are
// compacted to its front and the chunk becomes the newest (second chance,
// CLOCK style); the others, and entries expired beyond the serve-stale window
// whether hit or not, are dropped.
const (
	chunkBits = 17
	chunkSize = 1 << chunkBits // holds one maxEntryLen entry

	chunkIndexBits = 16
	maxChunks      = 1 << chunkIndexBits

	// An index slot is the entry's hash bits above locBits, then its
	// location (chunk index, offset) plus one, so that zero means empty.
	locBits = chunkBits + chunkIndexBits
	locMask = 1<<locBits - 1

	minTableSlots = 1 << 8
	maxShards     = 64

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

// perKind counts something for each kind of entry.
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
	chunks [][]byte // the ring; nil where no chunk is allocated
	used   []uint32 // bytes written in each chunk
	tail   int      // the chunk being appended to, -1 before the first

	table []uint64 // open addressing with linear probing; see locBits
	count int      // entries in table

	kinds    PerKind            // entries per kind
	variants int                // entries tailored to a client subnet (ECS)
	limits   PerKind            // entries per kind allowed, 0 for no limit
	cursor   [NumKinds]position // where the search for a kind's oldest entry resumes

	budget int64 // bytes this shard may hold
	held   int64 // bytes this shard holds: chunks, table, ring bookkeeping

	grace int64 // seconds an expired entry is kept for serve_stale

	lent entry.Entry // what a poison build lends callbacks (lend)
}

// position is a place in the ring; valid is false once its chunk is reclaimed.
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
	for i := range s.shards {
		sh := &s.shards[i]
		sh.seed = s.seed
		sh.budget = (capacity - tables.reserve()) / int64(n)
		rings := int(sh.budget / chunkSize)
		sh.chunks = make([][]byte, rings)
		sh.used = make([]uint32, rings)
		sh.tail = -1
		sh.arena = newArena(rings, tables)
		sh.table = sh.arena.table(minTableSlots)
		sh.grace = grace
		for k, l := range limits {
			if l > 0 {
				sh.limits[k] = (l-1)/n + 1 // rounded up, without the overflow of l+n-1 for caps near MaxInt
			}
		}
		sh.held = sh.overhead() + minTableSlots*8
	}
	s.releaseWhenUnreachable()
	return s, nil
}

// shardsPerProc is how many shards a store has for each core that runs
// queries (GOMAXPROCS): enough that two queries seldom want the lock of one
// shard at the same time.
const shardsPerProc = 4

// targetShardBudget is the most of the budget a shard takes where maxShards
// allow. It bounds the shard's index table, which is rebuilt at twice its
// size under the shard's lock: 64 MiB hold about 350,000 entries of the
// reference workload, whose table's last doubling, to 4 MiB, takes about
// 3 ms here; a table of 1.5 million entries took 90 ms to double to 32 MiB.
const targetShardBudget = 64 << 20

// shardCount returns the number of shards, a power of two, of a store of
// capacity bytes (at most MaxCapacity) whose queries run on procs cores:
// shardsPerProc for each, rounded down to a power of two, fewer where a ring
// would hold under sixteen chunks, more where a shard would take over
// targetShardBudget. More shards cost every insert time: each shard appends
// to a tail chunk of its own, into pages that a fault has just zeroed into
// the caches, and the more tails the inserts take turns on, the more of
// those lines have left the caches when they are written. On two cores the
// cache's own insert at a million entries took 1,367-1,429 ns at 64 shards
// and 1,160-1,208 at 8 (paired runs; BENCHMARKS.md).
func shardCount(capacity int64, procs int) int {
	// Sixteen or more chunks per shard keep the bytes lost to the partly
	// filled tail chunk and to reclaiming a whole chunk at a time small.
	most := capacity / (16 * chunkSize)
	n := max(1, min(int64(shardsPerProc*procs), maxShards, most))
	n = 1 << (bits.Len64(uint64(n)) - 1)
	// Past targetShardBudget, more shards. That also keeps every ring within
	// the chunks an index slot can name: maxShards rings of maxChunks are
	// MaxCapacity.
	for n < maxShards && n*targetShardBudget < capacity {
		n *= 2
	}
	return int(n)
}

func (s *Store) Hash(key []byte) uint64 { return maphash.Bytes(s.seed, key) }

func (s *Store) shard(h uint64) *shard { return &s.shards[h&uint64(len(s.shards)-1)] }

// Capacity returns the byte budget.
func (s *Store) Capacity() int64 { return s.capacity }

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

// put stores e, a complete entry, replacing any entry with the same key, and
// returns the number of entries of each kind evicted to make room. now is in
// unix seconds.
func (s *Store) Put(e entry.Entry, now int64) (evicted PerKind) {
	h := s.Hash(e.Key())
	s.locked(h, func(sh *shard) { sh.put(e, h, now, &evicted) })
	return evicted
}

// update replaces the entry under key by what next makes of it (old is nil
// when there is none; next returns nil to leave things as they are), with
// the shard locked throughout, so that concurrent updates are not lost. old
// is only valid inside next.
func (s *Store) Update(key []byte, now int64, next func(old entry.Entry) entry.Entry) (evicted PerKind) {
	h := s.Hash(key)
	s.locked(h, func(sh *shard) {
		old := sh.get(key, h)
		var lent entry.Entry
		if old != nil {
			lent = sh.lend(old)
		}
		e := next(lent)
		if poison && old != nil {
			// Back in place before the put, which may move old's chunk;
			// e may be lent itself, poisoned only once the put copied it.
			copy(old, lent)
		}
		if e != nil {
			sh.put(e, h, now, &evicted)
		}
		if old != nil {
			sh.takeBack(nil, lent)
		}
	})
	return evicted
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

// usage is what a store holds.
type Usage struct {
	Kinds    PerKind // entries per kind
	Variants int     // entries tailored to a client subnet (ECS)
	Held     int64   // bytes: chunks, tables, ring bookkeeping
}

// usage sums what the shards hold, each read under its lock. It is read for
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

// sameShape reports whether o was made with the budget, caps and stale
// window of s, so that it can serve in its place. The number of shards may
// differ: it follows GOMAXPROCS when a store is made, which Go changes with
// the container's CPU limit, and either number serves.
func (s *Store) SameShape(o *Store) bool {
	return s.capacity == o.capacity && s.limits == o.limits && s.shards[0].grace == o.shards[0].grace
}

// remove drops the entry stored under key, if any.
func (s *Store) Remove(key []byte) {
	h := s.Hash(key)
	s.locked(h, func(sh *shard) {
		if i := sh.find(key, h); i >= 0 {
			var evicted PerKind // a removal is not an eviction
			sh.drop(i, sh.at(sh.table[i]), &evicted)
		}
	})
}

// Cursor is where a walk of the store resumes; its zero value starts one.
type Cursor struct {
	shard, chunk int
}

// Walk visits the entries of the next chunk of the ring from c on, with its
// shard locked, so that a walk of the whole store holds no lock for longer
// than one chunk takes; visit returns true to remove the entry (a removal
// is not an eviction). It returns the cursor to resume from, and false once
// every shard's ring has been walked. Entries stored after the walk passed
// their place are not visited: a walk sees what was stored when it began,
// less what was evicted or replaced meanwhile.
func (s *Store) Walk(c Cursor, visit func(e entry.Entry) (remove bool)) (Cursor, bool) {
	for ; c.shard < len(s.shards); c = (Cursor{shard: c.shard + 1}) {
		sh := &s.shards[c.shard]
		sh.mu.Lock()
		for ; c.chunk < len(sh.chunks); c.chunk++ {
			if sh.chunks[c.chunk] != nil && sh.used[c.chunk] > 0 {
				sh.walkChunk(c.chunk, visit)
				sh.mu.Unlock()
				c.chunk++
				return c, true
			}
		}
		sh.mu.Unlock()
	}
	return c, false
}

// walkChunk visits the live entries of chunk c; the caller holds sh.mu.
func (sh *shard) walkChunk(c int, visit func(e entry.Entry) bool) {
	b := sh.chunks[c]
	var removed PerKind // a removal is not an eviction
	for off := 0; off < int(sh.used[c]); {
		e := entry.Entry(b[off:])
		e = e[:e.Size():e.Size()]
		i := sh.slotOf(location(c, off), maphash.Bytes(sh.seed, e.Key()))
		off += len(e)
		if i < 0 {
			continue // garbage: replaced or removed
		}
		lent := sh.lend(e)
		remove := visit(lent)
		sh.takeBack(e, lent)
		if remove {
			sh.drop(i, e, &removed)
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
// counts are those of the entries indexed, the bytes held are those of the
// chunks, table and bookkeeping, and none exceeds its budget. It is for
// tests and debugging: it walks every index slot.
func (s *Store) Check() error {
	var sum Usage
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		held, err := sh.check(s)
		u := Usage{Kinds: sh.kinds, Variants: sh.variants, Held: held}
		sh.mu.Unlock()
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
		for k := range u.Kinds {
			sum.Kinds[k] += u.Kinds[k]
		}
		sum.Variants += u.Variants
		sum.Held += u.Held
	}
	if u := s.Usage(); u != sum {
		return fmt.Errorf("Usage says %+v, the shards hold %+v", u, sum)
	}
	if sum.Held > s.capacity {
		return fmt.Errorf("the store holds %d bytes, capacity %d", sum.Held, s.capacity)
	}
	return nil
}

// check is Check for one shard, whose lock the caller holds; it returns the
// bytes the shard holds.
func (sh *shard) check(s *Store) (int64, error) {
	n, kinds, variants := 0, PerKind{}, 0
	for _, v := range sh.table {
		if v == 0 {
			continue
		}
		n++
		e := sh.at(v)
		if h := s.Hash(e.Key()); h>>locBits != v>>locBits {
			return 0, errors.New("slot hash bits do not match the entry's key")
		}
		kinds[KindOf(e)]++
		if e.Flags()&entry.FlagVariant != 0 {
			variants++
		}
	}
	if n != sh.count || kinds != sh.kinds || variants != sh.variants {
		return 0, fmt.Errorf("%d slots, %v kinds, %d variants; the shard says %d, %v, %d", n, kinds, variants, sh.count, sh.kinds, sh.variants)
	}
	var chunks int64
	for _, c := range sh.chunks {
		if c != nil {
			chunks += chunkSize
		}
	}
	held := chunks + int64(len(sh.table))*8 + sh.overhead()
	if held != sh.held || held > sh.budget {
		return 0, fmt.Errorf("holds %d bytes, accounted %d, budget %d", held, sh.held, sh.budget)
	}
	return held, nil
}

// overhead is what a shard holds besides its chunks and its table.
func (sh *shard) overhead() int64 {
	return int64(len(sh.chunks))*(24+4) + 256
}

// get returns the entry stored under key, or nil. The caller holds sh.mu and
// must not use the entry after releasing it.
func (sh *shard) get(key []byte, h uint64) entry.Entry {
	if i := sh.find(key, h); i >= 0 {
		return sh.at(sh.table[i])
	}
	return nil
}

// find returns the table index of key's slot, or -1.
func (sh *shard) find(key []byte, h uint64) int {
	mask := uint64(len(sh.table) - 1)
	tag := h >> locBits
	for i := tag & mask; ; i = (i + 1) & mask {
		v := sh.table[i]
		if v == 0 {
			return -1
		}
		if v>>locBits == tag && bytes.Equal(sh.at(v).Key(), key) {
			return int(i)
		}
	}
}

// slotOf returns the table index of the slot that locates the entry at loc,
// or -1 when the entry is garbage (replaced or evicted).
func (sh *shard) slotOf(loc uint64, h uint64) int {
	mask := uint64(len(sh.table) - 1)
	for i := (h >> locBits) & mask; ; i = (i + 1) & mask {
		v := sh.table[i]
		if v == 0 {
			return -1
		}
		if v&locMask == loc+1 {
			return int(i)
		}
	}
}

// at returns the entry a slot value locates.
func (sh *shard) at(v uint64) entry.Entry {
	loc := v&locMask - 1
	b := sh.chunks[loc>>chunkBits][loc&(chunkSize-1):]
	n := binary.LittleEndian.Uint32(b[entry.OffSize:])
	return entry.Entry(b[:n:n])
}

func location(chunk, off int) uint64 { return uint64(chunk)<<chunkBits | uint64(off) }

func (sh *shard) put(e entry.Entry, h uint64, now int64, evicted *PerKind) {
	if len(e) > entry.MaxLen {
		panic("compactcache: entry over maxEntryLen reached the store")
	}
	sh.makeTableRoom(now, evicted)
	chunk, off := sh.reserve(len(e), now, evicted)
	copy(sh.chunks[chunk][off:], e)
	v := h>>locBits<<locBits | location(chunk, off) + 1

	if i := sh.find(e.Key(), h); i >= 0 {
		sh.tally(sh.at(sh.table[i]), -1)
		sh.table[i] = v
	} else {
		sh.insertSlot(v)
	}
	sh.tally(e, 1)
	if k := KindOf(e); sh.limits[k] > 0 && sh.kinds[k] > sh.limits[k] {
		sh.evictOldest(k, evicted)
	}
}

// insertSlot adds v to the table; the caller made room.
func (sh *shard) insertSlot(v uint64) {
	mask := uint64(len(sh.table) - 1)
	i := (v >> locBits) & mask
	for sh.table[i] != 0 {
		i = (i + 1) & mask
	}
	sh.table[i] = v
	sh.count++
}

// deleteSlot empties slot i, shifting later slots of its probe run back so
// lookups need no tombstones.
func (sh *shard) deleteSlot(i int) {
	mask := len(sh.table) - 1
	for j := (i + 1) & mask; sh.table[j] != 0; j = (j + 1) & mask {
		home := int(sh.table[j]>>locBits) & mask
		// The slot at j may move to i unless its home lies cyclically in (i, j].
		if (i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			sh.table[i] = sh.table[j]
			i = j
		}
	}
	sh.table[i] = 0
	sh.count--
}

// makeTableRoom keeps the table at most three quarters full: it doubles the
// table while the budget allows, and evicts entries otherwise. Freeing
// chunks to grow the table instead would drop entries without their second
// chance.
func (sh *shard) makeTableRoom(now int64, evicted *PerKind) {
	for 4*(sh.count+1) > 3*len(sh.table) {
		if sh.held+sh.growthRoom() <= sh.budget {
			sh.resize(2 * len(sh.table))
			continue
		}
		sh.advance(now, evicted)
	}
}

// growthRoom is the budget that doubling the table takes: the bytes it adds,
// and where the new table is mapped on its own, the old table's too, which
// stays mapped beside it while it is filled, so that the shard is within its
// budget throughout.
func (sh *shard) growthRoom() int64 {
	grow := int64(len(sh.table)) * 8
	if sh.arena.mapsAlone(2 * len(sh.table) * 8) {
		return 2 * grow
	}
	return grow
}

func (sh *shard) resize(n int) {
	old := sh.table
	sh.held += int64(n-len(old)) * 8
	sh.table = sh.arena.table(n)
	sh.count = 0
	for _, v := range old {
		if v != 0 {
			sh.insertSlot(v)
		}
	}
	sh.arena.free(old)
}

// reserve returns a place for n bytes at the end of the ring.
func (sh *shard) reserve(n int, now int64, evicted *PerKind) (chunk, off int) {
	for {
		if t := sh.tail; t >= 0 && int(sh.used[t])+n <= chunkSize {
			off = int(sh.used[t])
			sh.used[t] += uint32(n)
			return t, off
		}
		next := (sh.tail + 1) % len(sh.chunks)
		if sh.chunks[next] == nil && sh.held+chunkSize <= sh.budget {
			sh.chunks[next] = sh.arena.chunk(next)
			sh.held += chunkSize
			sh.tail = next
			continue
		}
		sh.advance(now, evicted)
	}
}

// advance reclaims the oldest chunk and makes it the tail.
func (sh *shard) advance(now int64, evicted *PerKind) {
	c := sh.oldest()
	sh.reclaim(c, now, evicted)
	sh.tail = c
}

// oldest returns the allocated chunk after the tail in ring order, which may
// be the tail itself, or -1 when no chunk is allocated.
func (sh *shard) oldest() int {
	n := len(sh.chunks)
	for i := 1; i <= n; i++ {
		if c := (sh.tail + i + n) % n; sh.chunks[c] != nil {
			return c
		}
	}
	return -1
}

// reclaim compacts chunk c: live entries hit since the ring last passed them
// move to its front, spending their second chance; the rest are dropped.
func (sh *shard) reclaim(c int, now int64, evicted *PerKind) {
	b := sh.chunks[c]
	w := 0
	for off := 0; off < int(sh.used[c]); {
		e := entry.Entry(b[off:])
		n := e.Size()
		if i := sh.slotOf(location(c, off), maphash.Bytes(sh.seed, e.Key())); i >= 0 {
			if e.Referenced() && now <= e.Expires()+sh.grace {
				e.Passed()
				copy(b[w:], b[off:off+n])
				sh.table[i] = sh.table[i]>>locBits<<locBits | location(c, w) + 1
				w += n
			} else {
				sh.drop(i, e, evicted)
			}
		}
		off += n
	}
	sh.used[c] = uint32(w)
	sh.forget(c)
}

func (sh *shard) drop(i int, e entry.Entry, evicted *PerKind) {
	sh.tally(e, -1)
	evicted[KindOf(e)]++
	sh.deleteSlot(i)
}

// tally counts e in (d = 1) or out (d = -1) of the shard's counts.
func (sh *shard) tally(e entry.Entry, d int) {
	sh.kinds[KindOf(e)] += d
	if e.Flags()&entry.FlagVariant != 0 {
		sh.variants += d
	}
}

// forget invalidates the cursors into chunk c, whose entries moved.
func (sh *shard) forget(c int) {
	for k := range sh.cursor {
		if sh.cursor[k].chunk == c {
			sh.cursor[k].valid = false
		}
	}
}

// evictOldest drops the oldest live entry of kind k, for the per-kind entry
// caps of the stock cache. The cursor makes repeated calls walk the ring once
// rather than once per call.
func (sh *shard) evictOldest(k int, evicted *PerKind) {
	pos := sh.cursor[k]
	if !pos.valid {
		pos = position{chunk: sh.oldest()}
	}
	n := len(sh.chunks)
	for step := 0; step <= n; step++ {
		c := (pos.chunk + step) % n
		if sh.chunks[c] == nil {
			continue
		}
		off := 0
		if step == 0 {
			off = pos.off
		}
		for off < int(sh.used[c]) {
			e := entry.Entry(sh.chunks[c][off:])
			next := off + e.Size()
			if KindOf(e) == k {
				if i := sh.slotOf(location(c, off), maphash.Bytes(sh.seed, e.Key())); i >= 0 {
					sh.drop(i, e, evicted)
					sh.cursor[k] = position{chunk: c, off: next, valid: true}
					return
				}
			}
			off = next
		}
	}
	sh.cursor[k].valid = false
}
