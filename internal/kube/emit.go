package kube

import (
	"sync"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/flush"
)

// interval is the shortest time between two flushes of names: a burst of
// changes within it is one flush, each name in it once. The first change
// after a quiet interval is flushed at once.
const interval = 100 * time.Millisecond

// walkGap is the shortest time between two flushes of subtrees, each a
// walk of the whole store (pods verified, zonal): however fast the
// cluster changes, they cost a bounded share of a core.
const walkGap = time.Second

// emitter applies the batches of one block's source to its cache: names
// at most every interval, subtrees at most every walkGap in a goroutine
// of their own, so that a walk does not hold back the names. With again
// set, each batch is flushed a second time that long after the
// first: for a cache in front of another that learns of the same change
// later (a node-local cache in front of the cluster DNS), whose answer
// may still be the old one when the first flush comes.
type emitter struct {
	apply func(flush.Flush) admin.Counts
	again time.Duration
	c     *counters

	mu      sync.Mutex
	pending *batch
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	walkMu   sync.Mutex
	walks    map[string]struct{} // subtrees waiting for the walker
	walkKick chan struct{}
	walkDone chan struct{}
}

func newEmitter(apply func(flush.Flush) admin.Counts, keep dnsmsg.ZoneSet, again time.Duration, c *counters) *emitter {
	e := &emitter{
		apply: apply, again: again, c: c,
		pending: newBatch(keep),
		kick:    make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		walks: map[string]struct{}{}, walkKick: make(chan struct{}, 1), walkDone: make(chan struct{}),
	}
	go e.run()
	go e.walker()
	return e
}

// update calls f with the pending batch, which it adds to, and has it
// flushed.
func (e *emitter) update(f func(b *batch)) {
	e.mu.Lock()
	f(e.pending)
	ready := !e.pending.empty()
	e.mu.Unlock()
	if ready {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

// close flushes what is pending and stops the emitter's goroutines.
func (e *emitter) close() {
	close(e.stop)
	<-e.done
	<-e.walkDone
}

func (e *emitter) run() {
	defer close(e.done)
	var last time.Time
	var again []later        // the names to flush a second time, oldest first
	var due <-chan time.Time // when the oldest is due
	for {
		var stopping bool
		select {
		case <-e.kick:
		case <-due:
			for len(again) > 0 && !time.Now().Before(again[0].at) {
				e.applyAgain(again[0].fs)
				again = again[1:]
			}
			due = nil
			if len(again) > 0 {
				due = time.After(time.Until(again[0].at))
			}
			continue
		case <-e.stop:
			stopping = true
		}
		if wait := interval - time.Since(last); wait > 0 && !stopping {
			select {
			case <-time.After(wait):
			case <-e.stop:
				stopping = true
			}
		}
		e.mu.Lock()
		changes := e.pending.changes
		e.pending.changes = [numKinds]int64{}
		fs := e.pending.take()
		e.mu.Unlock()
		last = time.Now()
		e.c.changed(changes)
		var names []flush.Flush
		for _, f := range fs {
			if f.Scope == flush.Names {
				names = append(names, f)
			} else {
				e.walk(f)
			}
		}
		e.applyNames(names)
		if e.again > 0 && len(fs) > 0 {
			// Each batch is flushed again again after its own first flush,
			// its subtrees too: the answers of the cache asked are no
			// fresher under them.
			again = append(again, later{time.Now().Add(e.again), fs})
			if due == nil {
				due = time.After(e.again)
			}
		}
		if stopping {
			close(e.walkKick)
			// A reload's new source learns of no change from before it
			// started: the second flushes still due are made all the same.
			if len(again) > 0 {
				go e.applyLater(again)
			}
			return
		}
	}
}

// later is a batch of names to flush a second time, at at.
type later struct {
	at time.Time
	fs []flush.Flush
}

// applyLater flushes each batch of again at its time.
func (e *emitter) applyLater(again []later) {
	for _, l := range again {
		time.Sleep(time.Until(l.at))
		e.applyNames(l.fs)
	}
}

// walk hands the subtrees of f to the walker.
func (e *emitter) walk(f flush.Flush) {
	e.walkMu.Lock()
	for _, n := range f.Names {
		e.walks[string(n)] = struct{}{}
	}
	e.walkMu.Unlock()
	select {
	case e.walkKick <- struct{}{}:
	default:
	}
}

// applyAgain flushes fs a second time: the names at once, the subtrees
// through the walker, which paces them as it paces the first.
func (e *emitter) applyAgain(fs []flush.Flush) {
	for _, f := range fs {
		if f.Scope == flush.Names {
			e.c.flushed(f, e.apply(f))
		} else {
			e.walk(f)
		}
	}
}

func (e *emitter) applyNames(fs []flush.Flush) {
	for _, f := range fs {
		e.c.flushed(f, e.apply(f))
	}
}

// walker applies the subtree flushes, one walk at a time and at most one
// each walkGap; subtrees added meanwhile go in the next walk.
func (e *emitter) walker() {
	defer close(e.walkDone)
	var last time.Time
	for range e.walkKick {
		if wait := walkGap - time.Since(last); wait > 0 {
			select {
			case <-time.After(wait):
			case <-e.stop:
			}
		}
		last = time.Now()
		e.walkMu.Lock()
		set := e.walks
		e.walks = map[string]struct{}{}
		e.walkMu.Unlock()
		if len(set) > 0 {
			e.applyNames(chunks(flush.Zones, set))
		}
	}
}
