package compactcache

import (
	"sync/atomic"
	"time"
)

// The cache's clock. Entries age in whole seconds, but time.Now reads two
// clocks (wall and monotonic), which on a virtual machine costs a share of
// a hit that shows in its figures. A coarseClock instead hands out the time that one goroutine stores
// every tick while the clock is read; the goroutine stops after idle
// without a read, so that an idle server does not wake for it, and the
// next read, which reads the time itself, starts it again. Its times carry
// no monotonic reading: ages and the refresh hold-offs (refresh.go) follow
// the wall clock, as entry ages always did. The front end reads no
// coarseClock: it reads time.Now itself, once a batch, where reading this
// one would keep the goroutine ticking while the front end alone answers.
type coarseClock struct {
	tick, idle time.Duration

	// now is the unix time in nanoseconds, at most a tick old, and 0 while
	// no goroutine keeps it: one word, so that a reader never sees the
	// clock running with a time from before it stopped.
	now  atomic.Int64
	read atomic.Bool // read since the last tick
}

func coarseNow() time.Time { return coarse.Now() }

// Now returns the time, at most a tick late.
func (c *coarseClock) Now() time.Time {
	if !c.read.Load() {
		// Written at most once a tick: a store on every read would move
		// the flag's cache line between the cores on every query.
		c.read.Store(true)
	}
	if ns := c.now.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	now := time.Now()
	if c.now.CompareAndSwap(0, now.UnixNano()) {
		go c.run()
	}
	return now
}

// run stores the time every tick until no read came for idle.
func (c *coarseClock) run() {
	t := time.NewTicker(c.tick)
	defer t.Stop()
	var idle time.Duration
	for range t.C {
		if c.read.Swap(false) {
			idle = 0
		} else if idle += c.tick; idle >= c.idle {
			c.now.Store(0)
			return
		}
		c.now.Store(time.Now().UnixNano())
	}
}
