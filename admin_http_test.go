package compactcache

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// These tests reach the admin endpoint of a CoreDNS started from a Corefile
// with a real HTTP client, over the loopback.

const adminToken = "0123456789abcdef-test-token"

// adminTokenFile writes the token to a file and returns its path.
func adminTokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// adminCorefile is a block on 127.0.0.1 in front of up, whose compactcache
// opens the admin endpoint on addr with settings (the admin block's lines).
func adminCorefile(up, addr, settings string) string {
	return `.:0 {
	bind 127.0.0.1
	compactcache {
		admin ` + addr + ` {
			` + settings + `
		}
	}
	forward . ` + up + `
}
`
}

// startAdminInstance starts CoreDNS from corefile and returns the
// instance; when the test ends it stops and its shutdown callbacks run, as
// caddy runs them on a signal, which take the blocks off the listener.
func startAdminInstance(t *testing.T, corefile string) *caddy.Instance {
	t.Helper()
	inst := startInstance(t, corefile)
	t.Cleanup(func() { inst.ShutdownCallbacks() })
	return inst
}

// adminClient asks the admin endpoint at addr.
type adminClient struct {
	t      *testing.T
	addr   string
	token  string
	header map[string]string // more headers, for the requests a browser sends
	http   *testenv.Client
}

func newAdminClient(t *testing.T, addr string) *adminClient {
	return &adminClient{t: t, addr: addr, token: adminToken, http: testenv.NewClient(t)}
}

// do asks op with params and returns the status and body.
func (a *adminClient) do(method, op string, params url.Values) (int, []byte) {
	a.t.Helper()
	header := maps.Clone(a.header)
	if a.token != "" {
		header = map[string]string{"Authorization": "Bearer " + a.token}
		maps.Copy(header, a.header)
	}
	return a.http.Do(method, "http://"+a.addr+admin.Prefix+op+"?"+params.Encode(), header)
}

// ok asks op and decodes its JSON reply into v, failing unless it is 200.
func (a *adminClient) ok(op string, params url.Values, v any) {
	a.t.Helper()
	code, body := a.do(admin.Specs[op].Method, op, params)
	if code != 200 {
		a.t.Fatalf("%s %v: %d %s", op, params, code, body)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			a.t.Fatalf("%s: %v\n%s", op, err, body)
		}
	}
}

// flush runs a flush and returns what it removed from the one block.
func (a *adminClient) flush(op string, params url.Values) admin.Counts {
	a.t.Helper()
	var r admin.FlushReply
	a.ok(op, params, &r)
	if len(r.Blocks) != 1 || r.Op != op {
		a.t.Fatalf("%s: reply %+v, want one block", op, r)
	}
	return r.Blocks[0].Removed
}

func adminAddr(t *testing.T) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
}

func TestAdminHTTP(t *testing.T) {
	u := adminUpstream()
	up := startUpstream(t, u)
	addr := adminAddr(t)
	inst := startAdminInstance(t, adminCorefile(up, addr, "token_file "+adminTokenFile(t)))
	dnsAddr := inst.Servers()[0].LocalAddr().String()
	query := func(name string, qtype uint16) {
		t.Helper()
		exchangeUDP(t, dnsAddr, test.Case{Qname: name, Qtype: qtype}.Msg())
	}
	a := newAdminClient(t, addr)
	// The request counters are the process's metrics, which earlier runs of
	// the test (-count) added to: what this one adds is checked.
	var before admin.StatsReply
	a.ok(admin.OpStats, nil, &before)
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"www.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeAAAA}, {"nx.example.org.", dns.TypeA}, {"www.example.net.", dns.TypeA}, {"www.example.net.", dns.TypeA}} {
		query(q.name, q.qtype)
	}
	const block = "dns://.:0 (bind 127.0.0.1)"
	logged := testenv.CaptureLog(t)

	var blocks admin.Blocks
	a.ok(admin.OpBlocks, nil, &blocks)
	if len(blocks.Blocks) != 1 || blocks.Blocks[0].Name != block || strings.Join(blocks.Blocks[0].Zones, " ") != "." || strings.Join(blocks.Blocks[0].Listen, " ") != "dns://127.0.0.1:0" {
		t.Fatalf("blocks %+v", blocks)
	}

	var found admin.LookupReply
	a.ok(admin.OpLookup, url.Values{"name": {"WWW.example.org"}}, &found)
	if len(found.Blocks) != 1 || found.Blocks[0].Block != block || len(found.Blocks[0].Entries) != 2 {
		t.Fatalf("lookup www.example.org: %+v", found)
	}
	a.ok(admin.OpLookup, url.Values{"name": {"www.example.org"}, "type": {"aaaa"}, "block": {block}}, &found)
	if e := found.Blocks[0].Entries; len(e) != 1 || e[0].Type != "AAAA" || len(e[0].Answer) != 1 {
		t.Fatalf("lookup www.example.org AAAA: %+v", found)
	}

	var stats admin.StatsReply
	a.ok(admin.OpStats, nil, &stats)
	if s, b := stats.Blocks[0], before.Blocks[0]; s.Entries.Success != 3 || s.Entries.Denial != 1 || s.NXDomain != 1 || s.Requests-b.Requests != 5 || s.Hits-b.Hits != 1 || s.HitRatio != float64(s.Hits)/float64(s.Requests) || s.Capacity != config.DefaultCapacity {
		t.Errorf("stats %+v, before the queries %+v", s, b)
	}

	// The dump, as text and JSON lines.
	code, text := a.do("GET", admin.OpDump, nil)
	if code != 200 || !bytes.HasPrefix(text, []byte("; block "+block+"\n")) ||
		!bytes.Contains(text, []byte("\nwww.example.net.\t")) || !bytes.Contains(text, []byte("; nx.example.org. IN A flags=- ecs=- match=- rcode=NXDOMAIN kind=denial")) {
		t.Errorf("dump: %d\n%s", code, text)
	}
	if zp := dns.NewZoneParser(bytes.NewReader(text), "", ""); zp != nil {
		n := 0
		for _, ok := zp.Next(); ok; _, ok = zp.Next() {
			n++
		}
		if zp.Err() != nil || n != 4 { // three answers and the NXDOMAIN's SOA
			t.Errorf("the text dump as a zone file: %d records, %v", n, zp.Err())
		}
	}
	code, lines := a.do("GET", admin.OpDump, url.Values{"format": {"json"}})
	sc := bufio.NewScanner(bytes.NewReader(lines))
	n := 0
	for sc.Scan() {
		var e admin.Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Block != block || e.Name == "" {
			t.Errorf("dump json line %q: %v", sc.Text(), err)
		}
		n++
	}
	if code != 200 || n != 4 {
		t.Errorf("dump json: %d, %d lines, want 4:\n%s", code, n, lines)
	}

	// Flushes, each seen by the next query.
	if got := a.flush(admin.OpFlush, url.Values{"name": {"www.example.org."}}); got != (admin.Counts{Success: 2}) {
		t.Errorf("flush removed %+v", got)
	}
	if want := "admin: flush www.example.org. in " + block + " by 127.0.0.1:"; !strings.Contains(logged.String(), want) ||
		!strings.Contains(logged.String(), " (Go-http-client/1.1): removed 2 entries (2 success, 0 denial, 0 ECS lists) in ") {
		t.Errorf("the flush's log line, want %q ... removed 2 entries:\n%s", want, logged)
	}
	a.flush(admin.OpFlush, url.Values{"name": {"forged\n[INFO] line.example."}})
	if !strings.Contains(logged.String(), `admin: flush forged\010[info]\ line.example. in `) {
		t.Errorf("a name with a newline logged as is:\n%s", logged)
	}
	query("www.example.org.", dns.TypeA)
	if n := u.count("www.example.org.", dns.TypeA); n != 2 {
		t.Errorf("after the flush the upstream was asked %d times, want 2", n)
	}
	if got := a.flush(admin.OpFlushType, url.Values{"name": {"www.example.org."}, "type": {"A"}}); got != (admin.Counts{Success: 1}) {
		t.Errorf("flush_type removed %+v", got)
	}
	if got := a.flush(admin.OpFlushNegative, nil); got != (admin.Counts{Denial: 1}) {
		t.Errorf("flush_negative removed %+v", got)
	}
	if got := a.flush(admin.OpFlushExpired, nil); got != (admin.Counts{}) {
		t.Errorf("flush_expired removed %+v", got)
	}
	if got := a.flush(admin.OpFlushZone, url.Values{"zone": {"net"}}); got != (admin.Counts{Success: 1}) {
		t.Errorf("flush_zone removed %+v", got)
	}
	query("www.example.org.", dns.TypeA)
	if got := a.flush(admin.OpFlushAll, nil); got != (admin.Counts{Success: 1}) {
		t.Errorf("flush_all removed %+v", got)
	}
}

// TestAdminHTTPRefuses: malformed requests get 400 naming the field, an
// unknown block 404, a missing or wrong token 401 (counted).
func TestAdminHTTPRefuses(t *testing.T) {
	up := startUpstream(t, adminUpstream())
	addr := adminAddr(t)
	inst := startAdminInstance(t, adminCorefile(up, addr, "token_file "+adminTokenFile(t)))
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg())
	a := newAdminClient(t, addr)
	for _, tc := range []struct {
		method, op string
		params     url.Values
		code       int
		field      string
		says       string
	}{
		{"POST", admin.OpFlush, url.Values{"name": {"a..b"}}, 400, "name", `name: "a..b" is not a domain name`},
		{"POST", admin.OpFlush, nil, 400, "name", "name: missing"},
		{"POST", admin.OpFlush, url.Values{"name": {"a", "b"}}, 400, "name", "name: given 2 times"},
		{"POST", admin.OpFlushType, url.Values{"name": {"a."}, "type": {"AX"}}, 400, "type", `type: "AX" is not a DNS type`},
		{"POST", admin.OpFlushZone, url.Values{"zone": {strings.Repeat("x", 64)}}, 400, "zone", "zone: "},
		{"POST", admin.OpFlushZone, url.Values{"zone": {`bücher\`}}, 400, "zone", `zone: "bücher\\" is not a domain name`},
		{"POST", admin.OpFlush, url.Values{"name": {`www\256example.org`}}, 400, "name", `the escape \256 is above \255`},
		{"GET", admin.OpLookup, url.Values{"name": {`www\999.example.org`}}, 400, "name", `the escape \999 is above \255`},
		{"GET", admin.OpDump, url.Values{"format": {"xml"}}, 400, "format", `format: "xml" is not text or json`},
		{"GET", admin.OpLookup, url.Values{"name": {"a."}, "type": {""}}, 400, "type", `type: "" is not a DNS type`},
		{"GET", admin.OpStats, url.Values{"name": {"a."}}, 400, "name", `stats takes no parameter "name"`},
		{"POST", admin.OpFlushAll, url.Values{"block": {"nope"}}, 404, "block", `block: no block "nope"; the blocks are "dns://.:0 (bind 127.0.0.1)"`},
		{"GET", admin.OpFlushAll, nil, 405, "", "flush_all takes POST"},
		{"POST", "flush_everything", nil, 404, "", `no operation "/v1/flush_everything"`},
		{"POST", "flush_all/", nil, 404, "", `no operation "/v1/flush_all/"`},
		{"GET", "Stats", nil, 404, "", `no operation "/v1/Stats"`},
	} {
		code, body := a.do(tc.method, tc.op, tc.params)
		var e admin.Error
		json.Unmarshal(body, &e)
		if code != tc.code || e.Field != tc.field || !strings.Contains(e.Error, tc.says) {
			t.Errorf("%s %s %v: %d %s, want %d naming %q and saying %q", tc.method, tc.op, tc.params, code, body, tc.code, tc.field, tc.says)
		}
	}

	// None of the refused requests flushed: the entry asked before is held.
	var found admin.LookupReply
	a.ok(admin.OpLookup, url.Values{"name": {"www.example.org."}}, &found)
	if len(found.Blocks) != 1 || len(found.Blocks[0].Entries) != 1 {
		t.Errorf("after the refused requests, lookup www.example.org.: %+v, want its entry", found)
	}

	unauthorized := func(reason string) float64 {
		return seriesValue(t, "coredns_compactcache_admin_unauthorized_total", map[string]string{"reason": reason})
	}
	refusals := func() float64 {
		return seriesValue(t, "coredns_compactcache_admin_requests_total", map[string]string{"op": admin.OpFlushAll, "code": "401"})
	}
	missing, wrong, refused := unauthorized("missing"), unauthorized("wrong"), refusals()
	for _, token := range []string{"", adminToken + "x", adminToken[1:]} {
		a.token = token
		if code, body := a.do("POST", admin.OpFlushAll, nil); code != 401 {
			t.Errorf("token %q: %d %s, want 401", token, code, body)
		}
	}
	if m, w := unauthorized("missing")-missing, unauthorized("wrong")-wrong; m != 1 || w != 2 {
		t.Errorf("counted %v missing and %v wrong tokens, want 1 and 2", m, w)
	}
	if n := refusals() - refused; n != 3 {
		t.Errorf("admin_requests_total{op=flush_all,code=401} rose by %v, want 3", n)
	}
	// The scheme in any case (RFC 9110 11.1), as curl and others send it.
	a.token, a.header = "", map[string]string{"Authorization": "bearer " + adminToken}
	if code, body := a.do("GET", admin.OpStats, nil); code != 200 {
		t.Errorf("Authorization: bearer TOKEN: %d %s, want 200", code, body)
	}
}

// TestAdminTokenRotates: a new token in the file takes effect without a
// reload.
func TestAdminTokenRotates(t *testing.T) {
	up := startUpstream(t, adminUpstream())
	addr, file := adminAddr(t), adminTokenFile(t)
	startAdminInstance(t, adminCorefile(up, addr, "token_file "+file))
	a := newAdminClient(t, addr)
	a.ok(admin.OpStats, nil, nil)
	const next = "the-next-token-0123456789"
	if err := os.WriteFile(file, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _ := a.do("GET", admin.OpStats, nil); code != 401 {
		t.Errorf("the old token after the rotation: %d, want 401", code)
	}
	a.token = next
	a.ok(admin.OpStats, nil, nil)
}

func TestAdminInsecureLoopback(t *testing.T) {
	up := startUpstream(t, adminUpstream())
	addr := adminAddr(t)
	startAdminInstance(t, adminCorefile(up, addr, "insecure_loopback"))
	a := newAdminClient(t, addr)
	a.token = ""
	a.ok(admin.OpFlushAll, nil, nil)
	// A browser's request: a web page may post to the loopback.
	a.header = map[string]string{"Origin": "http://attacker.example"}
	if code, _ := a.do("POST", admin.OpFlushAll, nil); code != 403 {
		t.Errorf("a request with Origin: %d, want 403", code)
	}
	// A name rebound to the loopback.
	a.header = map[string]string{"Host": "rebound.attacker.example"}
	if code, _ := a.do("GET", admin.OpDump, nil); code != 403 {
		t.Errorf("a request for Host rebound.attacker.example: %d, want 403", code)
	}
}

func TestAdminSetupErrors(t *testing.T) {
	file := adminTokenFile(t)
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	lines := filepath.Join(t.TempDir(), "lines")
	os.WriteFile(lines, []byte("first-line-0123456789\nsecond-line-0123456789\n"), 0o600)
	for _, tc := range []struct{ options, says string }{
		{"admin 127.0.0.1:9", "admin: 127.0.0.1:9 needs token_file PATH (a bearer token), or insecure_loopback on a loopback address"},
		{"admin 127.0.0.1:9 {\n token_file /nonexistent/token\n}", "admin: token_file: stat /nonexistent/token: no such file or directory"},
		{"admin 127.0.0.1:9 {\n token_file " + short + "\n}", "holds 3 bytes of token, want at least 16"},
		{"admin 127.0.0.1:9 {\n token_file " + lines + "\n}", lines + ": the token holds a line break or another control byte, which an Authorization header cannot carry"},
		{"admin 0.0.0.0:9 {\n insecure_loopback\n}", `admin: insecure_loopback on "0.0.0.0:9", which is not a loopback address: give a token_file`},
		{"admin :9 {\n insecure_loopback\n}", "which is not a loopback address"},
		{"admin 127.0.0.1:9 {\n insecure_loopback\n token_file " + file + "\n}", "admin: token_file and insecure_loopback: give one"},
		{"admin localhost {\n insecure_loopback\n}", `admin: ADDRESS "localhost" is not HOST:PORT`},
		{"admin 127.0.0.1:x {\n insecure_loopback\n}", `port "x" is not a number`},
		{"admin 127.0.0.1:9 {\n insecure\n}", `admin: unknown option "insecure"`},
		{"admin 127.0.0.1:9 {\n insecure_loopback\n}\nadmin 127.0.0.1:9 {\n insecure_loopback\n}", "admin: can only be given once"},
	} {
		ctrl := caddy.NewTestController("dns", "compactcache {\n"+tc.options+"\n}")
		ctrl.ServerBlockKeys = []string{"."}
		_, err := parse(ctrl)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: %v, want an error saying %q", tc.options, err, tc.says)
		}
	}

	// Two blocks that disagree.
	up := startUpstream(t, adminUpstream())
	addr := adminAddr(t)
	two := adminCorefile(up, addr, "token_file "+file) + strings.Replace(adminCorefile(up, addr, "insecure_loopback"), ".:0", "example.org:0", 1)
	if err := startError(two); err == nil || !strings.Contains(err.Error(), `admin: block "dns://example.org.:0" says `+addr+` { insecure_loopback }, block "dns://.:0" said `+addr+` { token_file `+file+` }: the listener is one per process, every block that configures it must agree`) {
		t.Errorf("two blocks that disagree: %v", err)
	}
	// An address taken.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := startError(adminCorefile(up, addr, "token_file "+file)); err == nil || !strings.Contains(err.Error(), "admin: listen tcp "+addr) {
		t.Errorf("admin on an address taken: %v", err)
	}
}

// TestAdminSurvivesReload: the listener stays open through a reload (a
// connection opened before serves after), reaches the new instance's
// store, closes when a reload drops it, and a reload that fails leaves the
// old one as it was.
func TestAdminSurvivesReload(t *testing.T) {
	u := adminUpstream()
	up := startUpstream(t, u)
	addr, file := adminAddr(t), adminTokenFile(t)
	corefile := adminCorefile(up, addr, "token_file "+file)
	inst := startAdminInstance(t, corefile)
	a := newAdminClient(t, addr)
	a.ok(admin.OpStats, nil, nil)

	restart := func(corefile string) error {
		serverMu.Lock()
		defer serverMu.Unlock()
		next, err := inst.Restart(corefileInput(corefile))
		inst = next
		return err
	}
	if err := restart(strings.Replace(corefile, "compactcache {", "errors\n\tcompactcache {", 1)); err != nil {
		t.Fatal(err)
	}
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg())
	if got := a.flush(admin.OpFlush, url.Values{"name": {"www.example.org."}}); got.Success != 1 {
		t.Errorf("after the reload the flush removed %+v, want the entry the new instance stored", got)
	}
	if n := a.http.Dials(); n != 1 {
		t.Errorf("%d connections, want the one opened before the reload", n)
	}

	// A reload that fails once the new instance's blocks registered: the
	// second block's port is taken.
	taken, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := strconv.Itoa(taken.LocalAddr().(*net.UDPAddr).Port)
	other := adminAddr(t)
	failing := adminCorefile(up, other, "token_file "+file) + "example.org:" + port + " {\n\tbind 127.0.0.1\n\tcompactcache\n\tforward . " + up + "\n}\n"
	if err := restart(failing); err == nil {
		t.Fatal("the reload onto a port taken did not fail")
	}
	if c, err := net.Dial("tcp", other); err == nil {
		c.Close()
		t.Errorf("the failed reload's admin listener on %s is open", other)
	}
	a.ok(admin.OpStats, nil, nil)
	var blocks admin.Blocks
	a.ok(admin.OpBlocks, nil, &blocks)
	if len(blocks.Blocks) != 1 {
		t.Errorf("after the failed reload: blocks %+v, want the one", blocks)
	}

	// A reload without admin closes it.
	if err := restart(".:0 {\n\tbind 127.0.0.1\n\tcompactcache\n\tforward . " + up + "\n}\n"); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("the admin listener on %s is open after a reload that dropped it", addr)
	}
}

// TestAdminStatsAfterZonesReload: a reload that widens the block's ZONES
// and keeps its store keeps the requests, hits and misses the stats show,
// which the counters under the new zones label alone would start again.
func TestAdminStatsAfterZonesReload(t *testing.T) {
	up := startUpstream(t, adminUpstream())
	addr, file := adminAddr(t), adminTokenFile(t)
	corefile := func(zones string) string {
		return strings.Replace(adminCorefile(up, addr, "token_file "+file), "compactcache {", "compactcache "+zones+" {", 1)
	}
	inst, err := startCorefile(corefile("example.org admin-rezone-one.test"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	a := newAdminClient(t, addr)
	stats := func() admin.Stats {
		var s admin.StatsReply
		a.ok(admin.OpStats, nil, &s)
		if len(s.Blocks) != 1 {
			t.Fatalf("stats of %d blocks", len(s.Blocks))
		}
		return s.Blocks[0]
	}
	q := test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), q)
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), q)
	before := stats()
	if before.Requests != 2 || before.Hits != 1 || before.Misses != 1 {
		t.Fatalf("stats before the reload: %+v", before)
	}
	serverMu.Lock()
	inst, err = inst.Restart(corefileInput(corefile("example.org admin-rezone-one.test admin-rezone-two.test")))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if s := stats(); s.Entries.Success != 1 || s.Requests != before.Requests || s.Hits != before.Hits || s.Misses != before.Misses {
		t.Errorf("stats after the reload to other ZONES: %+v, before %+v", s, before)
	}
	exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), q)
	if s := stats(); s.Requests != before.Requests+1 || s.Hits != before.Hits+1 {
		t.Errorf("stats after a request to the reloaded block: %+v, before the reload %+v", s, before)
	}
}

// TestAdminBlockOfTwoPorts: a block whose keys have two ports serves both
// with one cache (caddy sets it up for its first key); the requests of the
// second port's server count in its stats and it lists both addresses.
func TestAdminBlockOfTwoPorts(t *testing.T) {
	up := startUpstream(t, adminUpstream())
	addr := adminAddr(t)
	first, second := testenv.FreePort(t), testenv.FreePort(t)
	corefile := strings.Replace(adminCorefile(up, addr, "token_file "+adminTokenFile(t)), ".:0",
		fmt.Sprintf("example.org:%d example.net:%d", first, second), 1)
	startAdminInstance(t, corefile)
	a := newAdminClient(t, addr)
	var before admin.StatsReply
	a.ok(admin.OpStats, nil, &before)
	dnsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(second))
	for range 2 {
		exchangeUDP(t, dnsAddr, test.Case{Qname: "www.example.net.", Qtype: dns.TypeA}.Msg())
	}
	var blocks admin.Blocks
	a.ok(admin.OpBlocks, nil, &blocks)
	want := fmt.Sprintf("dns://127.0.0.1:%d dns://127.0.0.1:%d", first, second)
	if len(blocks.Blocks) != 1 || strings.Join(blocks.Blocks[0].Listen, " ") != want {
		t.Errorf("blocks %+v, want one listening on %s", blocks, want)
	}
	var stats admin.StatsReply
	a.ok(admin.OpStats, nil, &stats)
	if s, b := stats.Blocks[0], before.Blocks[0]; s.Requests-b.Requests != 2 || s.Hits-b.Hits != 1 {
		t.Errorf("stats %+v, before the queries %+v: want 2 requests and 1 hit more", s, b)
	}
}
