package tier

import (
	"sync"
	"time"
)

// breaker stops a block from asking a tier that fails: after
// breakerFailures errors or timeouts in a row it opens, and requests skip
// the tier for a back-off that doubles with every failed probe, up to
// breakerMaxBackoff; then one request probes it (half-open), and its
// success closes the breaker. A tier that is down, stopped or overloaded
// then costs a query nothing but a branch, and the block retries by itself.
type breaker struct {
	mu       sync.Mutex
	state    breakerState
	failures int           // in a row, while closed
	backoff  time.Duration // of the current or last opening
	until    time.Time     // open until
	changed  func(from, to breakerState, err error)
}

type breakerState int

const (
	closed breakerState = iota
	open
	halfOpen
)

func (s breakerState) String() string {
	return [...]string{closed: "closed", open: "open", halfOpen: "half-open"}[s]
}

const (
	breakerFailures   = 5
	breakerMinBackoff = time.Second
	breakerMaxBackoff = 30 * time.Second
)

// allow reports whether a request may ask the tier now. In the half-open
// state only the one probe may, until it reports.
func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case closed:
		return true
	case open:
		if now.Before(b.until) {
			return false
		}
		b.set(halfOpen, nil)
		return true
	}
	return false // half-open: the probe is out
}

// success reports a request that the tier answered.
func (b *breaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	if b.state != closed {
		b.backoff = 0
		b.set(closed, nil)
	}
}

// failure reports a request that erred or timed out.
func (b *breaker) failure(now time.Time, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case closed:
		if b.failures++; b.failures < breakerFailures {
			return
		}
		b.backoff = breakerMinBackoff
	case halfOpen:
		b.backoff = min(2*b.backoff, breakerMaxBackoff)
	case open:
		return // a request begun before it opened
	}
	b.failures = 0
	b.until = now.Add(b.backoff)
	b.set(open, err)
}

// late reports a request the tier answered later than a lookup waits (a
// write, which may wait longer): no failure, but no sign that lookups are
// answered in time either, so it keeps the count of failures in a row; a
// half-open breaker's probe that was late opens it again.
func (b *breaker) late(now time.Time, err error) {
	if b.current() == halfOpen {
		b.failure(now, err)
	}
}

// abandon reports a request that ended without the tier's answer (its
// client went away, or its own deadline passed before the tier had half
// its timeout: Get). A half-open breaker's probe is out again: the next
// request probes, rather than every one skipping the tier for good.
func (b *breaker) abandon() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == halfOpen {
		b.state = open // until has passed; no change worth a log line
	}
}

// set changes the state and says so; the caller holds b.mu.
func (b *breaker) set(to breakerState, err error) {
	from := b.state
	b.state = to
	if b.changed != nil && from != to {
		b.changed(from, to, err)
	}
}

// current returns the state.
func (b *breaker) current() breakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
