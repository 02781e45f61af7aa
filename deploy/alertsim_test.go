package deploy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	_ "github.com/coredns/coredns/plugin/bind"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// The alert rules evaluated against the counters of a compactcache block
// that the test drives through a scenario, as Prometheus would evaluate
// them over a window that spans the scenario: rate(NAME[w]) is the
// increase of the block's series of NAME over the scenario (the window
// cancels out of the ratios the rules compare), sum and the other
// aggregations take the block's one group, and a comparison keeps its
// left side or nothing. The scenarios run in the test's process, through
// the plugin as CoreDNS builds it; their entries expire in real time.

// blockCounters reads the series of the families that carry server label
// server, summed by family.
func blockCounters(t testing.TB, server string) map[string]float64 {
	t.Helper()
	return seriesCounters(t, map[string]string{"server": server})
}

// seriesCounters reads the series that carry all of labels, summed by
// family.
func seriesCounters(t testing.TB, labels map[string]string) map[string]float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				out[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// promEval evaluates the small part of PromQL the rules use over one group.
type promEval struct {
	toks     []string
	pos      int
	increase map[string]float64 // by family, over the scenario
	gauge    map[string]float64 // by family, at its end
}

func tokenize(expr string) []string {
	var toks []string
	for i := 0; i < len(expr); {
		c := rune(expr[i])
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '{': // label matchers: the block's series are chosen already
			i += strings.IndexByte(expr[i:], '}') + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			toks = append(toks, expr[i:i+j+1])
			i += j + 1
		case unicode.IsLetter(c) || c == '_' || unicode.IsDigit(c) || c == '.':
			j := i
			for j < len(expr) && (unicode.IsLetter(rune(expr[j])) || unicode.IsDigit(rune(expr[j])) || strings.ContainsRune("_:.", rune(expr[j]))) {
				j++
			}
			toks = append(toks, expr[i:j])
			i = j
		default:
			toks = append(toks, string(c))
			i++
		}
	}
	return toks
}

func (e *promEval) peek() string {
	if e.pos < len(e.toks) {
		return e.toks[e.pos]
	}
	return ""
}

func (e *promEval) next() string { s := e.peek(); e.pos++; return s }

func (e *promEval) expect(s string) {
	if got := e.next(); got != s {
		panic(fmt.Sprintf("want %q at token %d, got %q", s, e.pos-1, got))
	}
}

// skipModifier skips an aggregation's or a binary operator's label list.
func (e *promEval) skipModifier() {
	for {
		switch e.peek() {
		case "by", "without", "on", "ignoring", "group_left", "group_right":
			e.next()
			if e.peek() == "(" {
				for e.next() != ")" {
				}
			}
		case "bool":
			e.next()
		default:
			return
		}
	}
}

// value is a result: a number, or no series.
type value struct {
	v  float64
	ok bool
}

func (e *promEval) and() value {
	l := e.cmp()
	for e.peek() == "and" || e.peek() == "unless" || e.peek() == "or" {
		op := e.next()
		e.skipModifier()
		r := e.cmp()
		switch op {
		case "and":
			l.ok = l.ok && r.ok
		case "unless":
			l.ok = l.ok && !r.ok
		case "or":
			if !l.ok {
				l = r
			}
		}
	}
	return l
}

func (e *promEval) cmp() value {
	l := e.add()
	for {
		op := e.peek()
		if op == ">" || op == "<" || op == "=" || op == "!" {
			e.next()
			if e.peek() == "=" {
				op += e.next()
			}
			e.skipModifier()
			r := e.add()
			keep := map[string]bool{">": l.v > r.v, "<": l.v < r.v, ">=": l.v >= r.v, "<=": l.v <= r.v, "==": l.v == r.v, "!=": l.v != r.v}[op]
			l = value{l.v, l.ok && r.ok && keep}
			continue
		}
		return l
	}
}

func (e *promEval) add() value {
	l := e.mul()
	for e.peek() == "+" || e.peek() == "-" {
		op := e.next()
		e.skipModifier()
		r := e.mul()
		if op == "+" {
			l = value{l.v + r.v, l.ok && r.ok}
		} else {
			l = value{l.v - r.v, l.ok && r.ok}
		}
	}
	return l
}

func (e *promEval) mul() value {
	l := e.unary()
	for e.peek() == "*" || e.peek() == "/" {
		op := e.next()
		e.skipModifier()
		r := e.unary()
		switch {
		case op == "*":
			l = value{l.v * r.v, l.ok && r.ok}
		case r.v == 0: // NaN or Inf: no comparison holds for NaN; treat both as no series
			l = value{0, false}
		default:
			l = value{l.v / r.v, l.ok && r.ok}
		}
	}
	return l
}

func (e *promEval) unary() value {
	switch tok := e.next(); tok {
	case "(":
		v := e.and()
		e.expect(")")
		return v
	case "sum", "max", "min", "avg":
		e.skipModifier()
		e.expect("(")
		v := e.and()
		e.expect(")")
		e.skipModifier()
		return v
	case "rate", "increase":
		e.expect("(")
		name := e.next()
		if !strings.HasPrefix(e.next(), "[") {
			panic("rate without a range")
		}
		e.expect(")")
		v, ok := e.increase[name]
		return value{v, ok}
	default:
		if n, err := strconv.ParseFloat(tok, 64); err == nil {
			return value{n, true}
		}
		v, ok := e.gauge[tok]
		return value{v, ok}
	}
}

// fires evaluates the alert named alert over the increase of the block's
// counters from before to after.
func fires(t testing.TB, alert string, before, after map[string]float64) (bool, float64) {
	t.Helper()
	var expr string
	for _, g := range readAlerts(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				expr = r.Expr
			}
		}
	}
	if expr == "" {
		t.Fatalf("%s has no alert %s", alertsFile, alert)
	}
	inc := map[string]float64{}
	for n, v := range after {
		inc[n] = v - before[n]
	}
	e := &promEval{toks: tokenize(expr), increase: inc, gauge: after}
	v := e.and()
	if e.pos != len(e.toks) {
		t.Fatalf("%s: evaluated %d of %d tokens of %q", alert, e.pos, len(e.toks), expr)
	}
	return v.ok, v.v
}

// staleBlock is a compactcache block with serve_stale before a next
// plugin that answers every A question with TTL 1, or fails while down
// is set.
type staleBlock struct {
	h      plugin.Handler
	ctx    context.Context
	server string
	down   atomic.Bool
	ttl    uint32 // of the answers: 1 unless set, while no request or refresh runs
}

func newStaleBlock(t testing.TB, corefile, server string) *staleBlock {
	t.Helper()
	ctrl := caddy.NewTestController("dns", corefile)
	ctrl.ServerBlockKeys = []string{".:53"}
	setup, err := caddy.DirectiveAction("dns", "compactcache")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(ctrl); err != nil {
		t.Fatal(err)
	}
	b := &staleBlock{server: server, ttl: 1}
	next := plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if b.down.Load() {
			return dns.RcodeServerFailure, errors.New("the upstream is down")
		}
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: b.ttl}, A: []byte{192, 0, 2, 1}}}
		w.WriteMsg(m)
		return dns.RcodeSuccess, nil
	})
	b.h = dnsserver.GetConfig(ctrl).Plugin[0](next)
	b.ctx = context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: server})
	return b
}

func (b *staleBlock) ask(t testing.TB, name string) {
	t.Helper()
	req := new(dns.Msg)
	req.SetQuestion(name, dns.TypeA)
	b.h.ServeDNS(b.ctx, &writer{}, req)
}

// settle waits until every refresh begun has counted (they count as they
// start, in goroutines of their own), up to want of them, for at most a
// few seconds.
func (b *staleBlock) settle(t testing.TB, want float64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if blockCounters(t, b.server)["coredns_cache_prefetch_total"] >= want {
			break
		}
	}
	time.Sleep(100 * time.Millisecond) // the refreshes store their answers
}

// TestServingStaleAlert: CompactcacheServingStale stays quiet while
// serve_stale (immediate, its default) answers expired entries once each
// and refreshes them, which is every name asked less often than its TTL in
// normal operation, and fires when the upstream fails and the stale
// answers go on without refreshes to end them.
func TestServingStaleAlert(t *testing.T) {
	const names = 100
	name := func(i int) string { return fmt.Sprintf("n%d.stale-alert.example.", i) }
	// Answers keep their TTL of 1 s (the stock MINTTL would raise it to 5 s).
	const staleCorefile = "compactcache {\n capacity 1MiB\n success 0 30 1\n serve_stale\n}"

	// Normal operation: each name asked, expired, asked again.
	ok := newStaleBlock(t, staleCorefile, "dns://stale-alert-healthy:53")
	before := blockCounters(t, ok.server)
	for i := range names {
		ok.ask(t, name(i))
	}
	time.Sleep(2500 * time.Millisecond) // the entries' TTL of 1 s runs out
	// The refreshes' answers last: a loaded machine may take longer than
	// a second to settle, and answers of 1 s would be stale again.
	ok.ttl = 30
	for i := range names {
		ok.ask(t, name(i))
	}
	ok.settle(t, names)
	for i := range names {
		ok.ask(t, name(i)) // refreshed: fresh hits
	}
	after := blockCounters(t, ok.server)
	t.Logf("healthy: requests %v, served stale %v, refreshes %v", after["coredns_cache_requests_total"]-before["coredns_cache_requests_total"],
		after["coredns_cache_served_stale_total"]-before["coredns_cache_served_stale_total"], after["coredns_cache_prefetch_total"]-before["coredns_cache_prefetch_total"])
	if after["coredns_cache_served_stale_total"]-before["coredns_cache_served_stale_total"] == 0 {
		t.Fatal("the healthy scenario served nothing stale: it checks nothing")
	}
	if f, v := fires(t, "CompactcacheServingStale", before, after); f {
		t.Errorf("CompactcacheServingStale fires (%.3f) on a healthy upstream, each expired entry answered stale once and refreshed", v)
	}

	// The upstream down: the expired entries asked again and again.
	down := newStaleBlock(t, staleCorefile, "dns://stale-alert-down:53")
	before = blockCounters(t, down.server)
	for i := range 10 {
		down.ask(t, "down-"+name(i))
	}
	time.Sleep(2500 * time.Millisecond)
	down.down.Store(true)
	for range 20 {
		for i := range 10 {
			down.ask(t, "down-"+name(i))
		}
	}
	down.settle(t, 10)
	after = blockCounters(t, down.server)
	t.Logf("down: requests %v, served stale %v, refreshes %v", after["coredns_cache_requests_total"]-before["coredns_cache_requests_total"],
		after["coredns_cache_served_stale_total"]-before["coredns_cache_served_stale_total"], after["coredns_cache_prefetch_total"]-before["coredns_cache_prefetch_total"])
	if f, v := fires(t, "CompactcacheServingStale", before, after); !f {
		t.Errorf("CompactcacheServingStale does not fire (%.3f) while the upstream is down and the entries are answered stale", v)
	}
}

// TestBudgetSaturatedAlert: CompactcacheBudgetSaturatedLowHitRatio stays
// quiet on a full store whose entries expire before it needs their room,
// which evicts them as it makes room (evictions_total counts them), and
// fires on one too small to keep its entries until they expire.
func TestBudgetSaturatedAlert(t *testing.T) {
	const names = 30000 // well over what 1MiB holds
	name := func(i int) string { return fmt.Sprintf("n%d.budget-alert.example.", i) }
	const corefile = "compactcache {\n capacity 1MiB\n success 0 300 1\n}"

	// Fits: the store filled, then names fewer than it holds asked while
	// those it holds have expired: only expired entries make room.
	fits := newStaleBlock(t, corefile, "dns://budget-alert-fits:53")
	for i := range names / 2 {
		fits.ask(t, name(i))
	}
	time.Sleep(2500 * time.Millisecond) // the entries' TTL of 1 s runs out
	before := blockCounters(t, fits.server)
	for i := names / 2; i < names/2+names/4; i++ {
		fits.ask(t, name(i))
	}
	after := blockCounters(t, fits.server)
	t.Logf("fits: bytes %v of %v, evictions %v, not admitted %v", after["coredns_compactcache_bytes"], after["coredns_compactcache_capacity_bytes"],
		after["coredns_cache_evictions_total"]-before["coredns_cache_evictions_total"], after["coredns_compactcache_not_admitted_total"]-before["coredns_compactcache_not_admitted_total"])
	if after["coredns_cache_evictions_total"] == before["coredns_cache_evictions_total"] {
		t.Fatal("the store that fits evicted nothing: it checks nothing")
	}
	if f, v := fires(t, "CompactcacheBudgetSaturatedLowHitRatio", before, after); f {
		t.Errorf("CompactcacheBudgetSaturatedLowHitRatio fires (%.3f) on a store that drops only expired entries", v)
	}

	// Too small: the names asked twice, each pushed out before its second ask.
	small := newStaleBlock(t, corefile, "dns://budget-alert-small:53")
	small.ttl = 300
	before = blockCounters(t, small.server)
	for range 2 {
		for i := range names {
			small.ask(t, name(i))
		}
	}
	after = blockCounters(t, small.server)
	t.Logf("too small: hits %v of %v requests, evictions %v, not admitted %v", after["coredns_cache_hits_total"]-before["coredns_cache_hits_total"], after["coredns_cache_requests_total"]-before["coredns_cache_requests_total"],
		after["coredns_cache_evictions_total"]-before["coredns_cache_evictions_total"], after["coredns_compactcache_not_admitted_total"]-before["coredns_compactcache_not_admitted_total"])
	if f, v := fires(t, "CompactcacheBudgetSaturatedLowHitRatio", before, after); !f {
		t.Errorf("CompactcacheBudgetSaturatedLowHitRatio does not fire (%.3f) on a store too small for the names asked", v)
	}
}

// TestSnapshotWriteAlert: CompactcacheSnapshotWriteFailing fires once a
// block could not write its snapshot file, here into a directory that does
// not exist, at the final shutdown.
func TestSnapshotWriteAlert(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "block.snap")
	labels := map[string]string{"path": path, "op": "write"}
	before := seriesCounters(t, labels)
	inst := startCorefile(t, ".:0 {\n bind 127.0.0.1\n compactcache {\n  snapshot "+path+"\n }\n}\n")
	if f, v := fires(t, "CompactcacheSnapshotWriteFailing", before, seriesCounters(t, labels)); f {
		t.Errorf("CompactcacheSnapshotWriteFailing fires (%.0f) before any write", v)
	}
	inst.ShutdownCallbacks() // SIGTERM's: the final shutdown writes the file
	if f, v := fires(t, "CompactcacheSnapshotWriteFailing", before, seriesCounters(t, labels)); !f {
		t.Errorf("CompactcacheSnapshotWriteFailing does not fire (%.0f) after a write failed", v)
	}
}

// startCorefile starts CoreDNS with corefile, stopped when the test ends.
func startCorefile(t testing.TB, corefile string) *caddy.Instance {
	t.Helper()
	// Placed as cmd/coredns places it (the root package's tests do the same):
	// a directive missing from the list is rejected when a Corefile is parsed.
	if !slices.Contains(dnsserver.Directives, "compactcache") {
		if err := dnsserver.SetDirectives(slices.Insert(slices.Clone(dnsserver.Directives), slices.Index(dnsserver.Directives, "cache"), "compactcache")); err != nil {
			t.Fatal(err)
		}
	}
	inst, err := caddy.Start(caddy.CaddyfileInput{ServerTypeName: "dns", Contents: []byte(corefile)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Stop() })
	return inst
}
