//go:build linux && !race

package store

import (
	"math/bits"
	"runtime"
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

// madvisePopulateWrite is MADV_POPULATE_WRITE (Linux 5.14), missing from
// package syscall.
const madvisePopulateWrite = 23

// populate makes b resident, writable, with one system call, where writing
// to it would fault its small pages in one at a time: the kernel's entry for
// each fault costs more than the page it sets up, and under virtualisation
// many times more. A kernel that refuses the advice leaves b to fault as it
// is written.
func populate(b []byte) { syscall.Madvise(b, madvisePopulateWrite) }

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
	populate(a.ring[off : off+n])
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
	if ringsReserved.Add(1)%ringsPerCycle == 0 {
		go runtime.GC() // not under the shard's lock, which the caller holds
	}
}

// The collector paces itself by the Go heap alone, and a dropped store's
// rings are unmapped only by a cleanup after a cycle (releaseWhenUnreachable).
// A process that makes and drops stores faster than its heap grows, as a
// fuzzer does thousands of times a second, would pile up thousands of
// mappings and the chunks written in them until it ran out of mappings
// (vm.max_map_count) or memory. So every ringsPerCycle rings reserved start
// a cycle. A server reserves at most maxShards rings a block, at startup and
// at a reload that changes a store's shape, so in service this is rare.
const ringsPerCycle = 1024

var ringsReserved atomic.Uint64

// collapseLater has the huge page at off, whose chunks are all handed out
// and so all counted, collapsed: resident memory stays what the accounting
// counts. Where the kernel cannot (THP disabled, no free huge page), it
// stays in small pages, as does a page a chunk was freed from (freeChunk),
// which a collapse would make resident again.
func (a *arena) collapseLater(off int) {
	a.ringMu.Lock()
	hole := slices.Contains(a.holes, off)
	a.ringMu.Unlock()
	if hole || syscall.Madvise(a.ring[off:off+hugePage], syscall.MADV_HUGEPAGE) != nil {
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

// mappedTable is a table and the mapping it lies in, or the shared region
// it lies in.
type mappedTable struct {
	mapping, table []byte
	region         *tableRegion
}

// table returns a zeroed table of size bytes. A table of a huge page or more
// is a whole number of huge pages, each written to within the resize that
// fills it (slots land at random), so it lies in huge pages at no cost in
// memory beyond what the accounting counts, and a probe of a large store
// seldom misses the TLB. Smaller tables do too where the store shares huge
// pages among its shards' tables (sharedTables).
func (a *arena) table(size int) []byte {
	place := a.placeOf(size)
	if place == onHeap {
		return make([]byte, size)
	}
	t, ok := a.mapTable(size, place)
	if !ok {
		return make([]byte, size)
	}
	a.tables = append(a.tables, t)
	if t.region != nil {
		a.hold(int64(size)) // offHeap counts the region's pages whole
	} else {
		a.add(int64(size))
	}
	return t.table
}

// tablePlace is where a table lies.
type tablePlace int

const (
	onHeap      tablePlace = iota // too small to be worth a mapping
	inRegion                      // in huge pages shared with other shards' tables
	mappedAlone                   // in a mapping of its own
)

// placeOf returns where a table of size bytes goes: the smallest on the
// heap, those under a huge page in the shared regions of a store that has
// them, the rest in mappings of their own.
func (a *arena) placeOf(size int) tablePlace {
	switch {
	case size < minMappedTable:
		return onHeap
	case inRegions(size) && a.shared != nil:
		return inRegion
	}
	return mappedAlone
}

// mapTable maps a table of size bytes where place says; a table for the
// shared regions that finds no room in them is mapped on its own.
func (a *arena) mapTable(size int, place tablePlace) (mappedTable, bool) {
	if place == inRegion {
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
		if err == nil {
			populate(t.table) // a resize writes every page of it
		}
	}
	return t, err == nil
}

// mapsAlone reports whether a table of size bytes is mapped on its own, so
// that while a resize fills it the table it replaces stays mapped beside it:
// a table too large for the shared regions, or one meant for them that finds
// no room there now. Another shard may take the last room before this one's
// resize maps its table: that table is then mapped alone with the old one
// beside it uncounted, until the resize ends.
func (a *arena) mapsAlone(size int) bool {
	switch a.placeOf(size) {
	case mappedAlone:
		return true
	case inRegion:
		return !a.shared.fits(size)
	}
	return false
}

// free unmaps t, a table that resize replaced, if it was mapped.
func (a *arena) free(t []byte) {
	for i, mt := range a.tables {
		if &mt.table[0] == &t[0] {
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
	if mt.region != nil {
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

// hold counts n more bytes for the arena alone: a table in a shared region,
// whose pages offHeap counts whole.
func (a *arena) hold(n int64) {
	a.mu.Lock()
	a.held += n
	a.mu.Unlock()
}

// mapped returns the bytes the arena holds: its chunks handed out and its
// tables (offHeap counts a shared table's pages instead).
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
// shards of one store, from regions of whole huge pages that each hold
// tables of one size. A store of a million entries on 16 cores has 64 tables
// of 256 KiB, one a shard (shardCount): on pages of their own, the miss's
// probe of a cold table slot is a TLB miss, whose page walk under
// virtualisation costs more than the read itself, and whose entries push out
// those of the rest of the server.
//
// A region holds a whole number of tables too (regionPages): one huge page
// for tables of a power of two, five for eight tables of 1.25 MiB, so that
// the sizes tableSizeAfter puts between 1 MiB and a huge page lie in huge
// pages as well, with none of a region's pages part used once its tables are
// all handed out.
//
// A page's free part is resident but in no shard's count: tables of one
// size fill a region as the shards reach that size, and leave holes in it as
// they outgrow it. So that memory stays within the budget, at most maxPages
// pages hold tables, and the store takes them out of its shards' budgets
// (reserve); a table that finds no room in them is mapped on its own.
//
// Only the pages a table handed out lies in count against maxPages: the
// others are never written, or given back once the last table in them
// leaves. Counting whole regions would be simpler, but when the shards
// outgrow one size together, the regions of the size they leave and of the
// size they take would both count whole until the last shard had moved: for
// eight shards stepping from 1 MiB to 1.25 MiB, four pages and five where the
// tables need at most seven. For every table to stay in huge pages, the
// reserve would have to be about a region larger, and the reserve is taken
// out of the shards' budgets: a full store would hold fewer entries for good
// to pay for one step of its growth.
type sharedTables struct {
	mu       sync.Mutex
	regions  []*tableRegion
	pages    int // the regions' huge pages that hold a table handed out
	maxPages int
}

// minSharedTables is the smallest store capacity whose tables share huge
// pages, and sharedShare the part of the capacity the pages may take.
const (
	sharedShare     = 32
	minSharedTables = sharedShare * hugePage
)

// newSharedTables returns the shared table regions for a store of capacity
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

// regionTables is the most tables a region holds: the bits of
// tableRegion.used.
const regionTables = 32

// regionPages returns the huge pages of a region of tables of size bytes,
// the fewest that hold a whole number of them: the odd factor of size, as a
// huge page is a power of two larger than the table.
func regionPages(size int) int { return size >> bits.TrailingZeros(uint(size)) }

// inRegions reports whether tables of size bytes go in regions: smaller than
// a huge page, and few enough to a region for the bits of tableRegion.used.
func inRegions(size int) bool {
	return size > 0 && size < hugePage && regionPages(size)*hugePage/size <= regionTables
}

// tableRegion is whole huge pages of tables of one size.
type tableRegion struct {
	mapping []byte // a huge page more than the region, for alignment
	region  []byte // regionPages(size) huge pages
	size    int    // the bytes of each table
	used    uint32 // bit i: the table at i*size is handed out
}

// pages returns the first and last huge page that table i lies in.
func (r *tableRegion) pages(i int) (first, last int) {
	return i * r.size / hugePage, ((i+1)*r.size - 1) / hugePage
}

// inUse reports whether a table handed out lies in page p.
func (r *tableRegion) inUse(p int) bool {
	for i := p * hugePage / r.size; i*r.size < (p+1)*hugePage; i++ {
		if r.used&(1<<i) != 0 {
			return true
		}
	}
	return false
}

// cost returns the pages that handing out table i, free, adds to those
// counted: the pages it lies in that hold no table handed out.
func (r *tableRegion) cost(i int) int {
	first, last := r.pages(i)
	n := 0
	for p := first; p <= last; p++ {
		if !r.inUse(p) {
			n++
		}
	}
	return n
}

// get returns a zeroed table of size bytes.
func (st *sharedTables) get(size int) (mappedTable, bool) {
	t, r := st.take(size)
	if r == nil {
		return mappedTable{}, false
	}
	// Zeroed outside the lock, which other shards' resizes wait on: the
	// table is this caller's alone once taken.
	clear(t) // what a table that had the place left
	return mappedTable{table: t, region: r}, true
}

// take marks a free table of size bytes handed out and returns it and its
// region; no region when there is no room within maxPages.
func (st *sharedTables) take(size int) ([]byte, *tableRegion) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, i, n := st.room(size)
	if r == nil {
		return nil, nil
	}
	st.pages += n
	offHeap.Add(int64(n) * hugePage)
	r.used |= 1 << i
	return r.region[i*size : (i+1)*size : (i+1)*size], r
}

// fits reports whether a table of size bytes would find room in the regions
// now.
func (st *sharedTables) fits(size int) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, _, _, fresh := st.choose(size)
	return r != nil || fresh
}

// choose returns a free table of size bytes in the regions mapped whose pages
// fit within maxPages, and the pages it adds to those counted: one that adds
// the fewest, so that the tables of a size keep to the pages already
// resident. Where none does, fresh reports whether the first table of a new
// region would fit.
func (st *sharedTables) choose(size int) (best *tableRegion, at, cost int, fresh bool) {
	for _, r := range st.regions {
		if r.size != size {
			continue
		}
		for i := range len(r.region) / size {
			if r.used&(1<<i) != 0 {
				continue
			}
			if c := r.cost(i); best == nil || c < cost {
				best, at, cost = r, i, c
			}
		}
	}
	if best != nil && st.pages+cost <= st.maxPages {
		return best, at, cost, false
	}
	return nil, 0, 0, st.pages+1 <= st.maxPages // a region's first table lies in one page
}

// room returns the table choose picks, mapping a new region for it where
// choose found room only there.
func (st *sharedTables) room(size int) (*tableRegion, int, int) {
	r, at, cost, fresh := st.choose(size)
	if !fresh {
		return r, at, cost
	}
	m, region, err := mapHugeAligned(regionPages(size)*hugePage, syscall.MADV_HUGEPAGE)
	if err != nil {
		return nil, 0, 0
	}
	r = &tableRegion{mapping: m, region: region, size: size}
	st.regions = append(st.regions, r)
	return r, 0, r.cost(0)
}

// put takes back t, giving back the pages no table handed out lies in any
// more: the region is unmapped once no table is left in it.
func (st *sharedTables) put(t mappedTable) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r := t.region
	i := int(uintptr(unsafe.Pointer(&t.table[0]))-uintptr(unsafe.Pointer(&r.region[0]))) / r.size
	r.used &^= 1 << i
	// A region that fails to unmap stays listed for the next table of its
	// size, its free pages given back like those of a region in use: what
	// is not counted is not resident.
	unmapped := r.used == 0 && syscall.Munmap(r.mapping) == nil
	first, last := r.pages(i)
	for p := first; p <= last; p++ {
		if r.inUse(p) {
			continue
		}
		if !unmapped {
			syscall.Madvise(r.region[p*hugePage:(p+1)*hugePage], syscall.MADV_DONTNEED)
		}
		st.pages--
		offHeap.Add(-hugePage)
	}
	if unmapped {
		st.regions = slices.DeleteFunc(st.regions, func(q *tableRegion) bool { return q == r })
	}
}
