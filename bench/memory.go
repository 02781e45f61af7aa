package bench

import (
	"runtime"
	"time"

	"github.com/compactcache/compactcache"
)

// Settled returns the memory statistics once garbage is gone. The memory
// compactcache's stores map outside the Go heap is counted in HeapInuse and
// HeapAlloc, as if it were on the heap, where the stock cache keeps all of
// its. A store nobody holds any more is unmapped by a cleanup that runs
// after a cycle, in a goroutine of the runtime's: the cycles repeat until
// the mapped bytes stop changing.
func Settled() runtime.MemStats {
	runtime.GC()
	mapped := compactcache.OffHeapBytes()
	for range 20 {
		time.Sleep(5 * time.Millisecond) // let the cleanups run
		runtime.GC()
		now := compactcache.OffHeapBytes()
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
