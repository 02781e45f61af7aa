package compactcache

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestReloadKeepsTheCache reloads a running CoreDNS with changed Corefiles:
// a change that leaves the store's shape and what it holds keeps the
// entries; one that changes the budget, a TTL cap or what is disabled starts
// a new store.
func TestReloadKeepsTheCache(t *testing.T) {
	u := exampleUpstream()
	up := startUpstream(t, u)
	block := func(options string) string {
		return `.:0 {
	bind 127.0.0.1
	` + options + `
	forward . ` + up + `
}`
	}
	inst, err := startCorefile(block("compactcache"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	addr := inst.Servers()[0].LocalAddr().String()
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, addr, req)

	for _, step := range []struct {
		corefile string
		queries  int // upstream queries for the name after the reload's query
	}{
		{block("errors\n\tcompactcache"), 1},                                // another plugin: the same store
		{block("errors\n\tcompactcache {\n\t\tprefetch 5\n\t}"), 1},         // prefetch: the same store
		{block("errors\n\tcompactcache 600 {\n\t\tprefetch 5\n\t}"), 2},     // TTL cap: what is stored changes
		{block("errors\n\tcompactcache 600 {\n\t\tcapacity 32MiB\n\t}"), 3}, // budget: the store's shape changes
		// disable: nothing kept that it disables, and the answer no longer stored
		{block("errors\n\tcompactcache 600 {\n\t\tcapacity 32MiB\n\t\tdisable success\n\t}"), 4},
	} {
		serverMu.Lock()
		inst, err = inst.Restart(corefileInput(step.corefile))
		serverMu.Unlock()
		if err != nil {
			t.Fatalf("reload:\n%s\n%v", step.corefile, err)
		}
		addr = inst.Servers()[0].LocalAddr().String()
		if r, _ := exchangeUDP(t, addr, req); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("after reload:\n%s\nreply %v", step.corefile, r)
		}
		if n := u.count("a.example.org.", dns.TypeA); n != step.queries {
			t.Fatalf("after reload:\n%s\nupstream asked %d times, want %d", step.corefile, n, step.queries)
		}
	}
}

// TestReloadKeepsEachBlocksCache: blocks that bind other addresses, and the
// blocks of two views of one address, share their keys; a reload hands each
// its own store, and no client gets another block's answer (split horizon).
func TestReloadKeepsEachBlocksCache(t *testing.T) {
	const name = "v.example.org."
	type side struct{ block, from, to string } // a block's own line, a client's address, the server's
	for _, tc := range []struct {
		name  string
		sides [2]side
	}{
		{"views", [2]side{
			{"view one {\n\t\texpr client_ip() == '127.0.0.1'\n\t}\n\tbind 127.0.0.1", "127.0.0.1", "127.0.0.1"},
			{"view two {\n\t\texpr client_ip() == '127.0.0.2'\n\t}\n\tbind 127.0.0.1", "127.0.0.2", "127.0.0.1"},
		}},
		{"binds", [2]side{
			{"bind 127.0.0.1", "127.0.0.1", "127.0.0.1"},
			{"bind ::1", "::1", "::1"},
		}},
	} {
		var ups [2]*upstream
		var upAddrs [2]string
		for i := range tc.sides {
			ups[i] = newUpstream()
			ups[i].add(name, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(fmt.Sprintf("%s 300 IN A 192.0.2.%d", name, i+1))}, nil, nil)
			upAddrs[i] = startUpstream(t, ups[i])
		}
		var port string // the servers', as the Corefile started names it
		_, inst, corefile := startOnFreePorts(t, 1, func(addrs []string) string {
			_, port, _ = net.SplitHostPort(addrs[0])
			corefile := ""
			for i, sd := range tc.sides {
				corefile += ".:" + port + " {\n\t" + sd.block + "\n\tcompactcache\n\tforward . " + upAddrs[i] + "\n}\n"
			}
			return corefile
		}, nil)
		for round := range 2 {
			for i, sd := range tc.sides {
				c := &dns.Client{Net: "udp", Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(sd.from)}}}
				r, _, err := c.Exchange(test.Case{Qname: name, Qtype: dns.TypeA}.Msg(), net.JoinHostPort(sd.to, port))
				if err != nil {
					t.Fatalf("%s, round %d, from %s: %v", tc.name, round, sd.from, err)
				}
				if want := fmt.Sprintf("192.0.2.%d", i+1); len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != want {
					t.Errorf("%s, round %d, from %s: %v, want %s, its block's", tc.name, round, sd.from, r.Answer, want)
				}
				if n := ups[i].count(name, dns.TypeA); n != 1 {
					t.Errorf("%s, round %d, from %s: its block's upstream asked %d times, want once: the cache kept", tc.name, round, sd.from, n)
				}
			}
			serverMu.Lock()
			next, err := inst.Restart(corefileInput(corefile))
			serverMu.Unlock()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			inst = next
		}
		stopInstance(inst)
	}
}

// TestReloadContents: what changes the replies a store holds, or their keys,
// keeps a reload from handing the store over; what is read at hit time does
// not.
func TestReloadContents(t *testing.T) {
	base := mustParse(t, "compactcache").contents()
	for _, tc := range []struct {
		option string
		same   bool
	}{
		{"compactcache 600", false},
		{"compactcache {\n success 0 600\n}", false},
		{"compactcache {\n success 0 3600 60\n}", false},
		{"compactcache {\n denial 0 600\n}", false},
		{"compactcache {\n denial 0 1800 60\n}", false},
		{"compactcache {\n servfail 1s\n}", false},
		{"compactcache {\n disable success example.org\n}", false},
		{"compactcache {\n disable denial example.org\n}", false},
		{"compactcache {\n ecs 16\n}", false},
		{"compactcache {\n ecs 24 48 {\n  max_variants 5\n }\n}", false},
		{"compactcache {\n serve_stale\n serve_stale_policy prefer_positive\n}", false},
		{"compactcache {\n prefetch 5 1m 20%\n}", true},
		{"compactcache {\n keepttl\n}", true},
		{"compactcache {\n serve_stale 1h verify 1s\n}", true},
		{"compactcache example.org", true}, // zones: TestReloadZones
	} {
		if same := mustParse(t, tc.option).contents() == base; same != tc.same {
			t.Errorf("%q: contents the same as the default's: %v, want %v", tc.option, same, tc.same)
		}
	}
}

// TestReloadZones: a reload that widens the block's zones, or keeps them,
// hands the store over; one that narrows them starts empty. The entries of
// the zones it drops would sit in the store unserved, and no flush that
// follows the block's zones (the kubernetes option's) would reach them: a
// later reload that widened the zones again would serve them unflushed.
func TestReloadZones(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		kept     bool
	}{
		{"compactcache", "compactcache", true},
		{"compactcache example.org", "compactcache", true},
		{"compactcache example.org", "compactcache org example.net", true},
		{"compactcache a.example.org b.example.org", "compactcache example.org", true},
		{"compactcache", "compactcache example.org", false},
		{"compactcache example.org example.net", "compactcache example.org", false},
		{"compactcache example.org", "compactcache a.example.org", false},
	} {
		const block = "TestReloadZones"
		old, c := mustParse(t, tc.from), mustParse(t, tc.to)
		old.offer(block)
		if kept := c.takeOver(block); kept != tc.kept {
			t.Errorf("%q to %q: store handed over: %v, want %v", tc.from, tc.to, kept, tc.kept)
		}
		withdraw(block, old.store)
	}
}

// TestReloadWhileServing restarts a serving CoreDNS while clients keep
// asking the old and new instances: every other restart changes the budget,
// so the old store is dropped while requests may still be inside it, and
// the others hand the store over. GC cycles run throughout, so that a store
// released too early would fault under a request (run it also with -race,
// which checks the locking on heap arenas).
func TestReloadWhileServing(t *testing.T) {
	u := exampleUpstream()
	up := startUpstream(t, u)
	block := func(capacity int) string {
		return fmt.Sprintf(".:0 {\n\tbind 127.0.0.1\n\tcompactcache {\n\t\tcapacity %dMiB\n\t}\n\tforward . %s\n}", capacity, up)
	}
	inst, err := startCorefile(block(16))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	var addr atomic.Value
	addr.Store(inst.Servers()[0].LocalAddr().String())

	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg      sync.WaitGroup
		answers atomic.Int64
		wrong   atomic.Value
	)
	cases := []struct {
		req     *dns.Msg
		rcode   int
		answers int
	}{
		{test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), dns.RcodeSuccess, 2},
		{test.Case{Qname: "t.example.org.", Qtype: dns.TypeTXT}.Msg(), dns.RcodeSuccess, 1},
		{test.Case{Qname: "missing.example.org.", Qtype: dns.TypeA}.Msg(), dns.RcodeNameError, 0},
	}
	for g := range 4 {
		wg.Go(func() {
			c := &dns.Client{Timeout: time.Second}
			for i := g; ctx.Err() == nil; i++ {
				tc := cases[i%len(cases)]
				r, _, err := c.Exchange(tc.req.Copy(), addr.Load().(string))
				if err != nil {
					continue // an instance stopping mid-exchange
				}
				if r.Rcode != tc.rcode || len(r.Answer) != tc.answers {
					wrong.Store(fmt.Sprintf("%s: %v", tc.req.Question[0].Name, r))
				}
				answers.Add(1)
			}
		})
	}
	for i := range 10 {
		time.Sleep(50 * time.Millisecond)
		capacity := 16 << (i / 2 % 2) // 32, 32, 16, 16, ...: changes every other time
		serverMu.Lock()
		inst, err = inst.Restart(corefileInput(block(capacity)))
		serverMu.Unlock()
		if err != nil {
			cancel()
			wg.Wait()
			t.Fatal(err)
		}
		addr.Store(inst.Servers()[0].LocalAddr().String())
		runtime.GC()
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	wg.Wait()
	if w := wrong.Load(); w != nil {
		t.Fatalf("wrong reply: %v", w)
	}
	if answers.Load() < 100 {
		t.Fatalf("%d answers over the reloads; the servers did not serve", answers.Load())
	}
}

// onTakenPort returns a server block on a port another socket holds: a
// start or reload with it fails in caddy's start of the servers, after
// every block's startup ran.
func onTakenPort(t *testing.T) string {
	t.Helper()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })
	_, port, _ := net.SplitHostPort(taken.Addr().String())
	return ".:" + port + " {\n\tbind 127.0.0.1\n\twhoami\n}\n"
}

// failReload reloads inst with corefile, which must fail, and returns the
// instance that serves on: inst, or the one a reload that did not fail
// made, for the test's cleanup to stop.
func failReload(t *testing.T, inst *caddy.Instance, corefile string) *caddy.Instance {
	t.Helper()
	serverMu.Lock()
	next, err := inst.Restart(corefileInput(corefile))
	serverMu.Unlock()
	if err == nil {
		t.Errorf("the reload to\n%s\nsucceeded", corefile)
		return next
	}
	return inst
}

// TestFailedReloadWritesNoSnapshot: a reload that fails leaves the running
// instance serving, and the failed instance, which never starts nor shuts
// down, must not write its own store every INTERVAL over the running
// block's file. It fails in compactcache's startup (cache beside it) or in
// the server's (a block on a port another process holds), after a change
// that makes a new, empty store.
func TestFailedReloadWritesNoSnapshot(t *testing.T) {
	for _, tc := range []struct{ name, block, more string }{
		{"cache beside it", "cache\n\tcompactcache", ""},
		{"port taken", "compactcache 600", onTakenPort(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := testenv.CaptureLog(t)
			up := startUpstream(t, exampleUpstream())
			path := filepath.Join(t.TempDir(), "cache.snap")
			corefile := func(plugins string) string {
				return ".:0 {\n\tbind 127.0.0.1\n\t" + plugins + " {\n\t\tsnapshot " + path + " 1s\n\t}\n\tforward . " + up + "\n}\n"
			}
			inst, err := startCorefile(corefile("compactcache"))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { stopInstance(inst) }()
			exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())

			inst = failReload(t, inst, corefile(tc.block)+tc.more)
			written := regexp.MustCompile(`Snapshot ` + regexp.QuoteMeta(path) + `: (\d+) entries written`)
			// Three ticks of the running block's writer: the failed one's,
			// if it ran, would tick as often.
			for deadline := time.Now().Add(5 * time.Second); len(written.FindAllString(logs.String(), -1)) < 3; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no three writes in 5 s:\n%s", logs)
				}
			}
			for _, m := range written.FindAllStringSubmatch(logs.String(), -1) {
				if m[1] != "1" {
					t.Errorf("after the failed reload, %s: the running block holds one entry", m[0])
				}
			}
		})
	}
}

// TestFailedReloadClosesSharedTier: a reload that fails after the new
// instance's blocks started (a block on a port another process holds)
// leaves that instance neither started nor shut down; the connections its
// shared tier opened must close, or each failed reload would leave a
// client of the Redis server behind for good.
func TestFailedReloadClosesSharedTier(t *testing.T) {
	r := testenv.StartRedis(t)
	corefile := func(ttl string) string {
		return ".:0 {\n\tbind 127.0.0.1\n\tcompactcache " + ttl + " {\n\t\tshared redis://" + r.Addr + "\n\t}\n\twhoami\n}\n"
	}
	clients := func() int { return strings.Count(r.MustDo("CLIENT", "LIST"), "\n") - 1 } // less the one asking
	settled := func(want int) int {
		got := clients()
		for deadline := time.Now().Add(5 * time.Second); got != want && time.Now().Before(deadline); got = clients() {
			time.Sleep(20 * time.Millisecond)
		}
		return got
	}
	inst, err := startCorefile(corefile(""))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	for deadline := time.Now().Add(5 * time.Second); clients() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tier did not connect")
		}
	}
	time.Sleep(200 * time.Millisecond) // every connection the tier keeps
	running := clients()

	inst = failReload(t, inst, corefile("600")+onTakenPort(t))
	time.Sleep(500 * time.Millisecond) // time for a tier left running to connect
	if got := settled(running); got != running {
		t.Errorf("after a failed reload, the Redis server has %d clients, want the running block's %d", got, running)
	}
}

// TestReloadDoesNotWaitForRefreshes: a reload starts the new instance while
// a background refresh of the old one is still held by its upstream (one
// that does not answer, before forward's read timeout); only the process's
// stop waits for them.
func TestReloadDoesNotWaitForRefreshes(t *testing.T) {
	u := newUpstream()
	u.add("s.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("s.example.org. 1 IN A 192.0.2.1")}, nil, nil)
	up := startUpstream(t, u)
	corefile := `.:0 {
	bind 127.0.0.1
	compactcache {
		success 9984 3600 0
		serve_stale 1h
	}
	forward . ` + up + ` {
		read_timeout 1h
	}
}`
	wait := stopWait
	stopWait = time.Hour // longer than the test may take
	defer func() { stopWait = wait }()
	inst, err := startCorefile(corefile)
	if err != nil {
		t.Fatal(err)
	}
	req := test.Case{Qname: "s.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), req)
	time.Sleep(1100 * time.Millisecond) // the answer's TTL: stale after
	asked, release := u.hold("s.example.org. 1 IN A 192.0.2.1")
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer func() { unhold(); stopInstance(inst) }()
	if r, _ := exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), req); len(r.Answer) != 1 {
		t.Fatalf("the stale answer: %v", r)
	}
	<-asked // the refresh waits on the upstream

	type result struct {
		next *caddy.Instance
		err  error
	}
	reloaded := make(chan result, 1)
	go func() {
		serverMu.Lock()
		defer serverMu.Unlock()
		next, err := inst.Restart(corefileInput(corefile))
		reloaded <- result{next, err}
	}()
	var r result
	select {
	case r = <-reloaded:
	case <-time.After(time.Minute):
		unhold()
		r = <-reloaded
		t.Error("the reload waited for a refresh held by the upstream")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	inst = r.next
}
