package wallclock

import (
	"sync"
	"testing"
	"time"
)

// late bounds how late a read may be: by as long as the thread that last
// read the wall clock stalled between time.Now's two reads, wall then
// monotonic, which a loaded machine may make long.
const late = time.Second

// within reports whether got is a wall time read between before and after:
// never ahead, at most late behind.
func within(got, before, after time.Time) bool {
	return !got.After(after) && !got.Before(before.Add(-late))
}

// TestNow: a clock reads the wall time.
func TestNow(t *testing.T) {
	c := &Clock{Rebase: time.Millisecond}
	for range 1000 {
		before := time.Now().Round(0)
		got := c.Now()
		if after := time.Now().Round(0); !within(got, before, after) {
			t.Fatalf("read %v between %v and %v: want never ahead, at most %v late", got, before, after, late)
		}
	}
}

// TestNowFollowsAStep: a wall clock stepped since it was last read shows
// once Rebase has passed, and not at every read before that.
func TestNowFollowsAStep(t *testing.T) {
	c := &Clock{Rebase: 50 * time.Millisecond}
	c.Now()
	// As if the wall clock had been stepped an hour back since the read.
	c.offset.Add(int64(time.Hour))
	if got := time.Until(c.Now()); got < 59*time.Minute {
		t.Fatalf("a read within Rebase is %v ahead, want the hour the wall clock was read with", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Until(c.Now()) > time.Minute {
		if time.Now().After(deadline) {
			t.Fatalf("the wall clock not read again 10s after its last read (Rebase %v)", c.Rebase)
		}
		time.Sleep(c.Rebase / 5)
	}
}

// TestNowConcurrent has goroutines read one clock while it reads the wall
// clock again at nearly every read (-race checks the fields' access).
func TestNowConcurrent(t *testing.T) {
	c := &Clock{Rebase: time.Microsecond}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				before := time.Now().Round(0)
				got := c.Now()
				if after := time.Now().Round(0); !within(got, before, after) {
					t.Errorf("read %v between %v and %v: want never ahead, at most %v late", got, before, after, late)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestNowAllocatesNothing(t *testing.T) {
	var c Clock
	if n := testing.AllocsPerRun(1000, func() { c.Now() }); n != 0 {
		t.Errorf("Now allocates %v times a read, want 0", n)
	}
}

func BenchmarkNow(b *testing.B) {
	var c Clock
	for b.Loop() {
		c.Now()
	}
}
