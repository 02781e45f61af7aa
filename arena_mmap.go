//go:build linux && !race

package compactcache

import (
	"sync"
	"syscall"
	"unsafe"
)

// mapsMemory reports whether arenas live outside the Go heap in this build.
const mapsMemory = true

// arena is the memory of one shard outside the Go heap.
type arena struct {
	chunks int    // chunks in the shard's ring
	ring   []byte // reservation for the ring's chunks, mapped at the first
	failed bool   // the reservation failed; chunks come from the heap

	// tables are the mapped tables: the current one and, during a resize,
	// the one it replaces.
	tables [][]byte

	// mu orders release, which runs on the cleanup goroutine, after the
	// shard's last use; held counts the bytes mapped for the tests.
	mu   sync.Mutex
	held int64
}

func newArena(chunks int) *arena { return &arena{chunks: chunks} }

// chunk returns chunk i of the ring. The ring is reserved whole at the first
// chunk, without swap reservation (MAP_NORESERVE), and its pages become
// resident as chunks are written, so a store that never fills its budget
// never takes it.
func (a *arena) chunk(i int) []byte {
	if a.ring == nil && !a.failed {
		ring, err := mmap(a.chunks * chunkSize)
		if err != nil {
			a.failed = true
		} else {
			// Huge pages would make a partly filled ring resident 2 MiB
			// at a time, beyond what the budget accounting counts.
			syscall.Madvise(ring, syscall.MADV_NOHUGEPAGE)
			a.ring = ring
		}
	}
	if a.failed {
		return make([]byte, chunkSize)
	}
	a.add(chunkSize)
	off := i * chunkSize
	return a.ring[off : off+chunkSize : off+chunkSize]
}

// table returns a zeroed table of n slots.
func (a *arena) table(n int) []uint64 {
	if n*8 < minMappedTable {
		return make([]uint64, n)
	}
	b, err := mmap(n * 8)
	if err != nil {
		return make([]uint64, n)
	}
	a.tables = append(a.tables, b)
	a.add(int64(len(b)))
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n)
}

// free unmaps t, a table that resize replaced, if it was mapped.
func (a *arena) free(t []uint64) {
	for i, b := range a.tables {
		if unsafe.Pointer(&b[0]) == unsafe.Pointer(&t[0]) {
			a.unmap(b)
			a.tables = append(a.tables[:i], a.tables[i+1:]...)
			return
		}
	}
}

// release unmaps everything; the shard is unreachable.
func (a *arena) release() {
	for _, b := range a.tables {
		a.unmap(b)
	}
	a.tables = nil
	// What is left counted are the chunks handed out.
	if a.ring != nil && syscall.Munmap(a.ring) == nil {
		a.add(-a.mapped())
		a.ring = nil
	}
}

func (a *arena) unmap(b []byte) {
	if syscall.Munmap(b) == nil {
		a.add(-int64(len(b)))
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

func mmap(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
}
