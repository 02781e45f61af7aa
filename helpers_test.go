package compactcache

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// recorder captures what reaches the client, through WriteMsg or Write.
// plugin/test.ResponseWriter drops Write silently; a test that gets nothing
// must fail, so msg stays nil until something is written.
type recorder struct {
	test.ResponseWriter
	msg    *dns.Msg
	raw    bool // the reply came through Write
	writes int
}

func (r *recorder) WriteMsg(m *dns.Msg) error {
	// Pack and unpack as a server would, so that the test sees the wire.
	b, err := m.Pack()
	if err != nil {
		return err
	}
	r.writes++
	r.msg = new(dns.Msg)
	return r.msg.Unpack(b)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.writes++
	r.raw = true
	r.msg = new(dns.Msg)
	return len(b), r.msg.Unpack(b)
}

// upstream is a scripted next plugin that counts the queries it answers.
type upstream struct {
	mu      sync.Mutex
	answers map[string]func(r *dns.Msg) *dns.Msg // by "name/type", lowercased
	queries map[string]int
	last    *dns.Msg // the last request it saw
}

func newUpstream() *upstream {
	return &upstream{answers: map[string]func(*dns.Msg) *dns.Msg{}, queries: map[string]int{}}
}

func qkey(name string, qtype uint16) string {
	return strings.ToLower(dns.Fqdn(name)) + "/" + dns.TypeToString[qtype]
}

// add scripts the reply to name/qtype: rcode and sections; the question and
// ID are the request's.
func (u *upstream) add(name string, qtype uint16, rcode int, answer, ns, extra []dns.RR) {
	u.set(name, qtype, func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(r, rcode)
		m.Authoritative = true
		m.RecursionAvailable = true
		m.Answer, m.Ns, m.Extra = answer, ns, extra
		return m
	})
}

// set scripts the reply to name/qtype as f makes it.
func (u *upstream) set(name string, qtype uint16, f func(r *dns.Msg) *dns.Msg) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.answers[qkey(name, qtype)] = f
}

// upstreamOfA returns an upstream that answers a.ZONE A with 192.0.2.1.
func upstreamOfA(zone string) *upstream {
	u := newUpstream()
	u.add("a."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("a." + zone + " 300 IN A 192.0.2.1")}, nil, nil)
	return u
}

// hold scripts the answer to the A record a's name and type to wait:
// asked closes when the question first comes (forward asks again after
// its timeout), and closing release answers it with a.
func (u *upstream) hold(a string) (asked, release chan struct{}) {
	rr := test.A(a)
	asked, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	u.set(rr.Hdr.Name, dns.TypeA, func(r *dns.Msg) *dns.Msg {
		once.Do(func() { close(asked) })
		<-release
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{rr}
		return m
	})
	return asked, release
}

// script returns how name/qtype is answered.
func (u *upstream) script(name string, qtype uint16) func(r *dns.Msg) *dns.Msg {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.answers[qkey(name, qtype)]
}

func (u *upstream) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	k := qkey(r.Question[0].Name, r.Question[0].Qtype)
	u.mu.Lock()
	u.queries[k]++
	u.last = r.Copy()
	f := u.answers[k]
	u.mu.Unlock()
	if f == nil {
		return dns.RcodeServerFailure, fmt.Errorf("upstream: no answer for %s", k)
	}
	m := f(r)
	// Echo the request's OPT as a real server does.
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
	}
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func (u *upstream) Name() string { return "upstream" }

func (u *upstream) count(name string, qtype uint16) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.queries[qkey(name, qtype)]
}

// clock is a settable time source, read by background refreshes too.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_800_000_000, 0)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestCache(t testing.TB, u *upstream, clk *clock) *Cache {
	t.Helper()
	c := New()
	c.Next = u
	c.now = clk.now
	return c
}

// ask sends one query through c and returns what the client got.
func ask(t testing.TB, c *Cache, req *dns.Msg, tcp bool) *dns.Msg {
	t.Helper()
	rec := &recorder{ResponseWriter: test.ResponseWriter{TCP: tcp}}
	if _, err := c.ServeDNS(context.Background(), rec, req); err != nil {
		t.Fatalf("ServeDNS(%s): %v", req.Question[0].String(), err)
	}
	if rec.msg == nil {
		t.Fatalf("ServeDNS(%s) wrote nothing", req.Question[0].String())
	}
	if rec.writes != 1 {
		t.Fatalf("ServeDNS(%s) wrote %d replies", req.Question[0].String(), rec.writes)
	}
	return rec.msg
}

// sameReply reports how got differs from want in the sense of the tests: the
// same rcode and header bits, the same RRsets in each section compared
// without regard to case, OPT aside, and no TTL above want's.
func sameReply(got, want *dns.Msg) error {
	if got.Rcode != want.Rcode {
		return fmt.Errorf("rcode %s, want %s", dns.RcodeToString[got.Rcode], dns.RcodeToString[want.Rcode])
	}
	if got.Authoritative != want.Authoritative || got.RecursionAvailable != want.RecursionAvailable ||
		got.Truncated != want.Truncated || got.RecursionDesired != want.RecursionDesired {
		return fmt.Errorf("header %+v, want %+v", got.MsgHdr, want.MsgHdr)
	}
	for i, pair := range [3][2][]dns.RR{{got.Answer, want.Answer}, {got.Ns, want.Ns}, {got.Extra, want.Extra}} {
		g, w := normalize(pair[0]), normalize(pair[1])
		if strings.Join(g, "\n") != strings.Join(w, "\n") {
			return fmt.Errorf("section %d:\n%s\nwant\n%s", i, strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
		if err := ttlsAtMost(pair[0], pair[1]); err != nil {
			return err
		}
	}
	return nil
}

func normalize(rrs []dns.RR) []string {
	var out []string
	for _, r := range rrs {
		if r.Header().Rrtype == dns.TypeOPT {
			continue
		}
		r = dns.Copy(r)
		r.Header().Ttl = 0
		out = append(out, strings.ToLower(r.String()))
	}
	sort.Strings(out)
	return out
}

func ttlsAtMost(got, want []dns.RR) error {
	highest := map[string]uint32{}
	for _, r := range want {
		k := strings.ToLower(r.Header().Name) + dns.TypeToString[r.Header().Rrtype]
		highest[k] = max(highest[k], r.Header().Ttl)
	}
	for _, r := range got {
		if r.Header().Rrtype == dns.TypeOPT {
			continue
		}
		k := strings.ToLower(r.Header().Name) + dns.TypeToString[r.Header().Rrtype]
		if r.Header().Ttl > highest[k] {
			return fmt.Errorf("%s: TTL above the upstream's %d", r, highest[k])
		}
	}
	return nil
}

var mustRR = testenv.MustRR

// checkShards fails t unless the store's accounting holds (store.Check).
func checkShards(t *testing.T, s *store.Store) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// keyOf returns the cache key of q's question.
func keyOf(q *query) []byte { return entry.AppendKey(nil, q.name, q.qtype, q.qclass, q.cd) }

// seriesValue returns the value of the counter or gauge series of family
// with labels in the default registry, as the prometheus plugin gathers
// it, and 0 when there is none yet.
func seriesValue(t *testing.T, family string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// running reports whether a fetch is in flight.
func (r *refreshes) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, until := range r.inflight {
		if until.IsZero() {
			return true
		}
	}
	return false
}
