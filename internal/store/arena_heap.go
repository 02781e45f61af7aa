//go:build !linux || race

package store

// Without the mappings of arena_mmap.go, the arenas are made on the heap:
// on other systems, and under the race detector, which sees a read of entry
// bytes without the shard's lock only on memory it shadows, the Go heap's.

// mapsMemory reports whether arenas live outside the Go heap in this build.
const mapsMemory = false

// arena makes a shard's memory on the Go heap, where the GC frees it.
type arena struct{}

func newArena(int, *sharedTables) *arena { return new(arena) }

// sharedTables has nothing to share: tables are made on the heap.
type sharedTables struct{}

func newSharedTables(int64) *sharedTables { return nil }

func (*sharedTables) reserve() int64 { return 0 }

func (*arena) chunk(_, n int) []byte { return make([]byte, n) }

func (*arena) freeChunk(int, int) {}

func (*arena) table(size int) []byte { return make([]byte, size) }

func (*arena) free([]byte) {}

// mapsAlone is false: the table a resize replaces is garbage on the heap.
func (*arena) mapsAlone(int) bool { return false }

func (*arena) release() {}

func (*arena) mapped() int64 { return 0 }
