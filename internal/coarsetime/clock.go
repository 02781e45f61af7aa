// Package coarsetime is the cache's clock. Entries age in whole seconds,
// but time.Now reads two clocks (wall and monotonic), which on a virtual
// machine costs a share of a hit that shows in its figures. A Clock instead
// hands out the time that one goroutine stores every Tick while the clock
// is read; the goroutine stops after Idle without a read, so that an idle
// server does not wake for it, and the next read, which reads the time
// itself, starts it again. Its times carry no monotonic reading: ages and
// the refresh hold-offs follow the wall clock, as entry ages always did.
// The front end reads no Clock: it reads time.Now itself, once a batch,
// where reading one would keep the goroutine ticking while the front end
// alone answers.
package coarsetime

import (
	"sync/atomic"
	"time"
)

type Clock struct {
	Tick, Idle time.Duration

	// now is the unix time in nanoseconds, at most a tick old, and 0 while
	// no goroutine keeps it: one word, so that a reader never sees the
	// clock running with a time from before it stopped.
	now  atomic.Int64
	read atomic.Bool // read since the last tick
}

// Now returns the time, at most a tick late.
func (c *Clock) Now() time.Time {
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
func (c *Clock) run() {
	t := time.NewTicker(c.Tick)
	defer t.Stop()
	var idle time.Duration
	for range t.C {
		if c.read.Swap(false) {
			idle = 0
		} else if idle += c.Tick; idle >= c.Idle {
			c.now.Store(0)
			return
		}
		c.now.Store(time.Now().UnixNano())
	}
}
