package compactcache

import (
	"sync"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/wallclock"
)

// The state compactcache keeps for the whole process rather than per block,
// and why each must outlive or span blocks:
//
//   - handoffs: a reload makes a new instance before the old one stops, and
//     a store passes from one to the other only through the process.
//   - scratchPool, fetchPool: buffers of requests in flight, shared by the
//     blocks so that an idle block holds none.
//   - wall: the wall clock read once a second for every cache.
//   - the metric families (internal/cachemetrics): the Prometheus registry
//     the prometheus plugin serves is the process's, and a family may be
//     registered once in it; the store gauges read every live store at a
//     scrape.
//   - the admin listeners (internal/adminserver) and the warm-ups in
//     progress (internal/persist): one listener per address outlives
//     reloads, and the ready plugin asks any block about every fill.
//   - what blocks started before their instance's servers are up
//     (internal/lifecycle): front ends' sockets, Kubernetes sources, shared
//     tiers' connections, admin registrations, timed snapshot writes; the
//     instance that started them may never start, nor shut down.
//   - the memory mapped outside the Go heap and the huge-page collapses
//     (internal/store, arena.go): the kernel's, counted once for the process.
//   - the type of plugin.NextOrFailure's writer (internal/coredns), learnt
//     once from CoreDNS itself.

// handoffs holds the stores that instances being reloaded offer, by block.
var handoffs = struct {
	sync.Mutex
	m map[string]handoff
}{m: map[string]handoff{}}

// scratchPool holds requests' buffers (scratch), so that a hit allocates
// nothing.
var scratchPool = sync.Pool{New: func() any {
	return &scratch{key: make([]byte, 0, entry.MaxKeyLen), probe: make([]byte, 0, entry.MaxKeyLen), replies: newReplyBuffers()}
}}

// fetchPool holds the fetches of misses that no other request waited on:
// the fetch is most of the bytes a miss allocates, and the garbage collector's
// work grows with them.
var fetchPool = sync.Pool{New: func() any { return new(fetch) }}

// wall is the process's clock: every cache reads it.
var wall wallclock.Clock

func wallNow() time.Time { return wall.Now() }
