package compactcache

import (
	"testing"
	"time"
)

// TestCoarseClock reads a clock while it runs, never ahead of time.Now nor
// more than a few ticks behind, then leaves it idle: its goroutine stops,
// and the next read starts it again.
func TestCoarseClock(t *testing.T) {
	c := &coarseClock{tick: 5 * time.Millisecond, idle: 50 * time.Millisecond}
	// Slack for a ticker goroutine that a loaded machine runs late.
	const late = 200 * time.Millisecond
	for range 40 {
		before := time.Now()
		got := c.Now()
		after := time.Now()
		if got.After(after) || before.Sub(got) > late {
			t.Fatalf("read %v between %v and %v: want at most %v late, never ahead", got, before, after, late)
		}
		time.Sleep(time.Millisecond)
	}
	if !c.running.Load() {
		t.Fatal("the clock does not run while it is read")
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.running.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c.running.Load() {
		t.Fatalf("the clock still runs 5s after its last read (idle %v)", c.idle)
	}
	stopped := time.Unix(0, c.now.Load())
	time.Sleep(20 * time.Millisecond)
	if got := c.Now(); !got.After(stopped) || !c.running.Load() {
		t.Fatalf("a read after the clock stopped: %v (it stopped at %v), running %v; want the time now, running again", got, stopped, c.running.Load())
	}
}
