package tier

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const testSecret = "0123456789abcdef-shared-secret"

// secretFile writes s to a file and returns its path.
func secretFile(t testing.TB, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// parse parses the block of a `shared` option.
func parse(t testing.TB, option string) (*Config, error) {
	t.Helper()
	c := caddy.NewTestController("dns", option)
	c.Next() // the option's name
	return Parse(c, c.RemainingArgs())
}

// mustTier returns a tier of the Corefile option, closed when the test
// ends, that calls apply with the flushes of other replicas.
func mustTier(t testing.TB, option string, fp byte, apply func(flush.Flush)) *Tier {
	t.Helper()
	cfg, err := parse(t, option)
	if err != nil {
		t.Fatal(err)
	}
	if apply == nil {
		apply = func(flush.Flush) {}
	}
	if !strings.Contains(option, "timeout") {
		// A loaded machine (CI, -race) can take longer than a LAN's default
		// timeout: the tests of what the tier holds must not time out.
		cfg.timeout = time.Second
	}
	return startTier(t, cfg, Options{Fingerprint: [32]byte{fp}, Grace: 0, MaxTTL: 3600, Zones: ".", View: t.Name(), Apply: apply})
}

// startTier returns the tier of cfg and opt once it has connected, closed
// when the test ends.
func startTier(t testing.TB, cfg *Config, opt Options) *Tier {
	t.Helper()
	tr := New(cfg, opt)
	t.Cleanup(tr.Close)
	for deadline := time.Now().Add(10 * time.Second); tr.client.Load() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tier did not connect")
		}
	}
	return tr
}

// built returns an entry of name/qtype stored at stored for ttl.
func built(t testing.TB, name string, qtype uint16, rcode int, stored, ttl uint32) entry.Entry {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.Response, m.Rcode = true, rcode
	var flags uint16
	if rcode == dns.RcodeSuccess {
		m.Answer = []dns.RR{testenv.MustRR(t, dns.Fqdn(name)+" 300 IN A 192.0.2.1")}
	} else {
		flags = entry.FlagDenial
		m.Ns = []dns.RR{testenv.MustRR(t, "example.org. 300 IN SOA ns.example.org. h.example.org. 1 2 3 4 5")}
	}
	key, err := entry.KeyFor(name, qtype, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := entry.NewBuilder().Build(m, key, m.Question[0].Name, stored, ttl, 0, flags|uint16(rcode), entry.MaxLen)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(e)
}

func wire(t testing.TB, name string) []byte {
	t.Helper()
	var buf [dnsmsg.MaxNameLen]byte
	n, err := dnsmsg.PackName(dns.Fqdn(name), buf[:])
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(buf[:n])
}

func take(entry.Entry) bool { return true }

// get asks tr for e's key.
func get(tr *Tier, e entry.Entry) entry.Entry {
	return tr.Get(context.Background(), [][]byte{e.Key()}, e.QName(), time.Now().Unix(), take)
}

// putAndWait puts e and waits until tr reads it back.
func putAndWait(t testing.TB, tr *Tier, e entry.Entry) {
	t.Helper()
	// Put again now and then: on a loaded machine a write may time out,
	// or find the breaker open again, and is dropped, not retried; and a
	// full tier's other writes may evict its epochs (a miss then).
	next := time.Now()
	for deadline := time.Now().Add(10 * time.Second); get(tr, e) == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never written: %+v", e.QName(), tr.Stats())
		}
		if time.Now().After(next) {
			tr.Put(e)
			next = time.Now().Add(250 * time.Millisecond)
		}
	}
}

func TestParse(t *testing.T) {
	secret, short, pw := secretFile(t, testSecret), secretFile(t, "short"), secretFile(t, "pw")
	for _, tc := range []struct {
		option string
		ok     func(*Config) bool
		says   string
	}{
		{option: "shared redis://127.0.0.1:6379", ok: func(c *Config) bool {
			return c.addrs[0] == "127.0.0.1:6379" && !c.tls && c.timeout == DefaultTimeout && c.secret == nil
		}},
		{option: "shared rediss://cache@redis.example:6380/2 {\n secret_file " + secret + "\n password_file " + pw + "\n timeout 5ms\n write_queue 10\n}", ok: func(c *Config) bool {
			return c.tls && c.username == "cache" && c.db == 2 && string(c.secret) == testSecret && c.password == "pw" && c.timeout == 5*time.Millisecond && c.queue == 10
		}},
		{option: "shared redis://10.0.0.1:26379 redis://10.0.0.2:26379 {\n sentinel mymaster\n}", ok: func(c *Config) bool {
			return len(c.addrs) == 2 && c.sentinel == "mymaster"
		}},
		{option: "shared", says: "want a redis:// or rediss:// URL"},
		{option: "shared http://127.0.0.1:6379", says: "is not a URL such as"},
		{option: "shared redis://127.0.0.1", says: "want HOST:PORT"},
		{option: "shared redis://127.0.0.1:0", says: "not a number between 1 and 65535"},
		{option: "shared redis://u:pw@127.0.0.1:6379", says: "holds a password: give it in password_file"},
		{option: "shared redis://127.0.0.1:6379/x", says: `database "x" is not a number`},
		{option: "shared redis://127.0.0.1:1 rediss://127.0.0.1:2", says: "every URL must have the scheme"},
		{option: "shared redis://127.0.0.1:1 {\n secret_file " + short + "\n}", says: "holds 5 bytes, want at least 16"},
		{option: "shared redis://127.0.0.1:1 {\n secret_file /nonexistent\n}", says: "secret_file: open /nonexistent"},
		{option: "shared redis://127.0.0.1:1 {\n timeout 0s\n}", says: "timeout \"0s\" is not a duration"},
		{option: "shared redis://127.0.0.1:1 {\n write_queue 0\n}", says: "write_queue \"0\" is not a number"},
		{option: "shared redis://127.0.0.1:1 {\n tls_ca " + secret + "\n}", says: "tls_ca or tls_server_name without a rediss:// URL"},
		{option: "shared redis://127.0.0.1:1 {\n tls_server_name redis.example\n}", says: "tls_ca or tls_server_name without a rediss:// URL"},
		{option: "shared redis://127.0.0.1:1 {\n timeout 5ms\n timeout 50ms\n}", says: "timeout given twice"},
		{option: "shared redis://127.0.0.1:1 {\n secret_file " + secret + "\n secret_file " + secret + "\n}", says: "secret_file given twice"},
		{option: "shared redis://127.0.0.1:1 {\n timeout 11s\n}", says: "timeout \"11s\" is not a duration"},
		{option: "shared redis://127.0.0.1:1 {\n timeout 5\n}", says: "timeout \"5\" is not a duration"},
		{option: "shared redis://127.0.0.1:1 {\n password_file /nonexistent\n}", says: "password_file: open /nonexistent"},
		{option: "shared redis://127.0.0.1:1/-1", says: `database "-1" is not a number`},
		{option: "shared redis://127.0.0.1:1?db=2", says: "is not a URL such as"},
		{option: "shared redis://127.0.0.1:1 redis://other@127.0.0.1:2", says: "every URL must have the scheme"},
		{option: "shared rediss://127.0.0.1:1 {\n tls_ca " + secret + "\n}", says: "holds no PEM certificate"},
		{option: "shared redis://127.0.0.1:1 {\n sentinel\n}", says: "sentinel wants one value"},
		{option: "shared redis://127.0.0.1:1 {\n cluster yes\n}", says: `unknown option "cluster"`},
	} {
		cfg, err := parse(t, tc.option)
		switch {
		case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%q: %v, want an error saying %q", tc.option, err, tc.says)
		case tc.says == "" && err != nil:
			t.Errorf("%q: %v", tc.option, err)
		case tc.says == "" && !tc.ok(cfg):
			t.Errorf("%q: %+v", tc.option, cfg)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	a, b := mustTier(t, option, 1, nil), mustTier(t, option, 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, a, e)
	got := get(b, e)
	if got == nil || string(got) != string(e) {
		t.Fatalf("the other replica read %x, want %x", got, e)
	}
	// A block of other settings shares nothing.
	if other := mustTier(t, option, 2, nil); get(other, e) != nil {
		t.Error("a block of another fingerprint read the entry")
	}
	// accept decides: a value the block cannot take is a miss.
	if tr := b.Get(context.Background(), [][]byte{e.Key()}, e.QName(), time.Now().Unix(), func(entry.Entry) bool { return false }); tr != nil {
		t.Error("an entry accept refused was returned")
	}
	// The first key that holds a value wins, in the order given.
	absent := built(t, "absent.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	if got := b.Get(context.Background(), [][]byte{absent.Key(), e.Key()}, e.QName(), time.Now().Unix(), take); got == nil {
		t.Error("the second key's entry was not found")
	}
	// The key expires with the entry: Redis holds it no longer than its TTL.
	pttl, err := r.Do("PTTL", a.keys.key(e.Key()))
	if err != nil || pttl == ":-1" || pttl == ":-2" {
		t.Errorf("PTTL of the entry's key: %q %v, want its TTL", pttl, err)
	}
}

// TestExpiredNotFresh: an entry whose TTL ran out while in the tier is not
// served, but within the serve_stale window it is, for the block to serve
// as stale.
func TestExpiredNotFresh(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr
	tr := mustTier(t, option, 1, nil)
	now := time.Now().Unix()
	e := built(t, "old.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now-100), 300)
	putAndWait(t, tr, e)
	if tr.Get(context.Background(), [][]byte{e.Key()}, e.QName(), now+201, take) != nil {
		t.Error("an entry past its TTL was returned without a serve_stale window")
	}
	tr.opt.Grace = 60
	if tr.Get(context.Background(), [][]byte{e.Key()}, e.QName(), now+201, take) == nil {
		t.Error("an entry within the serve_stale window was not returned")
	}
}

// TestStoredAheadOfClock: an entry written by a replica whose clock is
// ahead of this one's is read as stored no later than now, as a snapshot's
// is: its own time would have the block serve it unaged, past its TTL by
// the difference.
func TestStoredAheadOfClock(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	now := time.Now().Unix()
	e := built(t, "ahead.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now+3600), 300)
	putAndWait(t, tr, e)
	got := tr.Get(context.Background(), [][]byte{e.Key()}, e.QName(), now, take)
	if got == nil {
		t.Fatal("the entry was not read")
	}
	if got.Expires() > now+300 {
		t.Errorf("read as expiring at %d, %d s past its TTL of 300 s from now", got.Expires(), got.Expires()-now-300)
	}
}

// TestRefusesForgedValues: values the tier holds that a block of these
// settings and secret did not write are refused, counted, and ignored.
func TestRefusesForgedValues(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	tr := mustTier(t, option, 1, nil)
	other := mustTier(t, "shared redis://"+r.Addr+" {\n secret_file "+secretFile(t, testSecret+"-other")+"\n}", 1, nil)
	now := uint32(time.Now().Unix())
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, now, 300)
	f := built(t, "forged.example.org", dns.TypeA, dns.RcodeSuccess, now, 300)
	putAndWait(t, tr, e) // and its name's epochs with it
	key := tr.keys.key(e.Key())
	sealed := tr.keys.seal(key, e)
	for _, tc := range []struct {
		name  string
		value []byte
		why   error
	}{
		{"garbage", []byte("garbage"), errShort},
		{"garbage after a tag", append(make([]byte, tagLen), "not an entry at all"...), errTag},
		{"a bad tag", append([]byte{sealed[0] ^ 1}, sealed[1:]...), errTag},
		{"a changed record", func() []byte { v := slices.Clone(sealed); v[len(v)-1] ^= 1; return v }(), errTag},
		{"another entry moved here", tr.keys.seal(tr.keys.key(f.Key()), f), errTag},
		{"sealed by another secret", other.keys.seal(key, e), errTag},
		{"copied from a block of other settings", func() []byte {
			k := newKeyer([]byte(testSecret), [32]byte{2})
			return k.seal(k.key(e.Key()), e)
		}(), errTag},
		{"sealed for this key, of another name", tr.keys.seal(key, f), errKey},
		{"a malformed entry sealed", tr.keys.seal(key, e[:len(e)-3]), errFormat},
	} {
		r.MustDo("SET", key, string(tc.value))
		before := tr.m.rejected[tc.why].n.Load()
		if got := get(tr, e); got != nil {
			t.Errorf("%s: returned %x", tc.name, got)
		}
		if n := tr.m.rejected[tc.why].n.Load() - before; n != 1 {
			t.Errorf("%s: counted %d refusals for %v, want 1", tc.name, n, tc.why)
		}
	}
	r.MustDo("SET", key, string(sealed))
	if get(tr, e) == nil {
		t.Error("the value sealed for its key was refused")
	}
}

// TestFlushes: a flush makes the values it covers misses on every replica,
// and reaches the other replicas' stores within a second; a replica does
// not apply its own.
func TestFlushes(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	var mu sync.Mutex
	var applied []string
	a := mustTier(t, option, 1, func(f flush.Flush) { t.Errorf("a replica applied its own flush %s", f.String()) })
	b := mustTier(t, option, 1, func(f flush.Flush) { mu.Lock(); applied = append(applied, f.String()); mu.Unlock() })
	stored := uint32(time.Now().Unix()) - 1
	www := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, stored, 300)
	mail := built(t, "mail.example.org", dns.TypeA, dns.RcodeSuccess, stored, 300)
	nx := built(t, "nx.example.net", dns.TypeA, dns.RcodeNameError, stored, 300)
	for _, e := range []entry.Entry{www, mail, nx} {
		putAndWait(t, a, e)
	}
	steps := []struct {
		f    flush.Flush
		gone []entry.Entry
		kept []entry.Entry
	}{
		{flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, "www.example.org")}}, []entry.Entry{www}, []entry.Entry{mail, nx}},
		{flush.Flush{Scope: flush.Negative}, []entry.Entry{www, nx}, []entry.Entry{mail}},
		{flush.Flush{Scope: flush.Zones, Names: [][]byte{wire(t, "org")}}, []entry.Entry{www, mail, nx}, nil},
	}
	for i, s := range steps {
		start := time.Now()
		if err := a.Flush(s.f, time.Now().Unix()); err != nil {
			t.Fatal(err)
		}
		for _, e := range s.gone {
			if get(a, e) != nil || get(b, e) != nil {
				t.Errorf("after %s: %s still read", s.f.String(), e.QName())
			}
		}
		for _, e := range s.kept {
			if get(b, e) == nil {
				t.Errorf("after %s: %s not read", s.f.String(), e.QName())
			}
		}
		for {
			mu.Lock()
			n := len(applied)
			mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("the other replica applied %d flushes a second after the %dth: %v", n, i+1, applied)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// An entry stored after the flush is read again.
	fresh := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())+1, 300)
	putAndWait(t, a, fresh)
	if st := b.Stats(); st.FlushesReceived != 3 || a.Stats().FlushesSent != 3 {
		t.Errorf("stats: received %d, sent %d", st.FlushesReceived, a.Stats().FlushesSent)
	}
}

// under runs load, Gets of one absent key from 4 goroutines, until stop is
// closed, and returns the lookups' latencies.
func under(tr *Tier, e entry.Entry, stop chan struct{}) func() *latencies {
	var l latencies
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				get(tr, e)
				l.add(time.Since(start))
			}
		})
	}
	return func() *latencies { close(stop); wg.Wait(); return &l }
}

// latencies counts durations in buckets of latencyStep: a load's lookups,
// which the skipping breaker makes millions, in memory that does not grow
// with them (the heap is measured under load).
type latencies struct {
	mu      sync.Mutex
	buckets [2000]int64 // the last one holds the longer ones too
	n       int64
}

const latencyStep = 10 * time.Microsecond

func (l *latencies) add(d time.Duration) {
	i := min(int(d/latencyStep), len(l.buckets)-1)
	l.mu.Lock()
	l.buckets[i]++
	l.n++
	l.mu.Unlock()
}

// p99 returns the upper bound of the bucket of the 99th percentile.
func (l *latencies) p99() time.Duration {
	rank := l.n * 99 / 100
	for i, c := range l.buckets {
		if rank -= c; rank < 0 {
			return time.Duration(i+1) * latencyStep
		}
	}
	return time.Duration(len(l.buckets)) * latencyStep
}

// TestTierFaults: the tier killed, stopped and restarted empty under load:
// lookups never wait past the timeout (p99 at most the timeout and a
// millisecond), the breaker opens and closes again by itself, and writes
// resume.
func TestTierFaults(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr+" {\n timeout 20ms\n}", 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)
	goroutines, heap := runtime.NumGoroutine(), heapLive()

	for _, fault := range []struct {
		name        string
		inject, end func()
	}{
		{"SIGSTOP", r.Pause, r.Resume},
		{"killed, restarted empty", r.Kill, r.Start},
	} {
		done := under(tr, e, make(chan struct{}))
		time.Sleep(100 * time.Millisecond)
		fault.inject()
		for range 200000 {
			tr.Put(e) // writes while it is down: dropped, not queued without bound
		}
		// What the tier may hold for them is its write queue, a fraction
		// of what they would take queued whole.
		if h := heapLive(); h > heap+uint64(200000*len(e))/4 {
			t.Errorf("%s: heap of %d kB live with the tier down, %d kB before", fault.name, h>>10, heap>>10)
		}
		time.Sleep(1500 * time.Millisecond)
		if st := tr.br.current(); st == closed {
			t.Errorf("%s: the breaker is closed 1.5s in", fault.name)
		}
		took := done()
		if p := took.p99(); p > tr.cfg.timeout+time.Millisecond {
			t.Errorf("%s: p99 of %d lookups %v, over the timeout %v and a millisecond", fault.name, took.n, p, tr.cfg.timeout)
		}
		fault.end()
		for deadline := time.Now().Add(2*breakerMaxBackoff + 10*time.Second); tr.br.current() != closed; {
			get(tr, e)
			if time.Now().After(deadline) {
				t.Fatalf("%s: the breaker did not close after the tier came back: %+v", fault.name, tr.Stats())
			}
			time.Sleep(50 * time.Millisecond)
		}
		putAndWait(t, tr, e) // writes resume, and after a restart fill the empty tier
	}
	st := tr.Stats()
	if st.Timeouts == 0 || st.Skipped == 0 || st.WritesDropped == 0 {
		t.Errorf("stats after the faults: %+v, want timeouts, skipped lookups and dropped writes", st)
	}
	if n := runtime.NumGoroutine(); n > goroutines+20 {
		t.Errorf("%d goroutines after the faults, %d before", n, goroutines)
	}
}

// TestCanceledNotFailure: lookups whose requests were canceled are no
// failures of the tier: they open no breaker.
func TestCanceledNotFailure(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 2 * breakerFailures {
		if tr.Get(ctx, [][]byte{e.Key()}, e.QName(), time.Now().Unix(), take) != nil {
			t.Fatal("a canceled lookup answered")
		}
	}
	if st := tr.Stats(); tr.br.current() != closed || st.Errors != 0 || st.Skipped != 2*breakerFailures || get(tr, e) == nil {
		t.Errorf("after canceled lookups: breaker %v, %+v", tr.br.current(), st)
	}
}

// TestShortDeadlineNotFailure: lookups whose requests' own deadlines end
// before half the tier's timeout, against a tier slower than those
// deadlines but within its timeout, are no timeouts of the tier: they open
// no breaker.
func TestShortDeadlineNotFailure(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+slowProxy(t, r.Addr, 100*time.Millisecond)+" {\n timeout 2s\n}", 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)
	for range 2 * breakerFailures {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		got := tr.Get(ctx, [][]byte{e.Key()}, e.QName(), time.Now().Unix(), take)
		cancel()
		if got != nil {
			t.Fatal("a lookup answered after its request's deadline")
		}
	}
	if st := tr.Stats(); tr.br.current() != closed || st.Timeouts != 0 || st.Errors != 0 || st.Skipped != 2*breakerFailures || get(tr, e) == nil {
		t.Errorf("after lookups past their requests' deadlines: breaker %v, %+v", tr.br.current(), st)
	}
}

// TestSlowerThanDeadlinesOpensBreaker: lookups whose requests' own
// deadlines end before the tier's timeout but leave it at least half of
// it, against a tier that answers none of them in that time, are timeouts
// of the tier: they open the breaker, rather than every request asking a
// tier that never answers in time.
func TestSlowerThanDeadlinesOpensBreaker(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+slowProxy(t, r.Addr, 500*time.Millisecond)+" {\n timeout 100ms\n}", 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	for range 4 * breakerFailures {
		if tr.br.current() != closed {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 80*time.Millisecond)
		got := tr.Get(ctx, [][]byte{e.Key()}, e.QName(), time.Now().Unix(), take)
		cancel()
		if got != nil {
			t.Fatal("a lookup answered after its request's deadline")
		}
	}
	if st := tr.Stats(); tr.br.current() == closed || st.Timeouts+st.Errors < breakerFailures {
		t.Errorf("after lookups that used most of the timeout and were not answered: breaker %v, %+v", tr.br.current(), st)
	}
}

// heapLive returns the bytes of the heap's live objects after a
// collection: the spans in use would count the few objects left in each
// span of the dropped writes, a fragmentation the collector reuses.
func heapLive() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestTierFull: a tier at its maxmemory, evicting, takes writes and
// answers lookups; what it evicted is a miss.
func TestTierFull(t *testing.T) {
	r := testenv.StartRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	now := uint32(time.Now().Unix())
	var es []entry.Entry
	for i := range 20000 {
		e := built(t, "n"+strings.Repeat("x", i%40)+time.Duration(i).String()+".example.org", dns.TypeA, dns.RcodeSuccess, now, 300)
		es = append(es, e)
		tr.Put(e)
		if i%1000 == 999 {
			time.Sleep(20 * time.Millisecond) // the writer drains the queue
		}
	}
	putAndWait(t, tr, built(t, "last.example.org", dns.TypeA, dns.RcodeSuccess, now, 300)) // a full tier still takes writes
	found := 0
	for _, e := range es {
		if get(tr, e) != nil {
			found++
		}
	}
	if st := tr.Stats(); found == 0 || found == len(es) || st.Errors != 0 {
		t.Errorf("%d of %d entries read back from a full tier, stats %+v: want some evicted, none erring", found, len(es), st)
	}
}

// TestACLUser: an ACL user with its password from password_file; a wrong
// password leaves the block without the tier, asking nothing.
func TestACLUser(t *testing.T) {
	r := testenv.StartRedis(t, "--user", "default", "off", "--user", "cache", "on", ">s3cret-pw", "~*", "&*", "+@all")
	tr := mustTier(t, "shared redis://cache@"+r.Addr+" {\n password_file "+secretFile(t, "s3cret-pw")+"\n}", 1, nil)
	putAndWait(t, tr, built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300))

	cfg, err := parse(t, "shared redis://cache@"+r.Addr+" {\n password_file "+secretFile(t, "wrong")+"\n}")
	if err != nil {
		t.Fatal(err)
	}
	wrong := New(cfg, Options{MaxTTL: 3600, Zones: ".", View: "wrong", Apply: func(flush.Flush) {}})
	defer wrong.Close()
	time.Sleep(300 * time.Millisecond)
	if wrong.client.Load() != nil {
		t.Fatal("connected with a wrong password")
	}
	if get(wrong, built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)) != nil || wrong.Stats().Skipped != 1 {
		t.Errorf("a tier that could not connect: %+v, want the lookup skipped", wrong.Stats())
	}
}

// writeCerts makes a CA and a certificate it signs for 127.0.0.1 and the
// name server.test, and returns the files: CA, certificate, key.
func writeCerts(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "server.test"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"server.test"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, block := range map[string]*pem.Block{ca: {Type: "CERTIFICATE", Bytes: caDER}, cert: {Type: "CERTIFICATE", Bytes: srvDER}, key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

// TestTLS: rediss:// with the server's CA from tls_ca; a tier that does
// not trust the server's certificate does not connect.
func TestTLS(t *testing.T) {
	ca, cert, key := writeCerts(t)
	port := strconv.Itoa(testenv.FreePort(t))
	testenv.StartRedis(t, "--tls-port", port, "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no")
	tr := mustTier(t, "shared rediss://127.0.0.1:"+port+" {\n tls_ca "+ca+"\n tls_server_name server.test\n}", 1, nil)
	putAndWait(t, tr, built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300))

	cfg, err := parse(t, "shared rediss://127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	untrusted := New(cfg, Options{MaxTTL: 3600, Zones: ".", View: "untrusted", Apply: func(flush.Flush) {}})
	defer untrusted.Close()
	time.Sleep(300 * time.Millisecond)
	if untrusted.client.Load() != nil {
		t.Error("connected to a server whose certificate no root it trusts signed")
	}
}

// TestCluster: a Redis Cluster of three masters, found from one seed: the
// entries of a question's variants share a slot, and flushes reach the
// other replicas.
func TestCluster(t *testing.T) {
	nodes := startCluster(t)
	option := "shared redis://" + nodes[0].Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	var got sync.WaitGroup
	got.Add(1)
	var once sync.Once
	a := mustTier(t, option, 1, nil)
	b := mustTier(t, option, 1, func(flush.Flush) { once.Do(got.Done) })
	var es []entry.Entry
	for i := range 50 {
		e := built(t, "n"+strconv.Itoa(i)+".example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())-1, 300)
		es = append(es, e)
		putAndWait(t, a, e)
	}
	// The keys spread over the masters.
	held := 0
	for _, n := range nodes {
		if v, _ := n.Do("DBSIZE"); v != ":0" {
			held++
		}
	}
	if held < 2 {
		t.Errorf("the entries are on %d of 3 masters", held)
	}
	if err := a.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{wire(t, "example.org")}}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { got.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("the other replica did not get the flush within a second")
	}
	for _, e := range es {
		if get(b, e) != nil {
			t.Fatalf("%s read after the flush of its zone", e.QName())
		}
	}
}

// TestClusterEpochsBeforeFlush: of a Cluster, where a flush's epochs and
// its stream entry live on different nodes, a replica reads the flush only
// once its epochs are written: told of it before, it could read from the
// tier again a value the flush covers, which no epoch holds back yet.
func TestClusterEpochsBeforeFlush(t *testing.T) {
	nodes := startCluster(t)
	option := "shared redis://" + nodes[0].Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	owner := func(key string) *testenv.Redis {
		for _, n := range nodes {
			if _, err := n.Do("EXISTS", key); err == nil {
				return n
			}
		}
		t.Fatalf("no node serves %q", key)
		return nil
	}
	a := mustTier(t, option, 1, nil)
	// A zone whose epoch is not on the stream's node.
	streamNode := owner(a.keys.streamKey())
	var zone []byte
	var epochKey string
	var epochNode *testenv.Redis
	for i := 0; epochNode == nil || epochNode == streamNode; i++ {
		zone = wire(t, "z"+strconv.Itoa(i)+".example.org")
		epochKey = a.keys.epochKey(epochZone, zone)
		epochNode = owner(epochKey)
	}
	epochWritten := make(chan bool, 1)
	mustTier(t, option, 1, func(flush.Flush) {
		v, err := epochNode.Do("EXISTS", epochKey)
		select {
		case epochWritten <- err == nil && v == ":1":
		default:
		}
	})
	// The epoch's node holds its writes back a while, as a busy or distant
	// node would.
	if _, err := epochNode.Do("CLIENT", "PAUSE", "300", "WRITE"); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{zone}}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	select {
	case written := <-epochWritten:
		if !written {
			t.Error("the other replica read the flush before its epoch was written")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the other replica did not get the flush")
	}
}

// startCluster returns a Redis Cluster of three masters once it is up,
// node i started with args[i] too.
func startCluster(t *testing.T, args ...[]string) []*testenv.Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatal("redis-cli is not installed: apt-get install redis-tools (redis-server's dependency)")
	}
	var nodes []*testenv.Redis
	var addrs []string
	for i := range 3 {
		a := []string{"--cluster-enabled", "yes", "--cluster-node-timeout", "2000"}
		if i < len(args) {
			a = append(a, args[i]...)
		}
		n := testenv.StartRedis(t, a...)
		nodes, addrs = append(nodes, n), append(addrs, n.Addr)
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ok := true
		for _, n := range nodes {
			info, _ := n.Do("CLUSTER", "INFO")
			ok = ok && strings.Contains(info, "cluster_state:ok")
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cluster did not come up")
		}
	}
	return nodes
}

// TestSentinel: the tier found through Sentinel, by the master set's name.
func TestSentinel(t *testing.T) {
	master := testenv.StartRedis(t)
	host, port, _ := net.SplitHostPort(master.Addr)
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	sport := strconv.Itoa(testenv.FreePort(t))
	if err := os.WriteFile(conf, []byte("port "+sport+"\nbind 127.0.0.1\nsentinel monitor cache "+host+" "+port+" 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.RedisServer(), conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", "127.0.0.1:"+sport); err == nil {
			c.Close()
			break
		} else if time.Now().After(deadline) {
			t.Fatal("sentinel did not start")
		}
	}
	tr := mustTier(t, "shared redis://127.0.0.1:"+sport+" {\n sentinel cache\n}", 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)
	if n := master.MustDo("EXISTS", tr.keys.key(e.Key())); n != ":1" {
		t.Errorf("the master holds the entry %s times, want once", n)
	}
}

// TestProbeNotLost: the writer taking the half-open breaker's probe for a
// batch it has nothing to send of does not leave the breaker half-open,
// skipping every lookup and write, for good.
func TestProbeNotLost(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)
	expired := built(t, "old.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())-1000, 300)

	tr.br.mu.Lock()
	tr.br.backoff, tr.br.until = breakerMinBackoff, time.Now().Add(-time.Millisecond)
	tr.br.set(open, errors.New("a test's"))
	tr.br.mu.Unlock()
	tr.write([]queued{{e: expired}})
	if get(tr, e) == nil {
		t.Errorf("a lookup after the writer's empty batch: %+v, breaker %v", tr.Stats(), tr.br.current())
	}
}

// TestQueuedBeforeFlush: an entry queued before a flush that covers it,
// made here or received from another replica, and written once the
// flush's epoch was evicted, is not written: its witness, a time before
// the entry's, would stand for the epoch and hide the flush.
func TestQueuedBeforeFlush(t *testing.T) {
	for _, received := range []bool{false, true} {
		t.Run(fmt.Sprintf("received=%v", received), func(t *testing.T) {
			r := testenv.StartRedis(t)
			option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
			got := make(chan flush.Flush, 1)
			a := mustTier(t, option, 1, nil)
			b := mustTier(t, option, 1, func(f flush.Flush) { got <- f })
			now := time.Now().Unix()
			e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now-1), 300)
			gen := b.fence.Gen() // e is queued
			f := flush.Flush{Scope: flush.Names, Names: [][]byte{e.QName()}}
			if !received {
				a = b
			}
			if err := a.Flush(f, now); err != nil {
				t.Fatal(err)
			}
			if received {
				select {
				case <-got:
				case <-time.After(5 * time.Second):
					t.Fatal("the flush never reached the other replica")
				}
			}
			r.MustDo("DEL", b.keys.epochKey(epochName, e.QName()))
			b.write([]queued{{e, gen}})
			if get(b, e) != nil {
				t.Error("an entry queued before a flush of its name is read after it")
			}
		})
	}
}

// TestValuesOfOtherTypes: keys of the tier that someone made a hash or a
// list are refused values, or flushes that cover the name, not errors of
// the tier: they open no breaker and serve nothing.
func TestValuesOfOtherTypes(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr+" {\n secret_file "+secretFile(t, testSecret)+"\n}", 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())-1, 300)
	mail := built(t, "mail.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())-1, 300)
	putAndWait(t, tr, e)
	putAndWait(t, tr, mail)
	key := tr.keys.key(e.Key())
	r.MustDo("DEL", key)
	r.MustDo("HSET", key, "f", "v")
	for range 2 * breakerFailures {
		if get(tr, e) != nil {
			t.Fatal("a hash read as an entry")
		}
	}
	if st := tr.Stats(); st.Errors != 0 || st.Rejected != 2*breakerFailures || tr.br.current() != closed {
		t.Errorf("a hash at an entry's key: %+v, breaker %v; want refused values, no errors", st, tr.br.current())
	}
	// An epoch that cannot be read may hide a flush: the name is a miss.
	zone := tr.keys.epochKey(epochZone, wire(t, "mail.example.org"))
	r.MustDo("DEL", zone)
	r.MustDo("RPUSH", zone, "x")
	for range 2 * breakerFailures {
		if get(tr, mail) != nil {
			t.Fatal("an entry read under an epoch that is not a time")
		}
	}
	r.MustDo("DEL", zone)
	r.MustDo("SET", zone, "0")
	r.MustDo("SET", tr.keys.epochKey(epochName, wire(t, "mail.example.org")), "not a time")
	if get(tr, mail) != nil {
		t.Fatal("an entry read under an epoch that is not a number")
	}
	if st := tr.Stats(); st.Errors != 0 || tr.br.current() != closed || tr.m.rejected[errEpoch].n.Load() != 2*breakerFailures+1 {
		t.Errorf("epochs of other types: %+v, breaker %v, %d refused; want no errors", st, tr.br.current(), tr.m.rejected[errEpoch].n.Load())
	}
}

// TestMalformedEpochReplaced: an epoch that is not a time (a string that
// is no number, a key of another type) covers every value of its scope,
// and writes of its scope would keep it alive for good. A write after a
// lookup found it replaces it by a time no earlier than that lookup:
// values stored since are read again, those of the flush it hid are not.
func TestMalformedEpochReplaced(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	now := time.Now().Unix()
	a := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now-10), 300)
	putAndWait(t, tr, a)
	if err := tr.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, "www.example.org")}}, now-5); err != nil {
		t.Fatal(err)
	}
	name, zone := tr.keys.epochKey(epochName, wire(t, "www.example.org")), tr.keys.epochKey(epochZone, wire(t, "org"))
	r.MustDo("SET", name, "not a time")
	r.MustDo("DEL", zone)
	r.MustDo("RPUSH", zone, "x")
	if get(tr, a) != nil {
		t.Fatal("read under an epoch that is not a time")
	}
	later := built(t, "www.example.org", dns.TypeAAAA, dns.RcodeSuccess, uint32(now+5), 300)
	tr.Put(later)
	for deadline := time.Now().Add(3 * time.Second); get(tr, later) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			ttl, _ := r.Do("PTTL", name)
			t.Fatalf("a value stored after the epoch was found is never read: the name's epoch holds %q, expires in %s ms; %+v", r.MustDo("GET", name), ttl, tr.Stats())
		}
	}
	for _, key := range []string{name, zone} {
		if at, err := strconv.ParseInt(r.MustDo("GET", key), 10, 64); err != nil || at < now {
			t.Errorf("the epoch %s holds %q, want a time no earlier than when it was found", key, r.MustDo("GET", key))
		}
		if ttl, _ := strconv.Atoi(strings.TrimPrefix(r.MustDo("PTTL", key), ":")); ttl <= 0 || ttl > 3601_000 {
			t.Errorf("the epoch %s replaced expires in %d ms, want the life of an epoch", key, ttl)
		}
	}
	if get(tr, a) != nil {
		t.Error("a value the hidden flush covered is read again")
	}
}

// TestFlushAfterDisconnect: a replica whose connections the server dropped
// reads the stream again by itself, from where it left off: a flush sent
// meanwhile still reaches it within a second.
func TestFlushAfterDisconnect(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	got := make(chan flush.Flush, 10)
	a := mustTier(t, option, 1, nil)
	mustTier(t, option, 1, func(f flush.Flush) { got <- f })
	for i := range 3 {
		if n := r.MustDo("CLIENT", "KILL", "TYPE", "normal"); n == ":0" || n == ":1" {
			t.Fatalf("round %d: %s connections dropped, want both replicas'", i, n)
		}
		start := time.Now()
		var err error
		for err = a.Flush(flush.Flush{Scope: flush.Negative}, time.Now().Unix()); err != nil && time.Since(start) < time.Second; {
			time.Sleep(10 * time.Millisecond) // a's connection was dropped too
			err = a.Flush(flush.Flush{Scope: flush.Negative}, time.Now().Unix())
		}
		if err != nil {
			t.Fatal(err)
		}
		awaitNegative(t, got, time.Second, fmt.Sprintf("round %d: the flush did not reach the other replica within a second of a dropped connection", i))
	}
}

// TestFlushBeforeReaderStarts: a flush sent once a replica counts as
// connected reaches it, however late its reader of flushes starts: held
// back until after the flush, the reader still reads it.
func TestFlushBeforeReaderStarts(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	// Set before the tiers start and put back after they closed (cleanups
	// run last first), so that no reader reads it meanwhile.
	testHookReading = func() { <-hold }
	t.Cleanup(func() { testHookReading = func() {} })
	// Deferred, it lets the readers go before the cleanups close the
	// tiers, whose Close waits for them, also when the test fails.
	defer release()
	a := mustTier(t, option, 1, nil)
	got := make(chan flush.Flush, 1)
	mustTier(t, option, 1, func(f flush.Flush) { got <- f })
	if err := a.Flush(flush.Flush{Scope: flush.Negative}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	release()
	awaitNegative(t, got, 5*time.Second, "a flush sent before the connected replica's reader started never reached it")
}

// awaitNegative waits up to d for the flush a replica applies next, which
// must be of negative entries; missing says what its absence means.
func awaitNegative(t *testing.T, got <-chan flush.Flush, d time.Duration, missing string) {
	t.Helper()
	select {
	case f := <-got:
		if f.Scope != flush.Negative {
			t.Fatalf("received %s, want the flush of negative entries", f.String())
		}
	case <-time.After(d):
		t.Fatal(missing)
	}
}

// TestFlushesLost: a replica that finds, after an error, that flushes it
// did not read were trimmed from the stream flushes its store whole; one
// that missed nothing does not.
func TestFlushesLost(t *testing.T) {
	r := testenv.StartRedis(t)
	var applied []string
	tr := mustTier(t, "shared redis://"+r.Addr, 1, func(f flush.Flush) { applied = append(applied, f.String()) })
	stream := "test-stream"
	c := *tr.client.Load()
	r.MustDo("XADD", stream, "5-3", "k", "v")
	r.MustDo("XADD", stream, "7-0", "k", "v")
	for _, last := range []string{"5-2", "5-3", "6-0"} {
		tr.checkLost(c, stream, last, true)
	}
	if len(applied) != 0 {
		t.Fatalf("flushed %v after reading up to a flush still in the stream", applied)
	}
	tr.checkLost(c, stream, "5-1", true) // 5-2 is gone
	all := flush.Flush{Scope: flush.All}
	if len(applied) != 1 || applied[0] != all.String() {
		t.Fatalf("flushed %v after flushes were trimmed, want all", applied)
	}
}

// TestFlushesTrimmedOrMadeAgain: a stream whose first flush is past the one
// after where a replica read was trimmed, or deleted and made again. A
// trimmed one took flushes the replica never read, though it had read all
// before (an error, not a read, left it behind): it flushes its store
// whole. A stream made again, whose server may have lost the epochs with
// it, has it flush the tier whole and read the stream from its start,
// keeping the store of a replica that had read all. The server's
// max-deleted-entry-id does not tell them apart: trimming leaves it.
func TestFlushesTrimmedOrMadeAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		make      func(r *testenv.Redis, stream string)
		madeAgain bool
	}{
		{"trimmed", func(r *testenv.Redis, stream string) {
			for _, id := range []string{"5-1", "5-3", "7-0"} {
				r.MustDo("XADD", stream, id, "k", "v")
			}
			r.MustDo("XTRIM", stream, "MINID", "7-0")
		}, false},
		{"made again", func(r *testenv.Redis, stream string) {
			r.MustDo("XADD", stream, "5-1", "k", "v")
			r.MustDo("DEL", stream)
			r.MustDo("XADD", stream, "7-0", "k", "v")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t)
			var applied []string
			tr := mustTier(t, "shared redis://"+r.Addr, 1, func(f flush.Flush) { applied = append(applied, f.String()) })
			stream := "test-stream"
			tc.make(r, stream)
			next, _ := tr.checkLost(*tr.client.Load(), stream, "5-1", false)
			all := flush.Flush{Scope: flush.All}
			if lost := len(applied) == 1 && applied[0] == all.String(); lost == tc.madeAgain || len(applied) > 1 {
				t.Errorf("flushed %v, want the store flushed whole: %v", applied, !tc.madeAgain)
			}
			if flushed := r.MustDo("EXISTS", tr.keys.all) == ":1"; flushed != tc.madeAgain {
				t.Errorf("the tier flushed whole: %v, want %v", flushed, tc.madeAgain)
			}
			if want := map[bool]string{false: "5-1", true: "0-0"}[tc.madeAgain]; next != want {
				t.Errorf("reads on from %s, want %s", next, want)
			}
		})
	}
}

// heldReplica starts a replica of option whose reader, in applying its
// first flush, holds until release, as a long walk of the store holds it.
// applied returns the flushes it applied, in order.
func heldReplica(t *testing.T, option string) (tr *Tier, applied func() []string, release func()) {
	hold := make(chan struct{})
	var mu sync.Mutex
	var got []string
	tr = mustTier(t, option, 1, func(f flush.Flush) {
		mu.Lock()
		got = append(got, f.String())
		first := len(got) == 1
		mu.Unlock()
		if first {
			<-hold
		}
	})
	release = sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release) // before the tier's, which waits for its reader
	applied = func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	return tr, applied, release
}

// TestStreamGone: the stream of flushes deleted (FLUSHALL, an eviction
// under an allkeys policy, a failover or restart to a server without it),
// or made again with IDs before where a replica read up to (a server whose
// clock is behind), takes with it the flushes a replica had not read. The
// replica flushes its store whole, once, counted, and reads the flushes
// sent after from the new stream.
func TestStreamGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		gone func(r *testenv.Redis, stream string)
	}{
		{"deleted", func(r *testenv.Redis, stream string) { r.MustDo("DEL", stream) }},
		{"flushall", func(r *testenv.Redis, _ string) { r.MustDo("FLUSHALL") }},
		{"restarted empty", func(r *testenv.Redis, _ string) { r.Kill(); r.Start() }},
		{"made again behind", func(r *testenv.Redis, stream string) {
			r.MustDo("DEL", stream)
			r.MustDo("XADD", stream, "1-1", "from", "elsewhere", "flush", "x", "tag", "y")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t)
			option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
			a := mustTier(t, option, 1, nil)
			b, applied, release := heldReplica(t, option)
			await := func(want, missing string) {
				t.Helper()
				for deadline := time.Now().Add(10 * time.Second); !slices.Contains(applied(), want); time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%s: applied %v", missing, applied())
					}
				}
			}
			send := func(f flush.Flush) {
				t.Helper()
				var err error
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if err = a.Flush(f, time.Now().Unix()); err == nil || time.Now().After(deadline) {
						break
					}
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			send(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, "read.example")}})
			await("names read.example.", "the first flush never reached the other replica")
			send(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, "lost.example")}})
			e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())-1, 300)
			putAndWait(t, a, e)
			tc.gone(r, a.keys.streamKey())
			release()
			all := flush.Flush{Scope: flush.All}
			await(all.String(), "the stream went with a flush the replica had not read, and it did not flush whole")
			if get(b, e) != nil {
				t.Error("a value stored before the stream went, with the epochs of its flushes maybe, is read after it")
			}
			negative := flush.Flush{Scope: flush.Negative}
			send(negative)
			await(negative.String(), "a flush sent after the stream was made again never reached the replica")
			got := applied()
			if n := slices.Index(got, all.String()); slices.Index(got[n+1:], all.String()) >= 0 {
				t.Errorf("flushed whole more than once for one loss: %v", got)
			}
			if n := b.m.lost.n.Load(); n != 1 {
				t.Errorf("%d losses of flushes counted, want 1", n)
			}
		})
	}
}

// TestStreamGoneCaughtUp: a replica that had read every flush when the
// stream went (a server restarted without persistence, FLUSHALL) lost
// none: it keeps its store, flushes the tier whole (the epochs may have
// gone with the stream) and reads the flushes sent since.
func TestStreamGoneCaughtUp(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	caughtUp := make(chan struct{}, 1)
	testHookCaughtUp = func() {
		select {
		case caughtUp <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { testHookCaughtUp = func() {} })
	a := mustTier(t, option, 1, nil)
	got := make(chan string, 8)
	b := mustTier(t, option, 1, func(f flush.Flush) { got <- f.String() })
	await := func(want string) {
		t.Helper()
		select {
		case f := <-got:
			if f != want {
				t.Fatalf("applied %s, want %s", f, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never applied", want)
		}
	}
	first := flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, "read.example")}}
	if err := a.Flush(first, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	await(first.String())
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix())-1, 300)
	putAndWait(t, a, e)
	<-caughtUp // drop one that came before the flush
	<-caughtUp
	r.MustDo("DEL", a.keys.streamKey())
	negative := flush.Flush{Scope: flush.Negative}
	for deadline := time.Now().Add(10 * time.Second); get(b, e) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a value stored before the stream went is read after it: the tier was not flushed")
		}
	}
	if err := a.Flush(negative, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	await(negative.String()) // and no whole flush before it
	if n := b.m.lost.n.Load(); n != 0 {
		t.Errorf("%d losses of flushes counted, want 0", n)
	}
}

// TestFlushesTrimmedWhileBehind: a replica that falls behind the stream
// without an error (here held in applying a flush, as a zone flush's walk
// of a large store holds it) while the others send more flushes than the
// stream keeps flushes its store whole when it reads on, as one that was
// out of reach does: a flush it never read is gone.
func TestFlushesTrimmedWhileBehind(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	a := mustTier(t, option, 1, nil)
	_, applied, release := heldReplica(t, option)
	seen := func(want string) bool { return slices.Contains(applied(), want) }
	now := time.Now().Unix()
	send := func(name string) {
		t.Helper()
		if err := a.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, name)}}, now); err != nil {
			t.Fatal(err)
		}
	}
	send("slow.example")
	for deadline := time.Now().Add(5 * time.Second); !seen("names slow.example."); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first flush never reached the other replica")
		}
	}
	send("lost.example")
	for range maxStream + 600 {
		send("filler.example")
	}
	send("last.example")
	release()
	for deadline := time.Now().Add(10 * time.Second); !seen("names last.example."); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the last flush never reached the other replica")
		}
	}
	all := flush.Flush{Scope: flush.All}
	if !seen("names lost.example.") && !seen(all.String()) {
		t.Errorf("the flush of lost.example. was trimmed before the replica read it, and the replica neither applied it nor flushed whole")
	}
}

// TestEpochsEvicted: a tier at its maxmemory evicts the epochs as it
// evicts values. A value is read only with every epoch it was written
// with, so one whose flush was evicted is a miss, not the flushed answer
// back; an epoch written again by a later value holds back the values
// stored before it.
func TestEpochsEvicted(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	now := uint32(time.Now().Unix())
	a := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, now-10, 300)
	putAndWait(t, tr, a)
	name := tr.keys.epochKey(epochName, wire(t, "www.example.org"))
	if got := r.MustDo("GET", name); got != strconv.Itoa(int(now-11)) {
		t.Fatalf("the name's epoch holds %q, want the value's time less a second", got)
	}
	// Evicted without a flush: a miss all the same, and counted. Without
	// the epoch of expired entries it is also a value of a version before
	// that epoch, which knows no flush of expired entries in the tier:
	// ignored, counted, until a write of this version makes the epoch.
	for _, key := range []string{name, tr.keys.epochKey(epochZone, wire(t, "org")), tr.keys.all, tr.keys.expired} {
		before := r.MustDo("GET", key)
		r.MustDo("DEL", key)
		if get(tr, a) != nil {
			t.Errorf("read without its epoch %s", key)
		}
		r.MustDo("SET", key, before)
	}
	if n := tr.m.rejected[errEvicted].n.Load(); n != 4 {
		t.Errorf("%d values refused as evicted, want 4", n)
	}
	if get(tr, a) == nil {
		t.Fatal("not read with its epochs back")
	}
	// Flushed, the flush's epoch evicted, and the name's epoch written
	// again by another of its values, stored after the flush.
	if err := tr.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, "www.example.org")}}, int64(now-5)); err != nil {
		t.Fatal(err)
	}
	r.MustDo("DEL", name)
	aaaa := built(t, "www.example.org", dns.TypeAAAA, dns.RcodeSuccess, now, 300)
	putAndWait(t, tr, aaaa)
	if get(tr, a) != nil {
		t.Error("a value stored before a flush whose epoch was evicted is read again")
	}
	// Values that need an epoch refresh its life.
	r.MustDo("PEXPIRE", tr.keys.all, "1000")
	putAndWait(t, tr, built(t, "mail.example.org", dns.TypeA, dns.RcodeSuccess, now, 300))
	if ttl, _ := strconv.Atoi(strings.TrimPrefix(r.MustDo("PTTL", tr.keys.all), ":")); ttl < 3600_000 {
		t.Errorf("an epoch a value was written with lives %d ms, want past the value's life", ttl)
	}
}

// TestTierFullKeepsFlushes: under allkeys-lru a lookup reads a value and
// its name's epoch together, so that LRU evicts either first; every value
// stored before its name's flush stays a miss while unrelated entries push
// both out.
func TestTierFullKeepsFlushes(t *testing.T) {
	r := testenv.StartRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	now := time.Now().Unix()
	var es []entry.Entry
	for i := range 3000 {
		e := built(t, "n"+strconv.Itoa(i)+".example.org", dns.TypeA, dns.RcodeSuccess, uint32(now-1), 300)
		es = append(es, e)
		tr.Put(e)
		if i%500 == 499 {
			time.Sleep(20 * time.Millisecond) // the writer drains the queue
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, e := range es {
		if err := tr.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{e.QName()}}, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range es {
		get(tr, e) // each value and its epochs read together
	}
	for i := range 3000 {
		tr.Put(built(t, "f"+strconv.Itoa(i)+".example.net", dns.TypeA, dns.RcodeSuccess, uint32(now), 300))
		if i%500 == 499 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	back, values, epochs := 0, 0, 0
	for _, e := range es {
		if get(tr, e) != nil {
			back++
		}
		if r.MustDo("EXISTS", tr.keys.key(e.Key())) == ":1" {
			values++
		}
		if r.MustDo("EXISTS", tr.keys.epochKey(epochName, e.QName())) == ":1" {
			epochs++
		}
	}
	if back > 0 || values == len(es) || epochs == len(es) {
		t.Errorf("%d of %d values stored before their flush read again (%d values and %d name epochs left): want none, and some of each evicted", back, len(es), values, epochs)
	}
}

// TestFlushOutlivesGrace: replicas whose serve_stale windows differ share
// a tier (the fingerprint leaves the window out). The epoch of a flush
// from a replica without serve_stale expires before the values of one
// with it; those values, read without it, are misses.
func TestFlushOutlivesGrace(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	stale, plain := graceTier(t, option, 3600), graceTier(t, option, 0)
	now := time.Now().Unix()
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now-1), 1)
	putAndWait(t, stale, e)
	if err := plain.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{e.QName()}}, now); err != nil {
		t.Fatal(err)
	}
	if get(stale, e) != nil {
		t.Fatal("read after its flush")
	}
	time.Sleep(2100 * time.Millisecond) // the flush's epoch lives MaxTTL, no window, and a second
	if r.MustDo("EXISTS", plain.keys.epochKey(epochName, e.QName())) != ":0" {
		t.Fatal("the flush's epoch still there")
	}
	if get(stale, e) != nil {
		t.Error("a value stored before a flush is read again once the flush's epoch expired")
	}
}

// graceTier is mustTier's tier with MaxTTL 1 s and the serve_stale window
// grace.
func graceTier(t *testing.T, option string, grace int64) *Tier {
	t.Helper()
	cfg, err := parse(t, option)
	if err != nil {
		t.Fatal(err)
	}
	cfg.timeout = time.Second
	return startTier(t, cfg, Options{Fingerprint: [32]byte{1}, Grace: grace, MaxTTL: 1, Zones: ".", View: t.Name(), Apply: func(flush.Flush) {}})
}

// TestCanceledProbeNotLost: a half-open breaker's probe whose request went
// away reports nothing; the next lookup probes again rather than the
// tier being skipped for good.
func TestCanceledProbeNotLost(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)

	tr.br.mu.Lock()
	tr.br.backoff, tr.br.until = breakerMinBackoff, time.Now().Add(-time.Millisecond)
	tr.br.set(open, errors.New("a test's"))
	tr.br.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tr.Get(ctx, [][]byte{e.Key()}, e.QName(), time.Now().Unix(), take) != nil {
		t.Fatal("a canceled lookup answered")
	}
	if get(tr, e) == nil || tr.br.current() != closed {
		t.Errorf("a lookup after a canceled probe: %+v, breaker %v", tr.Stats(), tr.br.current())
	}
}

// TestFlushExpired: flush_expired drops the stale entries serve_stale
// would still serve; the tier's copies of them are misses too, on every
// replica, while those that had not expired at the flush are not.
func TestFlushExpired(t *testing.T) {
	option := "shared redis://" + testenv.StartRedis(t).Addr
	one, other := graceTier(t, option, 3600), graceTier(t, option, 3600)
	now := time.Now().Unix()
	stale := built(t, "stale.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now-100), 10)
	fresh := built(t, "fresh.example.org", dns.TypeA, dns.RcodeSuccess, uint32(now), 300)
	putAndWait(t, one, stale)
	putAndWait(t, one, fresh)
	if err := one.Flush(flush.Flush{Scope: flush.Expired}, now); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*Tier{one, other} {
		if get(tr, stale) != nil {
			t.Error("a stale value read after flush_expired")
		}
		if get(tr, fresh) == nil {
			t.Errorf("a value that had not expired is a miss after flush_expired: %+v", tr.Stats())
		}
	}
}

// TestBreakerGaugeAfterReload: a reload replaces a block's tier with one
// of the same labels; the new tier's breaker starts closed, and once the
// tier it replaced closes, its gauge says so, whatever that tier's was.
func TestBreakerGaugeAfterReload(t *testing.T) {
	option := "shared redis://" + testenv.StartRedis(t).Addr
	old := mustTier(t, option, 1, nil)
	old.br.mu.Lock()
	old.br.backoff, old.br.until = breakerMinBackoff, time.Now().Add(time.Hour)
	old.br.set(open, errors.New("a test's"))
	old.br.mu.Unlock()
	gauge := func() float64 { return testutil.ToFloat64(breakerGauge.WithLabelValues(".", t.Name())) }
	if g := gauge(); g != float64(open) {
		t.Fatalf("the gauge of an open breaker is %v", g)
	}
	tr := mustTier(t, option, 1, nil)
	old.Close()
	if g := gauge(); g != float64(tr.br.current()) {
		t.Errorf("the gauge of a new tier's %v breaker is %v", tr.br.current(), g)
	}
}

// TestBreakerGaugeOfPorts: blocks of the same zones and view on other
// ports share the breaker series, which says open while one of their
// breakers is open, and goes when the last of their tiers closes.
func TestBreakerGaugeOfPorts(t *testing.T) {
	cfg, err := parse(t, "shared redis://"+testenv.StartRedis(t).Addr)
	if err != nil {
		t.Fatal(err)
	}
	blocks := corefileOf(cfg, []string{"53"}, []string{"5353"})
	block := func(i int) *Tier {
		return startTier(t, blocks[i], Options{Fingerprint: [32]byte{1}, MaxTTL: 3600, Zones: ".", View: t.Name()})
	}
	gauge := func() float64 { return testutil.ToFloat64(breakerGauge.WithLabelValues(".", t.Name())) }
	on53 := block(0)
	on53.br.mu.Lock()
	on53.br.backoff, on53.br.until = breakerMinBackoff, time.Now().Add(time.Hour)
	on53.br.set(open, errors.New("a test's"))
	on53.br.mu.Unlock()
	on5353 := block(1)
	if g := gauge(); g != float64(open) {
		t.Errorf("the gauge of an open breaker and a closed one is %v, want %d (open)", g, open)
	}
	on53.Close()
	if g := gauge(); g != float64(closed) {
		t.Errorf("the gauge of the closed breaker left is %v, want %d (closed)", g, closed)
	}
	on5353.Close()
	if breakerGauge.DeleteLabelValues(".", t.Name()) {
		t.Error("the breaker series outlived the tiers that held it")
	}
}

// TestFlushWhileStreamEndFails: a replica that connects but cannot read
// where the stream of flushes ends (here its ACL user may not, for a
// while) does not count as connected: a flush another replica sends once
// it does is one it applies, not one it skips by reading the end later.
func TestFlushWhileStreamEndFails(t *testing.T) {
	r := testenv.StartRedis(t, "--user", "default", "on", "nopass", "~*", "&*", "+@all",
		"--user", "cache", "on", ">s3cret-pw", "~*", "&*", "+@all", "-xrevrange")
	secret := secretFile(t, testSecret)
	sender := mustTier(t, "shared redis://"+r.Addr+" {\n secret_file "+secret+"\n}", 1, nil)
	cfg, err := parse(t, "shared redis://cache@"+r.Addr+" {\n secret_file "+secret+"\n password_file "+secretFile(t, "s3cret-pw")+"\n}")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var applied []string
	tr := New(cfg, Options{Fingerprint: [32]byte{1}, MaxTTL: 3600, Zones: ".", View: t.Name(), Apply: func(f flush.Flush) {
		mu.Lock()
		defer mu.Unlock()
		applied = append(applied, f.String())
	}})
	t.Cleanup(tr.Close)
	seen := func(want string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(applied, want)
	}
	for range 50 {
		if tr.Connected() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	connected := tr.Connected()
	send := func(name string) {
		t.Helper()
		if err := sender.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, name)}}, time.Now().Unix()); err != nil {
			t.Fatal(err)
		}
	}
	send("first.example")
	r.MustDo("ACL", "SETUSER", "cache", "+xrevrange")
	for deadline := time.Now().Add(20 * time.Second); !tr.Connected(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never connected once it could read the stream")
		}
	}
	send("second.example")
	for deadline := time.Now().Add(20 * time.Second); !seen("names second.example."); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a flush sent once it connected never reached it")
		}
	}
	if connected && !seen("names first.example.") {
		t.Errorf("connected before the flush of first.example. was sent, and never applied it: applied %v", applied)
	}
}

// TestReloadReadsOn: at a reload the block's new instance takes over the
// old one's store, and its tier, made before the old one's closes, may
// connect after it closed. A flush sent in between reaches the store all
// the same: the new tier reads on from where the old one's reader stopped,
// not from the stream's end. (The new tier's user is refused the stream's
// end until the test lets it, as a slow connection would hold it.)
func TestReloadReadsOn(t *testing.T) {
	r := testenv.StartRedis(t, "--user", "default", "on", "nopass", "~*", "&*", "+@all",
		"--user", "cache", "on", ">s3cret-pw", "~*", "&*", "+@all", "-xrevrange")
	secret := secretFile(t, testSecret)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secret + "\n}"
	sender := mustTier(t, option, 1, nil)
	var mu sync.Mutex
	var applied []string
	apply := func(f flush.Flush) {
		mu.Lock()
		defer mu.Unlock()
		applied = append(applied, f.String())
	}
	await := func(want, missing string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			seen := slices.Contains(applied, want)
			mu.Unlock()
			if seen {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(missing)
			}
		}
	}
	send := func(name string) {
		t.Helper()
		if err := sender.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, name)}}, time.Now().Unix()); err != nil {
			t.Fatal(err)
		}
	}
	old := mustTier(t, option, 1, apply)
	cfg, err := parse(t, "shared redis://cache@"+r.Addr+" {\n secret_file "+secret+"\n password_file "+secretFile(t, "s3cret-pw")+"\n}")
	if err != nil {
		t.Fatal(err)
	}
	tr := New(cfg, Options{Fingerprint: [32]byte{1}, MaxTTL: 3600, Zones: ".", View: t.Name(), Apply: apply})
	t.Cleanup(tr.Close)
	send("before.example")
	await("names before.example.", "the old instance's tier never applied a flush")
	old.Close()
	send("between.example")
	r.MustDo("ACL", "SETUSER", "cache", "+xrevrange")
	await("names between.example.", "a flush sent after the old tier closed, before the new one connected, never reached the store")
}

// TestRestoredReadsSince: the tier of a store read from a snapshot reads
// the flushes sent since the file was written, which the file lacks, from
// a stream made since too; one trimmed past them flushes the store whole,
// not the tier.
func TestRestoredReadsSince(t *testing.T) {
	all := (&flush.Flush{Scope: flush.All}).String()
	for _, tc := range []struct {
		name  string
		seed  bool  // the stream holds a flush from before the file
		del   bool  // and loses it once the flush since is sent
		since int64 // when the file was written, from now
		want  []string
	}{
		{"older stream", true, false, 0, []string{"names since.example."}},
		{"made since", false, false, 0, []string{"names since.example."}},
		{"trimmed", true, true, 0, []string{all}},
		{"none since", true, false, 3600, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t)
			option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
			sender := mustTier(t, option, 1, nil)
			send := func(name string) {
				t.Helper()
				if err := sender.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{wire(t, name)}}, time.Now().Unix()); err != nil {
					t.Fatal(err)
				}
			}
			stream := sender.keys.streamKey()
			if tc.seed {
				r.MustDo("XADD", stream, "1-1", "k", "v")
			}
			send("since.example")
			if tc.del {
				r.MustDo("XDEL", stream, "1-1")
			}
			var mu sync.Mutex
			var applied []string
			cfg, err := parse(t, option)
			if err != nil {
				t.Fatal(err)
			}
			startTier(t, cfg, Options{Fingerprint: [32]byte{1}, MaxTTL: 3600, Zones: ".", View: t.Name(), Since: time.Now().Unix() + tc.since, Apply: func(f flush.Flush) {
				mu.Lock()
				defer mu.Unlock()
				applied = append(applied, f.String())
			}})
			send("after.example")
			want := append(tc.want, "names after.example.")
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				got := slices.Clone(applied)
				mu.Unlock()
				if slices.Contains(got, want[len(want)-1]) {
					if !slices.Equal(got, want) {
						t.Errorf("applied %q, want %q", got, want)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("applied %q, never the flush sent once it connected", got)
				}
			}
			if flushed := r.MustDo("EXISTS", sender.keys.all) == ":1"; flushed {
				t.Error("the tier was flushed whole")
			}
		})
	}
}

// TestStreamOfAnotherType: a key of another type where the stream of
// flushes goes keeps no replica from connecting and using the tier.
func TestStreamOfAnotherType(t *testing.T) {
	r := testenv.StartRedis(t)
	keys := newKeyer(nil, keysFingerprint([32]byte{1}, t.Name(), nil))
	r.MustDo("SET", keys.streamKey(), "not a stream")
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	putAndWait(t, tr, built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300))
}

// TestSlowTierOpensBreaker: a tier that answers, but later than a lookup
// waits, opens the breaker: the writes that follow the lookups' timeouts,
// which may wait longer, are no sign that lookups are answered in time.
func TestSlowTierOpensBreaker(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+slowProxy(t, r.Addr, 300*time.Millisecond)+" {\n timeout 20ms\n}", 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	writes := func() int64 { return tr.m.written.n.Load() + tr.m.dropped.n.Load() }
	for range 4 * breakerFailures {
		if tr.br.current() != closed {
			break
		}
		get(tr, e)
		before := writes()
		tr.Put(e)
		for deadline := time.Now().Add(10 * time.Second); writes() == before; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("a write never ended")
			}
		}
	}
	if st := tr.Stats(); tr.br.current() == closed {
		t.Errorf("the breaker is closed after lookups that timed out: %+v", st)
	}
}

// slowProxy returns the address of a proxy to addr that holds back what
// the server sends by delay.
func slowProxy(t *testing.T, addr string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go func() {
				io.Copy(s, c)
				s.Close()
			}()
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestTLSCAGoneAfterParse: a rediss:// tier whose tls_ca file went away
// between the parse and the start (a reload racing a rotation) never
// speaks to its server in the clear, its password included.
func TestTLSCAGoneAfterParse(t *testing.T) {
	ca, _, _ := writeCerts(t)
	r := testenv.StartRedis(t) // no TLS: a client that connects spoke in the clear
	cfg, err := parse(t, "shared rediss://"+r.Addr+" {\n tls_ca "+ca+"\n}")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	tr := New(cfg, Options{MaxTTL: 3600, Zones: ".", View: t.Name(), Apply: func(flush.Flush) {}})
	defer tr.Close()
	time.Sleep(300 * time.Millisecond)
	if tr.Connected() {
		t.Error("a rediss:// tier connected to a server without TLS")
	}
}

// TestViewsApart: the views of a server answer a question each its own
// way (split horizon); blocks of the same settings in other views share a
// tier's server, never its values or flushes.
func TestViewsApart(t *testing.T) {
	cfg, err := parse(t, "shared redis://"+testenv.StartRedis(t).Addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.timeout = time.Second
	got := make(chan flush.Flush, 2)
	view := func(name string, apply func(flush.Flush)) *Tier {
		return startTier(t, cfg, Options{Fingerprint: [32]byte{1}, MaxTTL: 3600, Zones: ".", View: name, Apply: apply})
	}
	internal, external := view("internal", func(flush.Flush) {}), view("external", func(f flush.Flush) { got <- f })
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, internal, e)
	if get(external, e) != nil {
		t.Error("a view read what another view fetched")
	}
	if err := internal.Flush(flush.Flush{Scope: flush.All}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	// A flush of the view's own, sent after, reaches it first.
	if err := view("external", func(flush.Flush) {}).Flush(flush.Flush{Scope: flush.Negative}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	awaitNegative(t, got, 10*time.Second, "a flush of the view's own never reached it")
}

// corefileOf returns copies of cfg for the blocks of one Corefile, on
// ports each, as Parse declares them.
func corefileOf(cfg *Config, ports ...[]string) []*Config {
	peers := new([]*Config)
	for _, p := range ports {
		c := *cfg
		c.ports, c.peers = p, peers
		*peers = append(*peers, &c)
	}
	return *peers
}

// TestPortsApart: the blocks of a Corefile on other ports that share a
// tier's server answer a question each its own way (a forward of their
// own): they share neither its values nor its flushes. Their replicas
// share both, and so do blocks alone on their server in their Corefiles
// whatever their ports: replicas on a test's free ports, or a pod's.
func TestPortsApart(t *testing.T) {
	cfg, err := parse(t, "shared redis://"+testenv.StartRedis(t).Addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.timeout = time.Second
	got := make(chan flush.Flush, 2)
	block := func(cfg *Config, apply func(flush.Flush)) *Tier {
		if apply == nil {
			apply = func(flush.Flush) {}
		}
		return startTier(t, cfg, Options{Fingerprint: [32]byte{1}, MaxTTL: 3600, Zones: ".", Apply: apply})
	}
	two := func() []*Config { return corefileOf(cfg, []string{"53"}, []string{"5353"}) }
	first := two()
	on53, on5353 := block(first[0], nil), block(first[1], func(f flush.Flush) { got <- f })
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, on53, e)
	if get(on5353, e) != nil {
		t.Error("a block on port 5353 read what a block on 53 of its Corefile fetched")
	}
	replica := two()
	if get(block(replica[0], nil), e) == nil {
		t.Error("a replica's block on port 53 did not read what the block on 53 fetched")
	}
	if get(block(corefileOf(cfg, []string{"53"})[0], nil), e) != nil {
		t.Error("a block alone in its Corefile read what a block kept apart fetched")
	}
	alone := built(t, "alone.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, block(corefileOf(cfg, []string{"53"})[0], nil), alone)
	if get(block(corefileOf(cfg, []string{"1053"})[0], nil), alone) == nil {
		t.Error("blocks alone in their Corefiles on other ports did not share")
	}
	if err := on53.Flush(flush.Flush{Scope: flush.All}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	// A flush of a replica's block on the same port, sent after, reaches
	// it first.
	if err := block(replica[1], nil).Flush(flush.Flush{Scope: flush.Negative}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	awaitNegative(t, got, 10*time.Second, "a flush of a replica on the same port never reached it")
}

// TestClosedTierSkipped: at a reload the old instance's tier closes while
// that instance still answers; its lookups then skip the tier, rather than
// fail on the closed client and open the breaker (a warning in the log at
// every reload).
func TestClosedTierSkipped(t *testing.T) {
	r := testenv.StartRedis(t)
	tr := mustTier(t, "shared redis://"+r.Addr, 1, nil)
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	tr.Close()
	for range 2 * breakerFailures {
		if tr.Get(context.Background(), [][]byte{e.Key()}, e.QName(), time.Now().Unix(), take) != nil {
			t.Fatal("a closed tier answered")
		}
	}
	if st := tr.Stats(); tr.br.current() != closed || st.Errors != 0 || st.Skipped != 2*breakerFailures {
		t.Errorf("lookups after the close: breaker %v, %+v; want them skipped", tr.br.current(), st)
	}
}

// TestEvictionPolicyWarned: a server whose maxmemory-policy may evict the
// stream of flushes (allkeys-*), and with it the tier's warmth at every
// eviction, is warned of when the tier connects; one that evicts only keys
// with a TTL is not, and one that refuses CONFIG is no failure. Of a
// cluster, whose stream lives on the node of its slot, every node is
// checked, not only the one a command without a key reaches, and each
// warned of by its address.
func TestEvictionPolicyWarned(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		cluster bool // args for the cluster's nodes but the seed
		warn    bool
	}{
		{"allkeys-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, false, true},
		{"allkeys-lru without maxmemory, which evicts nothing", []string{"--maxmemory-policy", "allkeys-lru"}, false, false},
		{"volatile-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"}, false, false},
		{"config renamed", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}, false, false},
		{"allkeys-lru on a cluster's nodes but the seed", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := testenv.CaptureLog(t)
			var addr string
			var named []string // the nodes to be warned of by address
			if tc.cluster {
				nodes := startCluster(t, nil, tc.args, tc.args)
				addr = nodes[0].Addr
				for _, n := range nodes[1:] {
					named = append(named, n.Addr)
				}
			} else {
				addr = testenv.StartRedis(t, tc.args...).Addr
			}
			tr := mustTier(t, "shared redis://"+addr, 1, nil)
			if warned := strings.Contains(logs.String(), "maxmemory-policy allkeys-lru"); warned != tc.warn {
				t.Errorf("warned %v, want %v; log:\n%s", warned, tc.warn, logs)
			}
			for _, n := range named {
				if c := strings.Count(logs.String(), "node "+n+": maxmemory-policy allkeys-lru"); c != 1 {
					t.Errorf("node %s warned of %d times, want once; log:\n%s", n, c, logs)
				}
			}
			putAndWait(t, tr, built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300))
		})
	}
}

// TestEvictionPolicyWarnedWhenStreamGone: a stream of flushes gone, which
// an eviction may have taken, or a failover to a server of other settings,
// has the policy read again.
func TestEvictionPolicyWarnedWhenStreamGone(t *testing.T) {
	logs := testenv.CaptureLog(t)
	r := testenv.StartRedis(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
	option := "shared redis://" + r.Addr
	a := mustTier(t, option, 1, nil)
	got := make(chan struct{}, 1)
	mustTier(t, option, 1, func(flush.Flush) { got <- struct{}{} })
	r.MustDo("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	if err := a.Flush(flush.Flush{Scope: flush.Negative}, time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the flush never reached the other replica")
	}
	r.MustDo("DEL", a.keys.streamKey())
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "maxmemory-policy allkeys-lru"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning of the policy after the stream went; log:\n%s", logs)
		}
	}
}

// TestLongestGrace: with a serve_stale window near Go's longest duration,
// values and the epochs of flushes are written all the same, their lives
// cut to the longest duration rather than wrapped.
func TestLongestGrace(t *testing.T) {
	r := testenv.StartRedis(t)
	option := "shared redis://" + r.Addr + " {\n secret_file " + secretFile(t, testSecret) + "\n}"
	tr := graceTier(t, option, int64(time.Duration(math.MaxInt64)/time.Second))
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	putAndWait(t, tr, e)
	if err := tr.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{e.QName()}}, time.Now().Unix()); err != nil {
		t.Fatalf("a flush: %v", err)
	}
	if pttl := r.MustDo("PTTL", tr.keys.epochKey(epochName, e.QName())); !strings.HasPrefix(pttl, ":") || strings.HasPrefix(pttl, ":-") {
		t.Errorf("PTTL of the flush's epoch: %q, want a life", pttl)
	}
}
