package compactcache

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/adminserver"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// adminUpstream answers A, AAAA and TXT for every name under example.org,
// example.net and xexample.org (TXT with the name), NXDOMAIN under nx., NODATA
// for MX, and SERVFAIL under fail.
func adminUpstream() *upstream {
	u := newUpstream()
	soa := []dns.RR{test.SOA("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60")}
	for _, name := range []string{"www.example.org.", "a.www.example.org.", "example.org.", "b.example.org.", "www.example.net.", "www.xexample.org.", "short.example.org."} {
		ttl := "300"
		if strings.HasPrefix(name, "short.") {
			ttl = "10"
		}
		u.add(name, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(name + " " + ttl + " IN A 192.0.2.1")}, nil, nil)
		u.add(name, dns.TypeAAAA, dns.RcodeSuccess, []dns.RR{test.AAAA(name + " " + ttl + " IN AAAA 2001:db8::1")}, nil, nil)
		u.add(name, dns.TypeTXT, dns.RcodeSuccess, []dns.RR{test.TXT(name + " " + ttl + ` IN TXT "` + name + `"`)}, nil, nil)
		u.add(name, dns.TypeMX, dns.RcodeSuccess, nil, soa, nil)
	}
	u.add("nx.example.org.", dns.TypeA, dns.RcodeNameError, nil, soa, nil)
	u.add("fail.example.org.", dns.TypeA, dns.RcodeServerFailure, nil, nil, nil)
	return u
}

// adminAsk asks c name/qtype, with CD when cd is set.
func adminAsk(t *testing.T, c *Cache, name string, qtype uint16, cd bool) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.CheckingDisabled = cd
	return ask(t, c, m, false)
}

// isCached reports whether c holds an entry under the plain key of
// name/qtype.
func isCached(t *testing.T, c *Cache, name string, qtype uint16, cd bool) bool {
	t.Helper()
	key, err := entry.KeyFor(strings.ToLower(name), qtype, dns.ClassINET, cd)
	if err != nil {
		t.Fatal(err)
	}
	return c.store.Get(key, c.store.Hash(key), func(entry.Entry) bool { return true })
}

func mustAdminName(t *testing.T, s string) []byte {
	t.Helper()
	var buf [dnsmsg.MaxNameLen]byte
	n, err := dnsmsg.PackName(dns.Fqdn(s), buf[:])
	if err != nil {
		t.Fatal(err)
	}
	dnsmsg.LowerInPlace(buf[:n])
	return slices.Clone(buf[:n])
}

// adminCase is a question and whether it is cached after an operation.
type adminCase struct {
	name  string
	qtype uint16
	cd    bool
	kept  bool
}

// checkKept fails t for each case cached when it should not be, or not
// cached when it should, and checks the store's accounting.
func checkKept(t *testing.T, c *Cache, what string, cases []adminCase) {
	t.Helper()
	for _, k := range cases {
		if got := isCached(t, c, k.name, k.qtype, k.cd); got != k.kept {
			t.Errorf("after %s: %s/%s cd=%t cached %t, want %t", what, k.name, dns.TypeToString[k.qtype], k.cd, got, k.kept)
		}
	}
	checkShards(t, c.store)
}

// fillAdmin asks every case of cases, so that each is cached.
func fillAdmin(t *testing.T, c *Cache, cases []adminCase) {
	t.Helper()
	for _, k := range cases {
		adminAsk(t, c, k.name, k.qtype, k.cd)
		if !isCached(t, c, k.name, k.qtype, k.cd) {
			t.Fatalf("%s/%s cd=%t not cached", k.name, dns.TypeToString[k.qtype], k.cd)
		}
	}
}

func TestAdminFlushName(t *testing.T) {
	c := newTestCache(t, adminUpstream(), newClock())
	cases := []adminCase{
		{"www.example.org.", dns.TypeA, false, false},
		{"www.example.org.", dns.TypeA, true, false}, // CD: its own key
		{"www.example.org.", dns.TypeAAAA, false, false},
		{"www.example.org.", dns.TypeMX, false, false}, // NODATA
		{"a.www.example.org.", dns.TypeA, false, true}, // below: flush takes the name only
		{"example.org.", dns.TypeA, false, true},
		{"www.example.net.", dns.TypeA, false, true},
	}
	fillAdmin(t, c, cases)
	n := c.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "WWW.Example.ORG")}, Types: nil})
	if n != (admin.Counts{Success: 3, Denial: 1}) {
		t.Errorf("flush removed %+v, want 3 success and 1 denial", n)
	}
	checkKept(t, c, "flush www.example.org", cases)
}

func TestAdminFlushType(t *testing.T) {
	c := newTestCache(t, adminUpstream(), newClock())
	cases := []adminCase{
		{"www.example.org.", dns.TypeA, false, false},
		{"www.example.org.", dns.TypeA, true, false},
		{"www.example.org.", dns.TypeAAAA, false, true},
		{"www.example.org.", dns.TypeTXT, false, true},
	}
	fillAdmin(t, c, cases)
	if n := c.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "www.example.org.")}, Types: []uint16{dns.TypeA}}); n.Total() != 2 {
		t.Errorf("flush_type removed %+v, want 2", n)
	}
	checkKept(t, c, "flush_type www.example.org A", cases)
}

func TestAdminFlushZone(t *testing.T) {
	c := newTestCache(t, adminUpstream(), newClock())
	cases := []adminCase{
		{"www.example.org.", dns.TypeA, false, false},
		{"a.www.example.org.", dns.TypeTXT, true, false},
		{"example.org.", dns.TypeAAAA, false, false},
		{"nx.example.org.", dns.TypeA, false, false},
		{"www.xexample.org.", dns.TypeA, false, true}, // a label boundary
		{"www.example.net.", dns.TypeA, false, true},
	}
	fillAdmin(t, c, cases)
	if n := c.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{mustAdminName(t, "Example.Org")}}); n != (admin.Counts{Success: 3, Denial: 1}) {
		t.Errorf("flush_zone removed %+v, want 3 success, 1 denial", n)
	}
	checkKept(t, c, "flush_zone example.org", cases)

	if n := c.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{mustAdminName(t, ".")}}); n.Total() != 2 {
		t.Errorf("flush_zone . removed %+v, want the 2 left", n)
	}
}

func TestAdminFlushNegativeExpiredAll(t *testing.T) {
	clk := newClock()
	c := newTestCache(t, adminUpstream(), clk)
	cases := []adminCase{
		{"www.example.org.", dns.TypeA, false, true},
		{"short.example.org.", dns.TypeA, false, true},
		{"nx.example.org.", dns.TypeA, false, false},
		{"www.example.org.", dns.TypeMX, false, false},
		{"fail.example.org.", dns.TypeA, false, false},
	}
	fillAdmin(t, c, cases)
	if n := c.Flush(flush.Flush{Scope: flush.Negative}); n != (admin.Counts{Denial: 3}) {
		t.Errorf("flush_negative removed %+v, want 3 denials", n)
	}
	checkKept(t, c, "flush_negative", cases)

	clk.advance(20 * time.Second) // short's TTL of 10 s is over
	if n := c.Flush(flush.Flush{Scope: flush.Expired}); n != (admin.Counts{Success: 1}) {
		t.Errorf("flush_expired removed %+v, want 1 success", n)
	}
	cases[1].kept = false
	checkKept(t, c, "flush_expired", cases)

	if n := c.Flush(flush.Flush{Scope: flush.All}); n != (admin.Counts{Success: 1}) {
		t.Errorf("flush_all removed %+v, want 1", n)
	}
	cases[0].kept = false
	checkKept(t, c, "flush_all", cases)
}

// TestAdminFlushNameECS: a name's flush takes its ECS variants, its answers
// to source /0 queries and its lists, and leaves another name's.
func TestAdminFlushNameECS(t *testing.T) {
	g := newGeoUpstream()
	c := newGeoCache(t, "compactcache", g, newClock())
	for _, name := range []string{"s16.geo.", "s24.geo."} {
		for _, subnet := range []string{"10.1.2.0/24", "10.2.0.0/24", "10.1.1.0/32", "0.0.0.0/0", "2001:db8:1:2::/64", ""} {
			ask(t, c, geoQuery(name, subnet), false)
		}
	}
	if c.store.Usage().Variants == 0 {
		t.Fatal("no ECS variant stored")
	}
	other := adminserver.Lookup(operator{c}, mustAdminName(t, "s24.geo."), nil)
	found := adminserver.Lookup(operator{c}, mustAdminName(t, "s16.geo."), nil)
	var ecs []string
	for _, e := range found {
		ecs = append(ecs, e.ECS+"/"+e.ECSMatch)
	}
	if got := strings.Join(ecs, " "); !strings.Contains(got, "10.1.0.0/16/scope") || !strings.Contains(got, "0.0.0.0/0/source0") || !strings.Contains(got, "2001::/16/scope") || !strings.Contains(got, "/") {
		t.Errorf("lookup s16.geo. found %s", got)
	}
	n := c.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "s16.geo.")}, Types: []uint16{dns.TypeTXT}})
	if n.ECSList != 2 || n.Success != int64(len(found)) {
		t.Errorf("flush removed %+v, want the %d entries lookup found and 2 lists", n, len(found))
	}
	if got := adminserver.Lookup(operator{c}, mustAdminName(t, "s16.geo."), nil); len(got) != 0 {
		t.Errorf("lookup after the flush found %d entries", len(got))
	}
	if got := adminserver.Lookup(operator{c}, mustAdminName(t, "s24.geo."), nil); len(got) != len(other) {
		t.Errorf("s24.geo.: %d entries left of %d", len(got), len(other))
	}
	if u := c.store.Usage(); u.Kinds[store.KindMeta] != 2 {
		t.Errorf("%d ECS lists left, want s24.geo.'s 2", u.Kinds[store.KindMeta])
	}
	checkShards(t, c.store)
}

// TestAdminLookupDescribes: lookup gives each entry's key, flags, age and
// records.
func TestAdminLookupDescribes(t *testing.T) {
	clk := newClock()
	c := mustParse(t, "compactcache {\n serve_stale 1h\n}")
	c.Next, c.now = adminUpstream(), clk.now
	t.Cleanup(func() { c.refreshes.shutdown(time.Second) })
	adminAsk(t, c, "short.example.org.", dns.TypeA, false)
	adminAsk(t, c, "short.example.org.", dns.TypeMX, true)
	adminAsk(t, c, "short.example.org.", dns.TypeA, false) // a hit
	clk.advance(4 * time.Second)
	found := adminserver.Lookup(operator{c}, mustAdminName(t, "short.example.org"), nil)
	if len(found) != 2 {
		t.Fatalf("found %d entries, want 2: %+v", len(found), found)
	}
	a, mx := found[0], found[1]
	if a.Type != "A" {
		a, mx = mx, a
	}
	if a.Name != "short.example.org." || a.Class != "IN" || a.CD || a.Rcode != "NOERROR" || a.Kind != "success" ||
		a.TTL != 10 || a.TTLLeft != 6 || a.Stale || a.Expired || a.Hits != 1 || a.Bytes == 0 ||
		len(a.Answer) != 1 || !strings.Contains(a.Answer[0], "6\tIN\tA\t192.0.2.1") {
		t.Errorf("A entry %+v", a)
	}
	if mx.Type != "MX" || !mx.CD || mx.Kind != "denial" || mx.Rcode != "NOERROR" || len(mx.Ns) != 1 || mx.Answer != nil {
		t.Errorf("MX entry %+v", mx)
	}
	text := string(a.AppendText(nil))
	if !strings.HasPrefix(text, "; short.example.org. IN A flags=- ecs=- match=- rcode=NOERROR kind=success ttl=10 left=6 stale=no expired=no bytes=") {
		t.Errorf("text:\n%s", text)
	}
	clk.advance(10 * time.Second)
	found = adminserver.Lookup(operator{c}, mustAdminName(t, "short.example.org"), []uint16{dns.TypeA})
	if len(found) != 1 || !found[0].Stale || !found[0].Expired || found[0].TTLLeft != -4 {
		t.Errorf("A entry after its TTL: %+v", found)
	}
}

// heldUpstream is adminUpstream whose answer to www.example.org. A waits:
// asked closes when the question comes, and closing release answers it.
func heldUpstream() (u *upstream, asked, release chan struct{}) {
	u = adminUpstream()
	asked, release = u.hold("www.example.org. 300 IN A 192.0.2.66")
	return u, asked, release
}

// TestAdminFetchBeforeFlush: a fetch that began before a flush does not
// store what it brings after it when the flush covers it, and does when
// the flush is of something else.
func TestAdminFetchBeforeFlush(t *testing.T) {
	for _, tc := range []struct {
		zone   string
		stored bool
	}{{"example.org.", false}, {"example.net.", true}} {
		u, asked, release := heldUpstream()
		c := newTestCache(t, u, newClock())
		done := make(chan *dns.Msg)
		go func() {
			m := new(dns.Msg)
			m.SetQuestion("www.example.org.", dns.TypeA)
			rec := &recorder{ResponseWriter: test.ResponseWriter{}}
			c.ServeDNS(context.Background(), rec, m)
			done <- rec.msg
		}()
		<-asked
		c.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{mustAdminName(t, tc.zone)}})
		close(release)
		if r := <-done; r == nil || len(r.Answer) != 1 {
			t.Fatalf("the client got %v, want the answer", r)
		}
		if got := isCached(t, c, "www.example.org.", dns.TypeA, false); got != tc.stored {
			t.Errorf("flush_zone %s while www.example.org. was fetched: stored %t, want %t", tc.zone, got, tc.stored)
		}
		// A fetch that begins after the flush stores.
		u.add("www.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("www.example.org. 300 IN A 192.0.2.1")}, nil, nil)
		c.Flush(flush.Flush{Scope: flush.All})
		adminAsk(t, c, "www.example.org.", dns.TypeA, false)
		if !isCached(t, c, "www.example.org.", dns.TypeA, false) {
			t.Error("a fetch begun after the flush did not store")
		}
	}
}

// TestAdminFlushDuringReload: during a reload the old and the new instance
// share one store, and a fetch of either that began before a flush of the
// other stores nothing the flush covers, whether the instances have an
// admin listener or not (neither has one here).
func TestAdminFlushDuringReload(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fetchOld bool // the old instance fetches and the new one flushes, or the reverse
	}{{"old fetches, new flushes", true}, {"new fetches, old flushes", false}} {
		u, asked, release := heldUpstream()
		clk := newClock()
		old, c := newTestCache(t, u, clk), newTestCache(t, u, clk)
		fetch := func(by *Cache) <-chan struct{} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				m := new(dns.Msg)
				m.SetQuestion("www.example.org.", dns.TypeA)
				by.ServeDNS(context.Background(), &recorder{ResponseWriter: test.ResponseWriter{}}, m)
			}()
			<-asked
			return done
		}
		var done <-chan struct{}
		if tc.fetchOld {
			done = fetch(old)
		}
		block := "flush during reload " + tc.name
		old.offer(block)
		if !c.takeOver(block) {
			t.Fatalf("%s: the new instance did not take the store over", tc.name)
		}
		flusher := c
		if !tc.fetchOld {
			done, flusher = fetch(c), old
		}
		flusher.Flush(flush.Flush{Scope: flush.Zones, Names: [][]byte{mustAdminName(t, "example.org.")}})
		close(release)
		<-done
		if isCached(t, c, "www.example.org.", dns.TypeA, false) {
			t.Errorf("%s: a fetch begun before the flush stored what the flush covers", tc.name)
		}
	}
}

func TestAdminStats(t *testing.T) {
	clk := newClock()
	c := newTestCache(t, adminUpstream(), clk)
	fillAdmin(t, c, []adminCase{
		{"www.example.org.", dns.TypeA, false, true},
		{"short.example.org.", dns.TypeA, false, true},
		{"nx.example.org.", dns.TypeA, false, true},
		{"www.example.org.", dns.TypeMX, false, true},
		{"fail.example.org.", dns.TypeA, false, true},
	})
	clk.advance(20 * time.Second)
	st := c.stats()
	if st.Entries != (admin.Counts{Success: 2, Denial: 3}) || st.NXDomain != 1 || st.NoData != 1 || st.ServFail != 1 ||
		st.Expired != 2 || st.Stale != 0 || st.Bytes.Success == 0 || st.Bytes.Denial == 0 || st.Held == 0 || st.Capacity != config.DefaultCapacity {
		t.Errorf("stats %+v", st)
	}
}

// TestAdminFlushAfterVariantStored: a flush of a name that begins once a
// fetch has stored an ECS variant of it, and before the fetch is over,
// takes the variant: the fetch lists the variant in the name's list, which
// the flush reads to find the variants, before a flush may begin.
func TestAdminFlushAfterVariantStored(t *testing.T) {
	for _, tc := range []struct {
		name   string
		subnet string
	}{
		{"s16.geo.", "10.1.2.0/24"},
		{"s24.geo.", "2001:db8:1:2::/64"},
	} {
		c := newGeoCache(t, "compactcache", newGeoUpstream(), newClock())
		name := mustAdminName(t, tc.name)
		var flushed admin.Counts
		c.fence.Stored = func() {
			c.fence.Stored = nil // the first store only: the variant's
			flushed = c.Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{name}, Types: []uint16{dns.TypeTXT}})
		}
		ask(t, c, geoQuery(tc.name, tc.subnet), false)
		if got := adminserver.Lookup(operator{c}, name, nil); len(got) != 0 {
			t.Errorf("%s from %s: a flush that began once the variant was stored removed %+v and left %+v", tc.name, tc.subnet, flushed, got)
		}
		if n := c.store.Usage().Variants; n != 0 {
			t.Errorf("%s from %s: %d ECS variants left after the flush", tc.name, tc.subnet, n)
		}
		checkShards(t, c.store)
	}
}
