package compactcache

import (
	"sync/atomic"
	"time"
)

// The cache's clock. Entries age in whole seconds, but time.Now reads two
// clocks (wall and monotonic), 40-80 ns on this kind of virtual machine:
// about a twentieth of a hit at a million entries, and of a miss's own
// work. A coarseClock instead hands out the time that one goroutine stores
// every tick while the clock is read; the goroutine stops after idle
// without a read, so that an idle server does not wake for it, and the
// next read, which reads the time itself, starts it again.
type coarseClock struct {
	tick, idle time.Duration

	now     atomic.Int64 // unix nanoseconds, at most a tick old while running
	running atomic.Bool
	read    atomic.Bool // read since the last tick
}

// coarse is the process's clock: every cache reads it.
var coarse = coarseClock{tick: 10 * time.Millisecond, idle: time.Second}

func coarseNow() time.Time { return coarse.Now() }

// Now returns the time, at most a tick late.
func (c *coarseClock) Now() time.Time {
	if !c.read.Load() {
		// Written at most once a tick: a store on every read would move
		// the flag's cache line between the cores on every query.
		c.read.Store(true)
	}
	if c.running.Load() {
		return time.Unix(0, c.now.Load())
	}
	now := time.Now()
	if c.running.CompareAndSwap(false, true) {
		c.now.Store(now.UnixNano())
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
		c.now.Store(time.Now().UnixNano())
		if c.read.Swap(false) {
			idle = 0
			continue
		}
		if idle += c.tick; idle >= c.idle {
			c.running.Store(false)
			return
		}
	}
}
