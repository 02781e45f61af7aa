package flush

import (
	"sync"
	"sync/atomic"

	"github.com/compactcache/compactcache/internal/entry"
)

// Fence is the flushes begun on a store, for the fetches that began before
// them: a fetch takes the generation when it begins (Gen), and stores its
// answer only if no flush that began since covers it (Store). A reload
// hands the fence over with the store, so that the fetches of the old
// instance and the new one see the flushes of either.
type Fence struct {
	gen atomic.Uint64 // flushes begun

	// mu is held for writing by Begin, and for reading by Store from its
	// check to its put, so that a flush's removal sees every entry that a
	// put checked before the flush began.
	mu     sync.RWMutex
	recent []record // the last maxRecords, oldest first

	// Stored, when set (by tests, before the fence is used), runs after
	// each put Store lets through, once a flush may begin again.
	Stored func()
}

// record is one flush: its generation and the entries it drops.
type record struct {
	gen    uint64
	covers func(e entry.Entry) bool
}

// maxRecords bounds the flushes kept; a fetch older than all of them
// stores nothing. A fetch takes a round trip, but a peer's warm-up puts
// what it fetched for as long as its fill takes, seconds for a large store,
// while the Kubernetes source flushes up to ten times a second: a bound a
// fill outlives would leave the replica cold.
const maxRecords = 1024

// Gen returns the generation a fetch beginning now records.
func (fc *Fence) Gen() uint64 { return fc.gen.Load() }

// Begin records a flush of what covers picks, and bumps the generation:
// fetches begun before it store nothing it covers after it. The caller
// removes the entries after Begin returns.
func (fc *Fence) Begin(covers func(e entry.Entry) bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.recent) == maxRecords {
		fc.recent = append(fc.recent[:0], fc.recent[1:]...)
	}
	fc.recent = append(fc.recent, record{gen: fc.gen.Add(1), covers: covers})
}

// BeginFlush is Begin for f, made at now. A flush of expired entries is
// recorded too: no fetch brings an expired answer, but a snapshot's write
// may have copied the stale entries it drops.
func (fc *Fence) BeginFlush(f Flush, now int64) {
	fc.Begin(func(e entry.Entry) bool { return f.Covers(e, now) })
}

// since reports whether a flush that began after generation gen covers e;
// the caller holds fc.mu.
func (fc *Fence) since(gen uint64, e entry.Entry) bool {
	if fc.gen.Load() == gen {
		return false
	}
	if len(fc.recent) == 0 || fc.recent[0].gen > gen+1 {
		return true // older than the flushes kept: covered, for all we know
	}
	// The newest first, up to the first begun before gen: a fetch checks
	// the flushes begun since it began, not every one kept.
	for i := len(fc.recent) - 1; i >= 0 && fc.recent[i].gen > gen; i-- {
		if fc.recent[i].covers(e) {
			return true
		}
	}
	return false
}

// Covers reports whether a flush that began after generation gen covers
// e: a snapshot's write drops such entries of the chunks it copied before
// the flush began.
func (fc *Fence) Covers(gen uint64, e entry.Entry) bool {
	fc.mu.RLock()
	defer fc.mu.RUnlock()
	return fc.since(gen, e)
}

// Store calls put, which stores e, fetched by a fetch that began at
// generation gen, unless a flush that began since covers it: its answer
// may be one the flush removes. A flush that begins once e is checked
// waits for the put, and its removal finds e: e is never held, however
// briefly, after a flush that covers it began. It reports whether put ran.
func (fc *Fence) Store(gen uint64, e entry.Entry, put func()) bool {
	stored := func() bool {
		fc.mu.RLock()
		defer fc.mu.RUnlock()
		if fc.since(gen, e) {
			return false
		}
		put()
		return true
	}()
	if stored && fc.Stored != nil {
		fc.Stored()
	}
	return stored
}
