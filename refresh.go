package compactcache

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/miekg/dns"
)

// refreshes tracks the background fetches in flight, one per entry at most,
// and the entries whose refresh failed recently (serve_stale FAILURE_RECHECK).
type refreshes struct {
	mu       sync.Mutex
	inflight map[uint64]time.Time // key hash to the time before which no refresh starts; zero while one runs
	sweep    int                  // the size at which begin next drops the failure records that expired

	life   context.Context // canceled when the cache shuts down
	stop   context.CancelFunc
	wg     sync.WaitGroup // the refreshes begun and not ended
	closed bool           // shut down: no refresh begins
}

// sweepAt is the least size at which begin drops the failure records that
// expired; the next sweep waits for what is left to double, not to walk an
// outage's failures at every refresh, under the lock of every stale hit.
const sweepAt = 4096

func newRefreshes() refreshes {
	life, stop := context.WithCancel(context.Background())
	return refreshes{inflight: map[uint64]time.Time{}, life: life, stop: stop}
}

// begin reports whether a refresh of the entry with key hash h may start now,
// and marks it running; every refresh begun must end. None begins once the
// cache shuts down.
func (r *refreshes) begin(h uint64, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if until, ok := r.inflight[h]; ok && (until.IsZero() || now.Before(until)) {
		return false
	}
	if len(r.inflight) >= max(r.sweep, sweepAt) {
		for k, until := range r.inflight {
			if !until.IsZero() && !now.Before(until) {
				delete(r.inflight, k)
			}
		}
		r.sweep = 2 * len(r.inflight)
	}
	r.inflight[h] = time.Time{}
	r.wg.Add(1)
	return true
}

// end marks the refresh of h done; a failed one blocks the next for recheck.
func (r *refreshes) end(h uint64, now time.Time, recheck time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.wg.Done()
	if !ok && recheck > 0 {
		r.inflight[h] = now.Add(recheck)
		return
	}
	delete(r.inflight, h)
}

// cancel cancels the background fetches, and lets none begin after them.
func (r *refreshes) cancel() {
	r.mu.Lock()
	r.closed = true // no Add after this, so shutdown's Wait is well-defined
	r.mu.Unlock()
	r.stop()
}

// shutdown cancels the background fetches and waits for them, at most wait.
func (r *refreshes) shutdown(wait time.Duration) {
	r.cancel()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
	}
}

// refreshRequest returns a copy of r to refresh an entry with. An entry
// tailored to a subnet is asked for that subnet, not for the client's own
// (longer) prefix; an ECS option the cache added goes in explicitly, as the
// refresh has no client address to derive it from. An entry fetched without
// ECS (noECS), which a source /0 client takes, is asked without.
func refreshRequest(r *dns.Msg, ecs *subnet, scope uint8, noECS bool) *dns.Msg {
	req := r.Copy()
	if ecs.family == 0 || noECS {
		if o := req.IsEdns0(); o != nil && noECS {
			dnsmsg.SetSubnet(o, nil) // a source /0 client's option
		}
		return req
	}
	o := req.IsEdns0()
	if o == nil {
		req.SetEdns0(dns.MinMsgSize, false)
		o = req.IsEdns0()
	}
	dnsmsg.SetSubnet(o, ecs.option(cmp.Or(scope, ecs.sent)))
	return req
}

// refreshHit fetches the question of r, a hit on f's entry, again in the
// background, unless a fetch for the entry is in flight: prefetch for
// popular entries near expiry, and serve_stale's immediate mode for expired
// ones. The refresh keeps the entry's DNSSEC records if it holds them, and
// the new entry inherits its hits. r is copied only once a refresh begins,
// so that the hits while one is in flight allocate nothing.
func (c *Cache) refreshHit(ctx context.Context, r *dns.Msg, s *scratch, f *found, m *cachemetrics.Server) {
	if c.refreshes.begin(f.hash, c.now()) {
		c.refreshBegun(ctx, refreshRequest(r, &s.q.ecs, f.scope, f.noECS), f.hash, f.dnssec, f.popularity, m)
	}
}

// refreshBegun runs in the background the refresh begun of h.
func (c *Cache) refreshBegun(ctx context.Context, req *dns.Msg, h uint64, dnssec bool, popularity int, m *cachemetrics.Server) {
	c.detach(ctx, func(ctx context.Context) {
		m.Prefetch.Inc()
		ok := c.refresh(ctx, req, dnssec, popularity, m) != nil
		c.refreshes.end(h, c.now(), c.FailRecheck, ok)
	})
}

// detach runs f, the rest of a refresh begun, in a goroutine with a context
// that outlives the request but not the cache, and a metadata map of its own
// so that f does not write into the request's.
func (c *Cache) detach(ctx context.Context, f func(context.Context)) {
	ctx, cancel := context.WithCancel(metadata.ContextWithMetadata(context.WithoutCancel(ctx)))
	stop := context.AfterFunc(c.refreshes.life, cancel)
	go func() {
		defer stop()
		defer cancel()
		f(ctx)
	}()
}

// refresh fetches req's question with no client waiting and returns the
// fetch whose reply refreshed the entry, nil for none. The new entry inherits the old one's popularity,
// as the caller found it (an ECS variant's key is not the request's), and
// its DNSSEC records (dnssec): a refresh a client without DO set off must
// not take from DO clients the entry they use.
func (c *Cache) refresh(ctx context.Context, req *dns.Msg, dnssec bool, popularity int, m *cachemetrics.Server) *captureWriter {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	// None is added from NoClient's address: req has what was fetched with.
	ecs := c.ecs
	ecs.Add = false
	if !s.readMsg(req, coredns.NoClient, &ecs) {
		return nil
	}
	cw := c.newCapture(coredns.NoClient, req, s, m)
	cw.refresh, cw.popularity = true, popularity
	cw.dnssec = cw.dnssec || dnssec
	if cw.fetch(ctx); !cw.refreshed() {
		return nil
	}
	return cw
}

// verify is serve_stale's verify mode: the request that finds an expired
// entry asks the next plugin first and answers with what it brings when that
// refreshes the entry (done). Otherwise, or after VERIFY_TIMEOUT, the caller
// serves the stale entry; a timed-out fetch goes on in the background and
// refreshes the cache when it succeeds.
func (c *Cache) verify(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, s *scratch, f *found, m *cachemetrics.Server) (done bool, rcode int, err error) {
	h, dnssec, popularity, scope := f.hash, f.dnssec, f.popularity, f.scope // f changes once verify returns
	// One verify per entry at a time: the requests that find one in flight,
	// or a failure within FAILURE_RECHECK, get the stale entry at once. The
	// stock cache lets every request verify for itself unless a recheck or
	// a timeout is configured, a retry storm when the upstream is down.
	if !c.refreshes.begin(h, c.now()) {
		return false, 0, nil
	}
	if c.VerifyTimeout == 0 {
		// Ended even if the next plugin panics: the server recovers. A
		// client gone (DoH) is no failure of the upstream to hold back.
		ok := false
		defer func() { c.refreshes.end(h, c.now(), c.FailRecheck, ok || ctx.Err() != nil) }()
		// Fetched without ECS, so again: a /0 client's option is echoed still.
		req, ecs := r, s.q.ecs
		if f.noECS && ecs.family != 0 {
			req, s.q.ecs = refreshRequest(r, &ecs, 0, true), subnet{}
		}
		cw := c.newCapture(w, req, s, m)
		cw.refresh, cw.popularity = true, popularity
		cw.dnssec = cw.dnssec || dnssec
		rcode, err = cw.fetch(ctx)
		s.q.ecs = ecs
		if ok = cw.refreshed(); !ok {
			return false, 0, nil
		}
		rcode, err = c.answer(w, r, cw, rcode, err)
		return true, rcode, err
	}

	req := refreshRequest(r, &s.q.ecs, scope, f.noECS) // as refreshHit asks
	result := make(chan *captureWriter, 1)
	c.detach(ctx, func(ctx context.Context) {
		res := c.refresh(ctx, req, dnssec, popularity, m)
		c.refreshes.end(h, c.now(), c.FailRecheck, res != nil)
		result <- res
	})
	timer := time.NewTimer(c.VerifyTimeout)
	defer timer.Stop()
	select {
	case res := <-result:
		// The refreshed entry, else an unstored reply for the client's subnet.
		if res == nil {
			return false, 0, nil
		} else if f := c.lookup(s, time.Time{}, false); f.state == fresh {
			return true, dns.RcodeSuccess, c.write(w, f.reply)
		} else if cmp.Or(scope, s.q.ecs.sent) != s.q.ecs.sent {
			return false, 0, nil
		}
		if res.dropped {
			m = nil // counted in refused or drops, as on a miss (answer)
		}
		return true, dns.RcodeSuccess, c.passOn(w, r, res.reply, s, m)
	case <-timer.C:
		return false, 0, nil
	}
}
