// Package wallclock is the cache's clock: the wall time, read as the
// monotonic clock's distance from the wall time last read. time.Now reads
// both clocks, and on a virtual machine the wall clock's read is the dearer
// half of a hit's clock read. A goroutine that stores the time every few
// milliseconds, so that a read costs a load, wakes the server at every
// tick; at the rates a CoreDNS process serves, those wake-ups cost more than
// all the reads they save. The wall clock is read again every Rebase, so
// that a step of it (a clock set, a VM moved) shows within that: entries
// age, and the shared tier's epochs and snapshots' times compare, by the
// wall clock.
package wallclock

import (
	"sync/atomic"
	"time"
)

// start is the monotonic clock's origin.
var start = time.Now()

// A Clock is ready to use as its zero value, reading the wall clock every
// second.
type Clock struct {
	Rebase time.Duration // how often the wall clock is read; 0 is every second

	// offset is the wall time at start as last read, in unix nanoseconds;
	// read is when, in nanoseconds since start, 0 before the first.
	// Concurrent readers may store each their own: all are the wall
	// clock's, and any may be taken with any read.
	offset atomic.Int64
	read   atomic.Int64
}

// Now returns the wall time: never ahead of it, and late by as long as the
// goroutine that last read the wall clock stalled between time.Now's reads
// of the two clocks, wall first.
func (c *Clock) Now() time.Time {
	since := int64(time.Since(start))
	rebase := c.Rebase
	if rebase == 0 {
		rebase = time.Second
	}
	if read := c.read.Load(); read == 0 || since-read >= int64(rebase) {
		now := time.Now()
		c.offset.Store(now.UnixNano() - int64(now.Sub(start)))
		c.read.Store(max(since, 1))
	}
	return time.Unix(0, since+c.offset.Load())
}
