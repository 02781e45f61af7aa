package coarsetime

import (
	"sync"
	"testing"
	"time"
)

// TestCoarseClock reads a clock while it runs, never ahead of time.Now nor
// more than a few ticks behind, then leaves it idle: its goroutine stops,
// and the next read starts it again.
func TestCoarseClock(t *testing.T) {
	c := &Clock{Tick: 5 * time.Millisecond, Idle: 50 * time.Millisecond}
	// Slack for a ticker goroutine that a loaded machine runs late.
	const late = time.Second
	for range 40 {
		before := time.Now()
		got := c.Now()
		after := time.Now()
		if got.After(after) || before.Sub(got) > late {
			t.Fatalf("read %v between %v and %v: want at most %v late, never ahead", got, before, after, late)
		}
		time.Sleep(time.Millisecond)
	}
	if c.now.Load() == 0 {
		t.Fatal("the clock does not run while it is read")
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.now.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c.now.Load() != 0 {
		t.Fatalf("the clock still runs 5s after its last read (idle %v)", c.Idle)
	}
	before := time.Now()
	if got := c.Now(); got.Before(before.Truncate(time.Millisecond)) || c.now.Load() == 0 {
		t.Fatalf("a read after the clock stopped: %v, read at %v, running %v; want the time now, running again", got, before, c.now.Load() != 0)
	}
}

// TestCoarseClockStartsWithTheTime has several goroutines read fresh clocks
// at once: the ones that do not start it must not see it running with no
// time yet.
func TestCoarseClockStartsWithTheTime(t *testing.T) {
	start := time.Now().Add(-time.Second)
	for range 2000 {
		// Stopped a moment after the reads, so that no goroutine outlives the test.
		c := &Clock{Tick: time.Millisecond, Idle: time.Millisecond}
		var wg sync.WaitGroup
		got := make([]time.Time, 4)
		for g := range got {
			wg.Go(func() { got[g] = c.Now() })
		}
		wg.Wait()
		for _, at := range got {
			if at.Before(start) {
				t.Fatalf("a fresh clock read %v; want a time after %v", at, start)
			}
		}
	}
}
