package store

import (
	"runtime"
	"sync/atomic"
)

// Where the store's memory comes from. On Linux each shard maps its chunks,
// and its index table once that outgrows minMappedTable, outside the Go heap,
// the tables of a large store's shards sharing huge pages (arena_mmap.go);
// elsewhere, and under the race detector, they are made on the heap
// (arena_heap.go). Pointer-free memory on the heap costs the GC no
// marking, but it still has spans to sweep, and it raises the heap goal:
// with GOGC=100 the heap may grow to twice its live size before the next
// cycle, so a store of 1 GB on the heap lets the process grow by about
// another GB of garbage. Mapped memory is neither swept nor counted in the
// goal, so the GC's work and the process's headroom stay those of the rest
// of the program, however large the cache.
//
// The budget accounting (shard.held) does not change with where the memory
// is: a chunk counts chunkSize and a table its bytes either way.

// minMappedTable is the smallest table, in bytes, that is mapped: a multiple
// of every page size Linux uses (4 KiB to 64 KiB), so that a mapping holds
// exactly what the accounting counts. Smaller tables, a few KiB a shard for
// a store still filling, stay on the heap.
const minMappedTable = 64 << 10

// hugePage is a transparent huge page with 4 KiB base pages (amd64, arm64).
// The table sizes (tableSizeAfter) follow it in every build, so that a
// store holds as many entries in a given budget on the heap as mapped.
const hugePage = 2 << 20

// offHeap counts the bytes of every store in the process that live outside
// the Go heap: the chunks handed out (untouched parts of a shard's
// reservation are not resident and not counted) and the mapped tables.
var offHeap atomic.Int64

// OffHeapBytes returns the bytes that the stores of the process hold outside
// the Go heap, which runtime.MemStats does not see. The heap in use plus
// this is the memory the caches take.
func OffHeapBytes() int64 { return offHeap.Load() }

// collapsesPending counts the huge pages of the stores' rings that wait to be
// collapsed (arena_mmap.go).
var collapsesPending atomic.Int64

// HugePagesPending returns how many huge pages of the process's stores wait
// to be collapsed: the collapses are held back while a store grows, and
// spaced out after it. A benchmark waits for none before timing hits or the
// garbage collector, as a collapse holds up the process's page faults while
// it runs, and the hits of a page not yet collapsed miss the TLB.
func HugePagesPending() int64 { return collapsesPending.Load() }

// releaseWhenUnreachable unmaps the shards' memory once nothing can reach
// it. Why this is safe:
//
//   - Entry bytes are read and written only with their shard's lock held, and
//     copied out before it is released (the contract of shard.get). The lock
//     holder has a *shard, an interior pointer into s.shards, live on its
//     stack until its Unlock; the cleanup is attached to that array, so it
//     cannot run while any request, refresh or eviction is inside a shard.
//     Attaching it to the *store instead would not do: a request holds the
//     shard, not the store, from shard() to Unlock.
//   - A store handed to the next instance on reload (reload.go) is reachable
//     from that instance, so it keeps its memory; a store nobody took is
//     released at a GC cycle after the old instance's last request ends.
//   - The cleanup's argument holds the arenas, never the shards, so it does
//     not keep the array alive itself.
//   - While a store lives, its chunks are never unmapped (eviction reuses
//     them); a table replaced by a larger one is unmapped in resize, under
//     the lock, after every slot has moved.
func (s *Store) releaseWhenUnreachable() {
	arenas := make([]*arena, len(s.shards))
	for i := range s.shards {
		arenas[i] = s.shards[i].arena
	}
	runtime.AddCleanup(&s.shards[0], func(arenas []*arena) {
		for _, a := range arenas {
			a.release()
		}
	}, arenas)
}
