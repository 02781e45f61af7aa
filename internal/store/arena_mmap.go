//go:build linux && !race

package store

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// mapsMemory reports whether arenas live outside the Go heap in this build.
const mapsMemory = true

// The ring is mapped in small pages, so that only the chunks handed out are
// resident, and each run of chunks that fills a huge page is collapsed into
// one once the last of them is handed out: at a million entries a hit's
// random read of its entry otherwise misses the TLB, a page walk that
// under virtualisation costs as much as the read itself.
const madviseCollapse = 25 // MADV_COLLAPSE, Linux 6.1; missing from package syscall

// Collapsing copies the 2 MiB, milliseconds on a virtual machine (memory
// the host has not backed yet costs the most): too long for a miss to wait
// under its shard's lock, so one goroutine does it for every store. A collapse
// that finds the queue full is left to khugepaged.
//
// The kernel copies with the process's mmap lock held for writing, and the
// page faults of every thread that wait for it include those of the stores'
// rings, one every few dozen entries a shard stores. So the goroutine holds a collapse back while any store grows: until
// none has handed out a chunk for collapseQuiet, or until collapseEvery has
// passed since its last collapse (or since it took the page, after an idle
// spell). A growing store's faults are then seldom stalled, and its huge
// pages are made at 2 MiB a second until it slows; collapses run as soon as
// their huge page was handed out stall a fill often enough to slow every
// insert.
var (
	collapses      chan pendingCollapse // made with the collapser, for the first huge page queued
	startCollapser sync.Once
	growth         atomic.Uint64 // chunks handed out by every store, ever
)

const (
	collapseQueue = 4096 // huge pages: 8 GiB of rings
	collapseQuiet = 100 * time.Millisecond
	collapseEvery = time.Second
)

// pendingCollapse is a huge page of a's ring, at offset off, to collapse.
type pendingCollapse struct {
	a   *arena
	off int
}

func collapser(queue <-chan pendingCollapse) {
	turn := collapseTurn{growth: &growth, last: time.Now(), now: time.Now, sleep: time.Sleep}
	for c := range queue {
		turn.take(c)
		collapsesPending.Add(-1)
	}
}

// collapseTurn tells the collapser when its next collapse may run.
type collapseTurn struct {
	growth *atomic.Uint64 // the chunks handed out, read to tell growth
	last   time.Time      // when the last collapse ended
	took   time.Duration  // how long it took
	chunks uint64         // growth as last read
	since  time.Time      // when growth was first read at that count

	// now and sleep are time.Now and time.Sleep but in tests, whose clock
	// must not depend on how busy the machine is.
	now   func() time.Time
	sleep func(time.Duration)
}

// take collapses c's page when its turn comes. The page of a store dropped
// since it was queued takes no turn, which would hold back the pages of the
// stores that replaced it: skipped at once, or, dropped while it waited, not
// counted as the last collapse.
func (t *collapseTurn) take(c pendingCollapse) {
	if c.a.released() {
		return
	}
	t.await(t.now())
	start := t.now()
	if c.a.collapse(c.off) {
		t.last = t.now()
		t.took = t.last.Sub(start)
	}
}

// await returns, for a page the collapser took from the queue at received,
// once no store has handed out a chunk for collapseQuiet, or once
// collapseEvery has passed since the later of the last collapse and
// received; and at least as long after the last collapse as it took, so
// that the page faults of the process wait for collapses at most half the
// time when many are pending, as after a store filled fast. It reads growth
// every tenth of collapseQuiet.
func (t *collapseTurn) await(received time.Time) {
	from := t.last
	if received.After(from) {
		from = received // after an idle spell, a growing store's first page waits too
	}
	for {
		now := t.now()
		if n := t.growth.Load(); n != t.chunks {
			t.chunks, t.since = n, now
		}
		quiet := now.Sub(t.since) >= collapseQuiet
		if now.Sub(t.last) >= t.took && (quiet || now.Sub(from) >= collapseEvery) {
			return
		}
		t.sleep(collapseQuiet / 10)
	}
}

// arena is the memory of one shard outside the Go heap.
type arena struct {
	chunks  int    // chunks in the shard's ring
	mapping []byte // the ring's reservation, a huge page larger than the ring
	ring    []byte // the reservation's first hugePage-aligned bytes
	failed  bool   // the reservation failed; chunks come from the heap

	// tables are the mapped tables: the current one and, during a resize,
	// the one it replaces. shared, when not nil, holds those smaller than a
	// huge page.
	tables []mappedTable
	shared *sharedTables

	// mu orders release, which runs on the cleanup goroutine, after the
	// shard's last use; held counts the bytes mapped for the tests.
	mu   sync.Mutex
	held int64

	// ringMu keeps the ring mapped while the collapser works on it, and
	// guards holes: the huge pages of the ring a chunk was freed from,
	// never collapsed.
	ringMu sync.Mutex
	holes  []int
}

func newArena(chunks int, shared *sharedTables) *arena {
	return &arena{chunks: chunks, shared: shared}
}

// chunk returns chunk i of the ring, n bytes of it (chunkSize, or less for
// the last chunk a shard's budget holds); the shard hands chunks out in
// order. The ring is reserved whole at the first chunk, without swap
// reservation (MAP_NORESERVE), and its pages become resident as chunks are
// written, so a store that never fills its budget never takes it.
func (a *arena) chunk(i, n int) []byte {
	if a.ring == nil && !a.failed {
		a.reserve()
	}
	if a.failed {
		return make([]byte, n)
	}
	a.add(int64(n))
	growth.Add(1)
	off := i * chunkSize
	// A short chunk leaves its huge page part unused: not collapsed, so that
	// what is resident stays what is counted.
	if end := off + chunkSize; end%hugePage == 0 && n == chunkSize {
		a.collapseLater(end - hugePage)
	}
	return a.ring[off : off+n : off+n]
}

func (a *arena) reserve() {
	// Huge pages at fault time would make a partly filled ring resident
	// 2 MiB at a time, beyond what the budget accounting counts.
	m, ring, err := mapHugeAligned(a.chunks*chunkSize, syscall.MADV_NOHUGEPAGE)
	if err != nil {
		a.failed = true
		return
	}
	a.mapping, a.ring = m, ring
}

// collapseLater has the huge page at off, whose chunks are all handed out
// and so all counted, collapsed: resident memory stays what the accounting
// counts. Where the kernel cannot (THP disabled, no free huge page), it
// stays in small pages.
func (a *arena) collapseLater(off int) {
	if syscall.Madvise(a.ring[off:off+hugePage], syscall.MADV_HUGEPAGE) != nil {
		return
	}
	startCollapser.Do(func() {
		collapses = make(chan pendingCollapse, collapseQueue)
		go collapser(collapses)
	})
	// Counted before it is queued, so that the collapser's count of it done
	// never comes first.
	collapsesPending.Add(1)
	select {
	case collapses <- pendingCollapse{a, off}:
	default:
		collapsesPending.Add(-1)
	}
}

// released reports whether the ring is unmapped: its store was dropped.
func (a *arena) released() bool {
	a.ringMu.Lock()
	defer a.ringMu.Unlock()
	return a.ring == nil
}

// collapse collapses the huge page at off, and reports whether the ring was
// still mapped to collapse it in.
func (a *arena) collapse(off int) bool {
	a.ringMu.Lock()
	defer a.ringMu.Unlock()
	if a.ring == nil {
		return false
	}
	if slices.Contains(a.holes, off) {
		return true
	}
	syscall.Madvise(a.ring[off:off+hugePage], madviseCollapse)
	return true
}

// freeChunk gives back the memory of chunk i, n bytes, which the shard no
// longer uses. Its huge page is no longer advised to be one, so that
// khugepaged does not fill the hole again.
func (a *arena) freeChunk(i, n int) {
	a.ringMu.Lock()
	defer a.ringMu.Unlock()
	if a.ring == nil {
		return // on the heap: the garbage collector's
	}
	off := i * chunkSize
	page := off &^ (hugePage - 1)
	syscall.Madvise(a.ring[page:min(page+hugePage, len(a.ring))], syscall.MADV_NOHUGEPAGE)
	syscall.Madvise(a.ring[off:off+n], syscall.MADV_DONTNEED)
	a.add(-int64(n))
	a.holes = append(a.holes, page)
}

// mappedTable is a table and the mapping it lies in, or the shared huge
// page it lies in.
type mappedTable struct {
	mapping, table []byte
	page           *tablePage
}

// table returns a zeroed table of n slots. A table of a huge page or more
// is a whole number of huge pages, each written to within the resize that
// fills it (slots land at random), so it lies in huge pages at no cost in
// memory beyond what the accounting counts, and a probe of a large store
// seldom misses the TLB. Smaller tables do too where the store shares huge
// pages among its shards' tables (sharedTables).
func (a *arena) table(n int) []uint64 {
	size := n * 8
	place := a.placeOf(size)
	if place == onHeap {
		return make([]uint64, n)
	}
	t, ok := a.mapTable(size, place)
	if !ok {
		return make([]uint64, n)
	}
	a.tables = append(a.tables, t)
	if t.page != nil {
		a.hold(int64(size)) // offHeap counts the shared page whole
	} else {
		a.add(int64(size))
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&t.table[0])), n)
}

// tablePlace is where a table lies.
type tablePlace int

const (
	onHeap       tablePlace = iota // too small to be worth a mapping
	inSharedPage                   // in a huge page shared with other shards' tables
	mappedAlone                    // in a mapping of its own
)

// placeOf returns where a table of size bytes goes: the smallest on the
// heap, those under a huge page in the shared pages of a store that has
// them, the rest in mappings of their own.
func (a *arena) placeOf(size int) tablePlace {
	switch {
	case size < minMappedTable:
		return onHeap
	case size < hugePage && a.shared != nil:
		return inSharedPage
	}
	return mappedAlone
}

// mapTable maps a table of size bytes where place says; a table for the
// shared pages that finds no room in them is mapped on its own.
func (a *arena) mapTable(size int, place tablePlace) (mappedTable, bool) {
	if place == inSharedPage {
		if t, ok := a.shared.get(size); ok {
			return t, true
		}
	}
	var t mappedTable
	var err error
	if size >= hugePage {
		t.mapping, t.table, err = mapHugeAligned(size, syscall.MADV_HUGEPAGE)
	} else {
		t.mapping, err = mmap(size)
		t.table = t.mapping
	}
	return t, err == nil
}

// mapsAlone reports whether a table of size bytes is mapped on its own, so
// that while a resize fills it the table it replaces stays mapped beside it.
// A table meant for the shared pages that finds them full is mapped alone
// too, for less than a huge page, which this does not count.
func (a *arena) mapsAlone(size int) bool { return a.placeOf(size) == mappedAlone }

// free unmaps t, a table that resize replaced, if it was mapped.
func (a *arena) free(t []uint64) {
	for i, mt := range a.tables {
		if unsafe.Pointer(&mt.table[0]) == unsafe.Pointer(&t[0]) {
			a.unmap(mt)
			a.tables = append(a.tables[:i], a.tables[i+1:]...)
			return
		}
	}
}

// release unmaps everything; the shard is unreachable.
func (a *arena) release() {
	for _, mt := range a.tables {
		a.unmap(mt)
	}
	a.tables = nil
	// What is left counted are the chunks handed out.
	a.ringMu.Lock()
	defer a.ringMu.Unlock()
	if a.mapping != nil && syscall.Munmap(a.mapping) == nil {
		a.add(-a.mapped())
		a.mapping, a.ring = nil, nil
	}
}

func (a *arena) unmap(mt mappedTable) {
	if mt.page != nil {
		a.shared.put(mt)
		a.hold(-int64(len(mt.table)))
		return
	}
	if syscall.Munmap(mt.mapping) == nil {
		a.add(-int64(len(mt.table)))
	}
}

// add counts n more bytes mapped for the arena.
func (a *arena) add(n int64) {
	a.hold(n)
	offHeap.Add(n)
}

// hold counts n more bytes for the arena alone: a table in a shared page,
// which offHeap counts whole.
func (a *arena) hold(n int64) {
	a.mu.Lock()
	a.held += n
	a.mu.Unlock()
}

// mapped returns the bytes the arena holds: its chunks handed out and its
// tables (offHeap counts a shared table's page instead).
func (a *arena) mapped() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// mapHugeAligned maps n bytes that start at a huge page boundary, advised
// with advice (MADV_HUGEPAGE or MADV_NOHUGEPAGE), and returns them and the
// mapping they lie in, a huge page larger: the bytes before and after them
// are never touched, address space, not memory.
func mapHugeAligned(n, advice int) (mapping, aligned []byte, err error) {
	m, err := mmap(n + hugePage)
	if err != nil {
		return nil, nil, err
	}
	skip := (hugePage - int(uintptr(unsafe.Pointer(&m[0]))%hugePage)) % hugePage
	aligned = m[skip : skip+n : skip+n]
	syscall.Madvise(aligned, advice)
	return m, aligned, nil
}

func mmap(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
}

// sharedTables hands out the mapped tables smaller than a huge page to the
// shards of one store, from huge pages that each hold tables of one size.
// A store of a million entries on 16 cores has 64 tables of 256 KiB, one a
// shard (shardCount): on pages of their own, the miss's probe of a cold
// table slot is a TLB miss, whose page walk under virtualisation costs more
// than the read itself, and whose entries push out those of the rest of the
// server.
//
// A page's free part is resident but in no shard's count: tables of one
// size fill a page as the shards reach that size, and leave holes in it as
// they outgrow it, until the last one leaves and the page is unmapped. So
// that memory stays within the budget, at most maxPages pages are mapped,
// and the store takes them out of its shards' budgets (reserve); a table
// that finds no room in them is mapped on its own.
type sharedTables struct {
	mu       sync.Mutex
	pages    []*tablePage
	maxPages int
}

// minSharedTables is the smallest store capacity whose tables share huge
// pages, and sharedShare the part of the capacity the pages may take.
const (
	sharedShare     = 32
	minSharedTables = sharedShare * hugePage
)

// newSharedTables returns the shared table pages for a store of capacity
// bytes, or nil when its tables are to be mapped on their own.
func newSharedTables(capacity int64) *sharedTables {
	if capacity < minSharedTables {
		return nil
	}
	return &sharedTables{maxPages: int(capacity / sharedShare / hugePage)}
}

// reserve returns the bytes the store's shards leave in their budgets for
// the shared pages: all of them, since their free parts count nowhere else.
func (st *sharedTables) reserve() int64 {
	if st == nil {
		return 0
	}
	return int64(st.maxPages) * hugePage
}

// tablePage is a huge page of tables of one size.
type tablePage struct {
	mapping []byte // a huge page more than the page, for alignment
	page    []byte // the huge page
	size    int    // the bytes of each table
	used    uint32 // bit i: the table at i*size is handed out
}

// get returns a zeroed table of size bytes.
func (st *sharedTables) get(size int) (mappedTable, bool) {
	t, p := st.take(size)
	if p == nil {
		return mappedTable{}, false
	}
	// Zeroed outside the lock, which other shards' resizes wait on: the
	// slot is this caller's alone once taken.
	clear(t) // what a table that had the slot left
	return mappedTable{table: t, page: p}, true
}

// take marks a free table of size bytes handed out and returns it and its
// page; no page when there is no room and none may be mapped.
func (st *sharedTables) take(size int) ([]byte, *tablePage) {
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.pageWithRoom(size)
	if p == nil {
		return nil, nil
	}
	i := bits.TrailingZeros32(^p.used)
	p.used |= 1 << i
	return p.page[i*size : (i+1)*size : (i+1)*size], p
}

// pageWithRoom returns a page with a free table of size bytes, mapping one
// if none has.
func (st *sharedTables) pageWithRoom(size int) *tablePage {
	// The bits of a full page: 32 tables of 64 KiB shift the one out of
	// the uint32, and 0 - 1 sets all 32 (Go defines shifts past the width).
	full := uint32(1)<<(hugePage/size) - 1
	for _, p := range st.pages {
		if p.size == size && p.used != full {
			return p
		}
	}
	if len(st.pages) == st.maxPages {
		return nil
	}
	m, page, err := mapHugeAligned(hugePage, syscall.MADV_HUGEPAGE)
	if err != nil {
		return nil
	}
	p := &tablePage{mapping: m, page: page, size: size}
	st.pages = append(st.pages, p)
	offHeap.Add(hugePage)
	return p
}

// put takes back t, unmapping its page once no table is left in it.
func (st *sharedTables) put(t mappedTable) {
	st.mu.Lock()
	defer st.mu.Unlock()
	p := t.page
	i := int(uintptr(unsafe.Pointer(&t.table[0]))-uintptr(unsafe.Pointer(&p.page[0]))) / p.size
	p.used &^= 1 << i
	if p.used != 0 {
		return
	}
	// A page that fails to unmap stays listed, empty, for the next table
	// of its size: the pages mapped stay within maxPages.
	if syscall.Munmap(p.mapping) == nil {
		offHeap.Add(-hugePage)
		st.pages = slices.DeleteFunc(st.pages, func(q *tablePage) bool { return q == p })
	}
}
