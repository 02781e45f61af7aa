//go:build linux && !race

package compactcache

import (
	"sync"
	"syscall"
	"unsafe"
)

// mapsMemory reports whether arenas live outside the Go heap in this build.
const mapsMemory = true

// The ring is mapped in small pages, so that only the chunks handed out are
// resident, and each run of chunks that fills a huge page is collapsed into
// one once the last of them is handed out: at a million entries a hit's
// random read of its entry otherwise misses the TLB, a page walk that
// under virtualisation costs as much as the read itself.
const (
	hugePage        = 2 << 20 // a transparent huge page with 4 KiB base pages (amd64, arm64)
	madviseCollapse = 25      // MADV_COLLAPSE, Linux 6.1; missing from package syscall
)

// Collapsing copies the 2 MiB, 0.6 to 6 ms on a virtual machine (memory the
// host has not backed yet costs the most): too long for a miss to wait under
// its shard's lock, so one goroutine does it for every store. A collapse
// that finds the queue full is left to khugepaged.
var (
	collapses      = make(chan pendingCollapse, 256)
	startCollapser sync.Once
)

// pendingCollapse is a huge page of a's ring, at offset off, to collapse.
type pendingCollapse struct {
	a   *arena
	off int
}

func collapser() {
	for c := range collapses {
		c.a.collapse(c.off)
	}
}

// arena is the memory of one shard outside the Go heap.
type arena struct {
	chunks  int    // chunks in the shard's ring
	mapping []byte // the ring's reservation, a huge page larger than the ring
	ring    []byte // the reservation's first hugePage-aligned bytes
	failed  bool   // the reservation failed; chunks come from the heap

	// tables are the mapped tables: the current one and, during a resize,
	// the one it replaces.
	tables []mappedTable

	// mu orders release, which runs on the cleanup goroutine, after the
	// shard's last use; held counts the bytes mapped for the tests.
	mu   sync.Mutex
	held int64

	// ringMu keeps the ring mapped while the collapser works on it.
	ringMu sync.Mutex
}

func newArena(chunks int) *arena { return &arena{chunks: chunks} }

// chunk returns chunk i of the ring; the shard hands chunks out in order.
// The ring is reserved whole at the first chunk, without swap reservation
// (MAP_NORESERVE), and its pages become resident as chunks are written, so
// a store that never fills its budget never takes it.
func (a *arena) chunk(i int) []byte {
	if a.ring == nil && !a.failed {
		a.reserve()
	}
	if a.failed {
		return make([]byte, chunkSize)
	}
	a.add(chunkSize)
	off := i * chunkSize
	if end := off + chunkSize; end%hugePage == 0 {
		a.collapseLater(end - hugePage)
	}
	return a.ring[off : off+chunkSize : off+chunkSize]
}

func (a *arena) reserve() {
	n := a.chunks * chunkSize
	m, err := mmap(n + hugePage)
	if err != nil {
		a.failed = true
		return
	}
	a.mapping, a.ring = m, alignHuge(m, n)
	// Huge pages at fault time would make a partly filled ring resident
	// 2 MiB at a time, beyond what the budget accounting counts.
	syscall.Madvise(a.ring, syscall.MADV_NOHUGEPAGE)
}

// collapseLater has the huge page at off, whose chunks are all handed out
// and so all counted, collapsed: resident memory stays what the accounting
// counts. Where the kernel cannot (THP disabled, no free huge page), it
// stays in small pages.
func (a *arena) collapseLater(off int) {
	if syscall.Madvise(a.ring[off:off+hugePage], syscall.MADV_HUGEPAGE) != nil {
		return
	}
	startCollapser.Do(func() { go collapser() })
	select {
	case collapses <- pendingCollapse{a, off}:
	default:
	}
}

func (a *arena) collapse(off int) {
	a.ringMu.Lock()
	defer a.ringMu.Unlock()
	if a.ring != nil {
		syscall.Madvise(a.ring[off:off+hugePage], madviseCollapse)
	}
}

// mappedTable is a table and the mapping it lies in.
type mappedTable struct {
	mapping, table []byte
}

// table returns a zeroed table of n slots. A table of a huge page or more
// is a whole number of huge pages, each written to within the resize that
// fills it (slots land at random), so it lies in huge pages at no cost in
// memory beyond what the accounting counts, and a probe of a large store
// seldom misses the TLB.
func (a *arena) table(n int) []uint64 {
	size := n * 8
	if size < minMappedTable {
		return make([]uint64, n)
	}
	slack := 0
	if size >= hugePage {
		slack = hugePage
	}
	m, err := mmap(size + slack)
	if err != nil {
		return make([]uint64, n)
	}
	t := mappedTable{mapping: m, table: m[:size]}
	if slack > 0 {
		t.table = alignHuge(m, size)
		syscall.Madvise(t.table, syscall.MADV_HUGEPAGE)
	}
	a.tables = append(a.tables, t)
	a.add(int64(size))
	return unsafe.Slice((*uint64)(unsafe.Pointer(&t.table[0])), n)
}

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
	if syscall.Munmap(mt.mapping) == nil {
		a.add(-int64(len(mt.table)))
	}
}

func (a *arena) add(n int64) {
	a.mu.Lock()
	a.held += n
	a.mu.Unlock()
	offHeap.Add(n)
}

// mapped returns the bytes of the arena counted in offHeap.
func (a *arena) mapped() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// alignHuge returns the n bytes of m that start at its first huge page
// boundary; m has a huge page more than n. The bytes before and after are
// never touched: address space, not memory.
func alignHuge(m []byte, n int) []byte {
	skip := (hugePage - int(uintptr(unsafe.Pointer(&m[0]))%hugePage)) % hugePage
	return m[skip : skip+n : skip+n]
}

func mmap(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
}
