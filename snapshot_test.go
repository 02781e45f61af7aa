package compactcache

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/persist"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSnapshotWarmRestart stops a server whose block keeps a snapshot and
// starts another from the same Corefile: the entries come back, and its
// hits reach no upstream. A damaged file is moved aside and the block
// starts cold; a file that cannot be written is logged and counted.
func TestSnapshotWarmRestart(t *testing.T) {
	logs := testenv.CaptureLog(t)
	u := exampleUpstream()
	up := startUpstream(t, u)
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.snap")
	corefile := func(path string) string {
		return `.:0 {
	bind 127.0.0.1
	compactcache {
		snapshot ` + path + `
	}
	forward . ` + up + `
}`
	}
	start := func(cf string) (*caddy.Instance, string) {
		t.Helper()
		inst, err := startCorefile(cf)
		if err != nil {
			t.Fatal(err)
		}
		return inst, inst.Servers()[0].LocalAddr().String()
	}
	stop := func(inst *caddy.Instance) {
		inst.ShutdownCallbacks() // SIGTERM's: the final shutdown writes the file
		stopServers(inst)
	}
	names := []struct {
		name  string
		qtype uint16
	}{{"a.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeA}, {"missing.example.org.", dns.TypeA}, {"a.example.org.", dns.TypeAAAA}}

	inst, addr := start(corefile(path))
	for _, n := range names {
		exchangeUDP(t, addr, test.Case{Qname: n.name, Qtype: n.qtype}.Msg())
	}
	stop(inst)
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("no snapshot written at shutdown: %v", err)
	}

	inst, addr = start(corefile(path))
	for _, n := range names {
		r, _ := exchangeUDP(t, addr, test.Case{Qname: n.name, Qtype: n.qtype}.Msg())
		if n.name == "missing.example.org." && r.Rcode != dns.RcodeNameError || n.name != "missing.example.org." && r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s after the restart: %s", n.name, dns.RcodeToString[r.Rcode])
		}
		if c := u.count(n.name, n.qtype); c != 1 {
			t.Errorf("%s %s asked upstream %d times, want once: before the restart", n.name, dns.TypeToString[n.qtype], c)
		}
	}
	if !strings.Contains(logs.String(), "4 entries loaded") {
		t.Errorf("no line of the entries loaded in the log:\n%s", logs)
	}
	stop(inst)

	// Damage the file: the next start is cold and the file moved aside.
	b, _ := os.ReadFile(path)
	b[len(b)/2]++
	os.WriteFile(path, b, 0o644)
	readErrors := testutil.ToFloat64(cachemetrics.SnapshotErrors.WithLabelValues(path, "read"))
	inst, addr = start(corefile(path))
	exchangeUDP(t, addr, test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())
	if c := u.count("a.example.org.", dns.TypeA); c != 2 {
		t.Errorf("after a damaged snapshot, a.example.org. asked upstream %d times, want 2: a cold start", c)
	}
	if got := testutil.ToFloat64(cachemetrics.SnapshotErrors.WithLabelValues(path, "read")) - readErrors; got != 1 {
		t.Errorf("%v read errors counted for a damaged file, want 1", got)
	}
	if aside, _ := filepath.Glob(path + ".bad-*"); len(aside) != 1 {
		t.Errorf("the damaged file was not moved aside: %v", aside)
	}
	stop(inst)

	// A directory that does not exist: the server starts, the write fails
	// with a line and a count.
	missing := filepath.Join(dir, "no", "such", "dir", "cache.snap")
	inst, _ = start(corefile(missing))
	stop(inst)
	if got := testutil.ToFloat64(cachemetrics.SnapshotErrors.WithLabelValues(missing, "write")); got != 1 {
		t.Errorf("%v write errors counted for a missing directory, want 1", got)
	}
	if !strings.Contains(logs.String(), "not written") {
		t.Error("no log line for the snapshot that could not be written")
	}
}

// TestWarmupFromPeer starts a second server whose block warms up from the
// first's admin endpoint: the ready plugin's check says not ready until the
// fill is done, then the names the first had cached are hits that reach no
// upstream. A peer that streams another format version is refused, and the
// block starts cold.
func TestWarmupFromPeer(t *testing.T) {
	logs := testenv.CaptureLog(t)
	u := exampleUpstream()
	up := startUpstream(t, u)
	adminAddr, peerAddr, _ := startPeer(t, up)
	names := []string{"a.example.org.", "t.example.org.", "missing.example.org."}
	for _, n := range names {
		exchangeUDP(t, peerAddr, test.Case{Qname: n, Qtype: dns.TypeA}.Msg())
	}

	inst := startInstance(t, `.:0 {
	bind 127.0.0.1
	compactcache {
		warmup http://`+adminAddr+` {
			timeout 5s
		}
	}
	forward . `+up+`
}`)
	addr := inst.Servers()[0].LocalAddr().String()
	deadline := time.Now().Add(5 * time.Second)
	for persist.Warming() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !New().Ready() {
		t.Fatal("still not ready 5 s after the start")
	}
	for _, n := range names {
		exchangeUDP(t, addr, test.Case{Qname: n, Qtype: dns.TypeA}.Msg())
		if c := u.count(n, dns.TypeA); c != 1 {
			t.Errorf("%s asked upstream %d times, want once: the warmed-up block should have it", n, c)
		}
	}
	if !strings.Contains(logs.String(), "Warm-up of") || !strings.Contains(logs.String(), "3 entries") {
		t.Errorf("no log line of the warm-up's entries:\n%s", logs)
	}

	// A peer of another format version.
	foreign := testenv.ServeBytes(t, []byte("CCSNAP\x09\x00"+strings.Repeat("\x00", 44)))
	cold := startInstance(t, `.:0 {
	bind 127.0.0.1
	compactcache {
		warmup `+foreign+`
	}
	forward . `+up+`
}`)
	coldAddr := cold.Servers()[0].LocalAddr().String()
	for deadline := time.Now().Add(5 * time.Second); persist.Warming() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	exchangeUDP(t, coldAddr, test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())
	if c := u.count("a.example.org.", dns.TypeA); c != 2 {
		t.Errorf("after a foreign stream, a.example.org. asked upstream %d times, want 2: a cold start", c)
	}
	if !strings.Contains(logs.String(), "another format version") {
		t.Errorf("no log line refusing the foreign version:\n%s", logs)
	}
}

// TestFlushDuringWarmup: an operator flushes a name on a replica while it
// warms up from a peer (compactcache-ctl --each-address during a rollout).
// The peer's stream was taken before the flush: what the flush covers must
// not be put from it after, as a fetch that began before a flush stores
// nothing the flush covers (docs/admin.md).
func TestFlushDuringWarmup(t *testing.T) {
	u := exampleUpstream()
	up := startUpstream(t, u)
	peerAdminAddr, peerAddr, own := startPeer(t, up)
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, peerAddr, req)

	// The peer's stream, served by a peer that stalls before its last bytes.
	var block string
	peerAdmin := newAdminClient(t, peerAdminAddr)
	peerAdmin.token = ""
	var blocks admin.Blocks
	peerAdmin.ok(admin.OpBlocks, nil, &blocks)
	block = blocks.Blocks[0].Name
	code, stream := peerAdmin.do("GET", admin.OpSnapshot, url.Values{admin.ParamBlock: {block}})
	if code != 200 {
		t.Fatalf("snapshot: %d", code)
	}
	asked, release := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write(stream[:len(stream)-8])
		w.(http.Flusher).Flush()
		close(asked)
		<-release
		w.Write(stream[len(stream)-8:])
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	inst := startInstance(t, `.:0 {
	bind 127.0.0.1
	compactcache {
		warmup `+slow.URL+`
		admin `+own+` {
			insecure_loopback
		}
	}
	forward . `+up+`
}`)
	t.Cleanup(func() { inst.ShutdownCallbacks() })
	select {
	case <-asked:
	case <-time.After(5 * time.Second):
		t.Fatal("the warm-up did not ask the peer")
	}
	ownAdmin := newAdminClient(t, own)
	ownAdmin.token = ""
	ownAdmin.flush(admin.OpFlush, url.Values{"name": {"a.example.org"}})
	close(release)
	for deadline := time.Now().Add(5 * time.Second); persist.Warming() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	before := u.count("a.example.org.", dns.TypeA)
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), req)
	if u.count("a.example.org.", dns.TypeA) == before {
		t.Error("a.example.org. A, flushed on the replica during its warm-up, was answered from the cache afterwards: the warm-up put it back")
	}
}

// startPeer starts a server of a block that forwards to up with an admin
// endpoint on the loopback, without a token, for replicas to warm up from,
// and returns the endpoint's address, the server's, and one more address
// whose port was free, for the replica's own endpoint.
func startPeer(t *testing.T, up string) (admin, server, spare string) {
	t.Helper()
	addrs, peer, _ := startOnFreePorts(t, 2, func(addrs []string) string {
		return `.:0 {
	bind 127.0.0.1
	compactcache {
		admin ` + addrs[0] + ` {
			insecure_loopback
		}
	}
	forward . ` + up + `
}`
	}, nil)
	t.Cleanup(func() { stopInstance(peer) })
	return addrs[0], peer.Servers()[0].LocalAddr().String(), addrs[1]
}

// TestWarmupRefusesTTLOverCaps: a peer's stream holding an entry whose TTL
// is longer than the block stores any answer for (a stream forged with the
// block's settings) is refused, as a damaged one: a fetch of the block's
// own would have capped it, and the entry would be served, and written to
// every snapshot after, for as long as its TTL says.
func TestWarmupRefusesTTLOverCaps(t *testing.T) {
	logs := testenv.CaptureLog(t)
	u := exampleUpstream()
	up := startUpstream(t, u)
	c, err := parse(caddy.NewTestController("dns", "compactcache"))
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("a.example.org.", dns.TypeA)
	m.Response, m.RecursionAvailable = true, true
	m.Answer = []dns.RR{test.A("a.example.org. 1000000000 IN A 192.0.2.66")}
	key, err := entry.KeyFor("a.example.org.", dns.TypeA, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := entry.NewBuilder().Build(m, key, "a.example.org.", uint32(time.Now().Unix()), 1000000000, 0,
		entry.FlagRA|entry.FlagAnswers|entry.FlagNoECS|entry.FlagDNSSEC, entry.MaxLen)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.Put(e, time.Now().Unix())
	var stream bytes.Buffer
	if _, err := snapshot.Write(&stream, s.Paced(0), c.fingerprint(), time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	peer := testenv.ServeBytes(t, stream.Bytes())
	inst := startInstance(t, `.:0 {
	bind 127.0.0.1
	compactcache {
		warmup `+peer+`
	}
	forward . `+up+`
}`)
	for deadline := time.Now().Add(5 * time.Second); persist.Warming() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	r, _ := exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg())
	if n := u.count("a.example.org.", dns.TypeA); n != 1 || len(r.Answer) == 0 || r.Answer[0].Header().Ttl > 3600 {
		t.Errorf("a.example.org. asked upstream %d times, answered %v: want the upstream's answer, the peer's entry refused", n, r.Answer)
	}
	if !strings.Contains(logs.String(), "starting cold") {
		t.Errorf("no log line refusing the stream:\n%s", logs)
	}
}

// TestWarmupOtherVersion: a peer of another snapshot format version (a
// rollout across builds) leaves the block cold as a peer of other settings
// does, logged, not counted as an error: every new replica of such a
// rollout would otherwise count one.
func TestWarmupOtherVersion(t *testing.T) {
	logs := testenv.CaptureLog(t)
	up := startUpstream(t, exampleUpstream())
	c, err := parse(caddy.NewTestController("dns", "compactcache"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	if _, err := snapshot.Write(&stream, s.Paced(0), c.fingerprint(), time.Now().Unix()); err != nil {
		t.Fatal(err)
	}
	b := stream.Bytes()
	b[6]++ // the header's version, after the magic
	peer := testenv.ServeBytes(t, b)
	errs := cachemetrics.SnapshotErrors.WithLabelValues(peer, "warmup")
	startInstance(t, `.:0 {
	bind 127.0.0.1
	compactcache {
		warmup `+peer+`
	}
	forward . `+up+`
}`)
	for deadline := time.Now().Add(5 * time.Second); persist.Warming() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := testutil.ToFloat64(errs); n != 0 || !strings.Contains(logs.String(), "format differ, starting cold") {
		t.Errorf("a peer of another version: %v warm-up errors counted, want 0 and a log line saying so:\n%s", n, logs)
	}
}

// TestSnapshotSharedFlushWhileDown restarts a server whose block keeps a
// snapshot and shares a tier: a flush another replica sent through the
// tier while it was down holds, and the rest of the file is served.
func TestSnapshotSharedFlushWhileDown(t *testing.T) {
	r := testenv.StartRedis(t)
	u := exampleUpstream()
	up := startUpstream(t, u)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shared := "shared redis://" + r.Addr + " {\n secret_file " + secret + "\n timeout 1s\n }\n"
	corefile := ".:0 {\n bind 127.0.0.1\n compactcache {\n " + shared + " snapshot " + filepath.Join(dir, "cache.snap") + "\n }\n forward . " + up + "\n}"
	a, www := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg(), test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()

	inst, err := startCorefile(corefile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*dns.Msg{a, www} {
		exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), m)
	}
	inst.ShutdownCallbacks() // SIGTERM's: the final shutdown writes the file
	stopServers(inst)

	// Another replica flushes a name while the server is down.
	u.add("a.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("a.example.org. 300 IN A 192.0.2.99")}, nil, nil)
	other := parseCache(t, "compactcache {\n "+shared+"}", newUpstream(), &clock{t: time.Now()})
	other.StartShared("")
	t.Cleanup(other.StopShared)
	for deadline := time.Now().Add(10 * time.Second); !other.shared.Connected(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tier did not connect")
		}
	}
	if _, err := (operator{other}).Flush(flush.Flush{Scope: flush.Names, Names: [][]byte{mustAdminName(t, "a.example.org")}}); err != nil {
		t.Fatal(err)
	}

	inst, err = startCorefile(corefile)
	if err != nil {
		t.Fatal(err)
	}
	defer stopServers(inst)
	addr := inst.Servers()[0].LocalAddr().String()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		m, _ := exchangeUDP(t, addr, a)
		if len(m.Answer) == 1 && strings.HasSuffix(m.Answer[0].String(), "192.0.2.99") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted server answers %v, flushed while it was down", m.Answer)
		}
	}
	exchangeUDP(t, addr, www)
	if n := u.count("www.example.org.", dns.TypeA); n != 1 {
		t.Errorf("www.example.org. asked upstream %d times, want once: before the restart", n)
	}
}
