package bench

import (
	"runtime"
	"time"

	"github.com/compactcache/compactcache/internal/store"
)

// Settled returns the memory statistics once garbage is gone. The memory
// compactcache's stores map outside the Go heap is counted in HeapInuse and
// HeapAlloc, as if it were on the heap, where the stock cache keeps all of
// its. A store nobody holds any more is unmapped by a cleanup that runs
// after a cycle, in a goroutine of the runtime's: the cycles repeat until
// the mapped bytes stop changing.
func Settled() runtime.MemStats {
	runtime.GC()
	mapped := store.OffHeapBytes()
	for range 20 {
		time.Sleep(5 * time.Millisecond) // let the cleanups run
		runtime.GC()
		now := store.OffHeapBytes()
		if now == mapped {
			break
		}
		mapped = now
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	m.HeapInuse += uint64(mapped)
	m.HeapAlloc += uint64(mapped)
	return m
}

// HugePagesMade waits, at most limit, until compactcache has collapsed every
// huge page of its stores' rings that waits in its queue, and reports
// whether it has (pages it left to khugepaged, its queue full, are not
// counted). A collapse holds up the process's page faults while it runs,
// and the hits of a page not yet collapsed miss the TLB: hits and
// collections timed before would measure the kernel's copying
// (store.HugePagesPending).
func HugePagesMade(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for store.HugePagesPending() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
