package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
)

// These tests run the tool against fake endpoints; cmd/coredns's tests run
// the built tool against the built server.

// fake is an admin endpoint that answers every flush with one block, and
// records what it was asked and when.
type fake struct {
	srv      *httptest.Server
	fail     bool
	flushErr string // the error of the flushes' block
	delay    time.Duration

	mu    sync.Mutex
	asked []string // "METHOD path?query"
	auth  []string
	done  time.Time
}

func newFake(t *testing.T) *fake {
	f := &fake{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(f.delay)
		f.mu.Lock()
		f.asked = append(f.asked, r.Method+" "+r.URL.RequestURI())
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		f.done = time.Now()
		f.mu.Unlock()
		if f.fail {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(admin.Error{Error: `name: "a..b" is not a domain name`, Field: "name"})
			return
		}
		switch strings.TrimPrefix(r.URL.Path, admin.Prefix) {
		case admin.OpDump:
			w.Write([]byte("; block b\nwww.example.org.\t300\tIN\tA\t192.0.2.1\n"))
		case admin.OpStats:
			json.NewEncoder(w).Encode(admin.StatsReply{Blocks: []admin.Stats{{Block: "b", Entries: admin.Counts{Success: 3}, Requests: 4, Hits: 1, HitRatio: 0.25}}})
		case admin.OpLookup:
			json.NewEncoder(w).Encode(admin.LookupReply{Blocks: []admin.BlockEntries{{Block: "b", Entries: []admin.Entry{{Name: "www.example.org.", Type: "A", Class: "IN", Rcode: "NOERROR", Kind: "success", TTL: 300, TTLLeft: 200, Answer: []string{"www.example.org.\t200\tIN\tA\t192.0.2.1"}}}}}})
		default:
			json.NewEncoder(w).Encode(admin.FlushReply{Op: "x", Blocks: []admin.Flushed{{Block: "b", Removed: admin.Counts{Success: 2, Denial: 1}, Seconds: 0.5, Error: f.flushErr}}})
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fake) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asked...)
}

// ctl runs the tool and returns its exit status, stdout and stderr.
func ctl(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCtlFlushPartial: a flush that a server applied to its store but not
// to its shared tier is printed as partial, and the tool fails.
func TestCtlFlushPartial(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantOut string
	}{
		{nil, "partial b: removed 3 entries (2 success, 1 denial, 0 ECS lists) in 0.500s\n"},
		// --json prints the reply as it came, and fails all the same.
		{[]string{"--json"}, `"error":"not applied to the shared tier`},
	} {
		cluster, local := newFake(t), newFake(t)
		cluster.flushErr = "not applied to the shared tier or the other replicas: shared tier redis://127.0.0.1:1: not connected"
		code, out, errOut := ctl(append(tc.args, "--server", cluster.addr(), "--then", local.addr(), "flush", "www.example.org")...)
		if code != exitFailed || !strings.Contains(out, tc.wantOut) ||
			!strings.Contains(errOut, "applied to these servers' stores, but b: not applied to the shared tier") {
			t.Errorf("a partial flush %v: %d %q %q", tc.args, code, out, errOut)
		}
		if n := len(local.requests()); n != 0 {
			t.Errorf("a partial flush %v: the next stage was asked (%d requests)", tc.args, n)
		}
	}
}

// TestCtlJSONOfServers: with --json, the replies of several servers are
// JSON Lines, each naming its server, not JSON behind a prefix.
func TestCtlJSONOfServers(t *testing.T) {
	a, b := newFake(t), newFake(t)
	code, out, errOut := ctl("--json", "--server", a.addr(), "--server", b.addr(), "flush", "www.example.org")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one a server:\n%s", len(lines), out)
	}
	for i, line := range lines {
		var got struct {
			Server string           `json:"server"`
			Reply  admin.FlushReply `json:"reply"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil || !strings.HasSuffix(got.Server, []string{a.addr(), b.addr()}[i]) || len(got.Reply.Blocks) != 1 {
			t.Errorf("line %d, %q: %+v, %v", i, line, got, err)
		}
	}
}

func TestCtlFlush(t *testing.T) {
	f := newFake(t)
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("  s3cret-token-0123456789\n"), 0o600)
	code, out, errOut := ctl("--server", f.addr(), "--token-file", token, "flush_zone", "example.org", "--block", "b")
	if code != exitOK || out != "ok b: removed 3 entries (2 success, 1 denial, 0 ECS lists) in 0.500s\n" || errOut != "" {
		t.Errorf("flush_zone: %d %q %q", code, out, errOut)
	}
	if got := f.requests(); len(got) != 1 || got[0] != "POST /v1/flush_zone?block=b&zone=example.org" || f.auth[0] != "Bearer s3cret-token-0123456789" {
		t.Errorf("asked %v with %v", got, f.auth)
	}
	code, out, _ = ctl("--server", f.addr(), "lookup", "www.example.org", "A")
	if code != exitOK || !strings.HasPrefix(out, "; block b: 1 entries\n; www.example.org. IN A flags=- ") || !strings.HasSuffix(out, "\nwww.example.org.\t200\tIN\tA\t192.0.2.1\n") {
		t.Errorf("lookup: %d %q", code, out)
	}
	if f.auth[1] != "" {
		t.Errorf("no token file, yet Authorization %q", f.auth[1])
	}
	code, out, _ = ctl("--server", f.addr(), "stats")
	if code != exitOK || !strings.Contains(out, "b.entries.success=3\n") || !strings.Contains(out, "b.hit_ratio=0.2500\n") {
		t.Errorf("stats: %d %q", code, out)
	}
	code, out, _ = ctl("--server", "http://"+f.addr()+"/", "--json", "dump")
	if code != exitOK || out != "; block b\nwww.example.org.\t300\tIN\tA\t192.0.2.1\n" || f.requests()[3] != "GET /v1/dump?format=json" {
		t.Errorf("dump: %d %q, asked %v", code, out, f.requests())
	}
}

// TestCtlStages: the servers of a stage are asked after every server of the
// stage before has answered, and not at all when one failed.
func TestCtlStages(t *testing.T) {
	cluster1, cluster2, local := newFake(t), newFake(t), newFake(t)
	cluster1.delay = 50 * time.Millisecond
	code, out, errOut := ctl("--server", cluster1.addr()+","+cluster2.addr(), "--then", local.addr(), "flush", "www.example.org")
	if code != exitOK || errOut != "" {
		t.Fatalf("%d %q %q", code, out, errOut)
	}
	for _, f := range []*fake{cluster1, cluster2, local} {
		if !strings.Contains(out, "http://"+f.addr()+": ok b: removed 3 entries") {
			t.Errorf("no line for %s in\n%s", f.addr(), out)
		}
	}
	if !local.done.After(cluster1.done) || len(local.requests()) != 1 {
		t.Errorf("node-local asked at %v, cluster DNS done at %v", local.done, cluster1.done)
	}

	cluster2.fail = true
	code, _, errOut = ctl("--server", cluster1.addr(), "--server", cluster2.addr(), "--then", local.addr(), "flush", "a..b")
	if code != exitFailed || !strings.Contains(errOut, `: 400 Bad Request: name: "a..b" is not a domain name`) || !strings.Contains(errOut, "not asked, since a server before them failed: http://"+local.addr()) {
		t.Errorf("a server of the first stage failing: %d %q", code, errOut)
	}
	if n := len(local.requests()); n != 1 {
		t.Errorf("the second stage was asked after the first failed (%d requests)", n)
	}
}

func TestCtlUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{nil, "usage: compactcache-ctl"},
		{[]string{"flush"}, "flush takes NAME, got 0 arguments"},
		{[]string{"flush_type", "a"}, "flush_type takes NAME TYPE, got 1 arguments"},
		{[]string{"lookup", "a", "A", "x"}, "lookup takes NAME [TYPE], got 3 arguments"},
		{[]string{"flush_all", "x"}, "flush_all takes no arguments, got 1"},
		{[]string{"wipe"}, `unknown command "wipe"`},
		{[]string{"--token-file", "/nonexistent", "stats"}, "--token-file: open /nonexistent"},
		{[]string{"--server", "example.org", "stats"}, `has no port`},
		{[]string{"--server", "ftp://example.org:1", "stats"}, `is not HOST:PORT or an http(s) URL`},
		{[]string{"--bogus", "stats"}, "flag provided but not defined: -bogus"},
		{[]string{"--timeout", "-1s", "stats"}, "--timeout -1s: want a duration of 0 (for ever) or more"},
	} {
		code, _, errOut := ctl(tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.says) {
			t.Errorf("%q: %d %q, want 2 saying %q", tc.args, code, errOut, tc.says)
		}
	}
}

// TestPrintReplyUnknown: a reply the tool has no text form for is an error,
// never printed as a flush's count.
func TestPrintReplyUnknown(t *testing.T) {
	flushed := `{"op":"flush","blocks":[{"block":"b","removed":{"success":2},"seconds":0.001}]}`
	for _, tc := range []struct {
		op      string
		wantErr bool
		want    string
	}{
		{"flush", false, "ok b: removed 2 entries"},
		{"flush_all", false, "ok b: removed 2 entries"},
		{"histogram", true, ""},
		{"", true, ""},
	} {
		var out bytes.Buffer
		err := printReply(tc.op, []byte(flushed), &out)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: error %v, want error %v", tc.op, err, tc.wantErr)
		}
		if !strings.Contains(out.String(), tc.want) || (tc.want == "" && out.Len() > 0) {
			t.Errorf("%q: printed %q, want %q", tc.op, out.String(), tc.want)
		}
	}
}

// TestCtlReplyTooLarge: a reply read whole that runs past maxReply is not
// read on, and the tool fails saying so; a dump, streamed, has no limit.
func TestCtlReplyTooLarge(t *testing.T) {
	defer func(was int) { maxReply = was }(maxReply)
	maxReply = 4 << 20
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A stats reply, then spaces up to past the limit: JSON all the same.
		json.NewEncoder(w).Encode(admin.StatsReply{Blocks: []admin.Stats{{Block: "b"}}})
		spaces := bytes.Repeat([]byte(" "), 1<<20)
		for range 4 + 1 {
			n, err := w.Write(spaces)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	code, out, errOut := ctl("--server", strings.TrimPrefix(srv.URL, "http://"), "stats")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "a reply over 4 MiB") {
		t.Errorf("a stats reply of %d MiB: exit %d, %d bytes out, %q; want exit %d, nothing out, a reply over 4 MiB",
			sent.Load()>>20, code, len(out), errOut, exitFailed)
	}
}

// TestCtlDumpJSONOfServers: with --json, the dump of several servers is
// JSON Lines, each entry's line naming its server, as the other replies
// of several servers are; one server's lines are its own, as they came.
func TestCtlDumpJSONOfServers(t *testing.T) {
	entry := `{"block":"b","name":"www.example.org.","type":"A","class":"IN","cd":false,"rcode":"NOERROR","kind":"success","stored":1,"ttl":300,"ttl_left":200,"stale":false,"expired":false,"bytes":100,"hits":0}`
	dumper := func() string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(entry + "\n" + entry + "\n"))
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	a, b := dumper(), dumper()
	for _, tc := range []struct {
		servers []string
		lines   int
	}{
		{[]string{"--server", a}, 2},
		{[]string{"--server", a, "--server", b}, 4},
		{[]string{"--server", a, "--then", b}, 4},
	} {
		code, out, errOut := ctl(append(tc.servers, "--json", "dump")...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", tc.servers, code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != tc.lines {
			t.Fatalf("%v: %d lines, want %d:\n%s", tc.servers, len(lines), tc.lines, out)
		}
		for i, line := range lines {
			var e admin.Entry
			if tc.lines == 2 {
				if line != entry {
					t.Errorf("%v: line %d %q, want the entry as it came", tc.servers, i, line)
				}
				continue
			}
			var got struct {
				Server string          `json:"server"`
				Reply  json.RawMessage `json:"reply"`
			}
			if err := json.Unmarshal([]byte(line), &got); err != nil || json.Unmarshal(got.Reply, &e) != nil ||
				e.Name != "www.example.org." || !strings.HasSuffix(got.Server, []string{a, a, b, b}[i]) {
				t.Errorf("%v: line %d, %q: %+v, %v", tc.servers, i, line, got, err)
			}
		}
	}
}

// TestCtlEachAddressUnresolved: with --each-address, a host name that does
// not resolve is a server that could not be asked, as one that does not
// answer: the others of its stage are asked all the same, the stages
// after are not, and the tool exits 1, not 2 (a usage error).
func TestCtlEachAddressUnresolved(t *testing.T) {
	defer func(was func(string) ([]string, error)) { lookupHost = was }(lookupHost)
	lookupHost = func(host string) ([]string, error) {
		if host == "pods.example.test" {
			return []string{"127.0.0.1"}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	good, local := newFake(t), newFake(t)
	_, port, _ := net.SplitHostPort(good.addr())
	for _, opt := range []string{"", "--json"} {
		args := []string{"--each-address", "--server", "gone.example.test:" + port + ",pods.example.test:" + port, "--then", local.addr(), "flush", "www.example.org"}
		if opt != "" {
			args = append([]string{opt}, args...)
		}
		before := len(good.requests())
		code, out, errOut := ctl(args...)
		if code != exitFailed || !strings.Contains(errOut, "http://gone.example.test:"+port+": ") || !strings.Contains(errOut, "no such host") ||
			!strings.Contains(errOut, "not asked, since a server before them failed: http://"+local.addr()) {
			t.Errorf("%s: exit %d, stderr %q; want %d naming the host and the servers not asked", args, code, errOut, exitFailed)
		}
		if n := len(good.requests()) - before; n != 1 || !strings.Contains(out, "http://127.0.0.1:"+port) {
			t.Errorf("%s: the host that resolved was asked %d times, want once; out %q", args, n, out)
		}
		if n := len(local.requests()); n != 0 {
			t.Errorf("%s: the next stage was asked (%d requests)", args, n)
		}
	}
	// A dump too, which asks the servers of a stage one after the other.
	code, out, errOut := ctl("--each-address", "--server", "gone.example.test:"+port+",pods.example.test:"+port, "dump")
	if code != exitFailed || !strings.Contains(errOut, "gone.example.test") || !strings.Contains(out, "www.example.org.\t300\tIN\tA") {
		t.Errorf("dump: exit %d, out %q, stderr %q", code, out, errOut)
	}
}

// TestCtlEmptyTokenFile: a token file that holds no token, empty or white
// space only, stops the tool at once naming the file, rather than asking
// without a token and getting 401.
func TestCtlEmptyTokenFile(t *testing.T) {
	f := newFake(t)
	for _, content := range []string{"", " \n\t\n"} {
		path := filepath.Join(t.TempDir(), "token")
		os.WriteFile(path, []byte(content), 0o600)
		code, _, errOut := ctl("--server", f.addr(), "--token-file", path, "stats")
		if code != exitUsage || !strings.Contains(errOut, "--token-file "+path+": holds no token") {
			t.Errorf("a token file holding %q: exit %d, %q; want %d naming the file", content, code, errOut, exitUsage)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("the server was asked %d times", n)
	}
}

// TestCtlSnapshotRefused: snapshot, the binary stream a peer's warmup
// reads, is no command of the tool: it is refused as a usage error that
// says what to use instead, and the server is not asked.
func TestCtlSnapshotRefused(t *testing.T) {
	f := newFake(t)
	for _, args := range [][]string{{"snapshot", "b"}, {"--block", "b", "snapshot"}, {"--json", "snapshot", "b"}, {"snapshot"}} {
		code, out, errOut := ctl(append([]string{"--server", f.addr()}, args...)...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, "snapshot is not a command") || !strings.Contains(errOut, "/v1/snapshot?block=NAME") {
			t.Errorf("%q: exit %d, out %q, stderr %q; want %d saying what to use instead", args, code, out, errOut, exitUsage)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("the server was asked %d times", n)
	}
}

// TestCtlBlockTwice: an operation that takes the block as an argument,
// given --block too, takes them when they agree, and refuses them as a
// usage error when they differ, rather than letting --block win.
func TestCtlBlockTwice(t *testing.T) {
	const op = "peek"
	admin.Specs[op] = admin.Spec{Method: http.MethodGet, Required: []string{admin.ParamBlock}}
	defer delete(admin.Specs, op)
	f := newFake(t)
	code, _, errOut := ctl("--server", f.addr(), "--json", op, "a", "--block", "b")
	if code != exitUsage || !strings.Contains(errOut, `--block "b" and the argument BLOCK "a" differ`) {
		t.Errorf("--block b, BLOCK a: exit %d, %q; want %d", code, errOut, exitUsage)
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("the server was asked %d times", n)
	}
	code, _, errOut = ctl("--server", f.addr(), "--json", op, "a", "--block", "a")
	if got := f.requests(); code != exitOK || len(got) != 1 || got[0] != "GET /v1/peek?block=a" {
		t.Errorf("--block a, BLOCK a: exit %d, %q, asked %v", code, errOut, got)
	}
}

// TestCtlReplyNotJSON: a server that answers 200 with something other than
// JSON (a proxy's login page, another service on the port) has not done
// what was asked: the tool fails saying so, with --json too, and prints
// nothing of it as a reply.
func TestCtlReplyNotJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<html>sign in</html>"))
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, args := range [][]string{
		{"stats"}, {"blocks"}, {"lookup", "www.example.org"}, {"flush", "www.example.org"},
		{"--json", "stats"}, {"--json", "blocks"}, {"--json", "lookup", "www.example.org"}, {"--json", "flush_all"},
		{"--server", addr, "--json", "stats"},
	} {
		code, out, errOut := ctl(append([]string{"--server", addr}, args...)...)
		if code != exitFailed || out != "" || !strings.Contains(errOut, "the reply is not JSON (text/html)") {
			t.Errorf("%q: exit %d, out %q, stderr %q; want %d, nothing out, saying the reply is not JSON", args, code, out, errOut, exitFailed)
		}
	}
}

// TestCtlServerCredentials: a server URL with credentials in it is refused
// as a usage error, the endpoint takes a bearer token alone, and the
// password is not printed back, as every line naming the server would.
func TestCtlServerCredentials(t *testing.T) {
	f := newFake(t)
	for _, server := range []string{"http://ops:s3cret@" + f.addr(), "http://ops:s3cret@" + f.addr() + "/", "ops:s3cret@" + f.addr(), "http://ops:s3cret@example.org"} {
		code, out, errOut := ctl("--server", server, "stats")
		if code != exitUsage || strings.Contains(out+errOut, "s3cret") || !strings.Contains(errOut, "--token-file") {
			t.Errorf("--server %s: exit %d, out %q, stderr %q; want %d pointing to --token-file, without the password", server, code, out, errOut, exitUsage)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("the server was asked %d times", n)
	}
}

// TestCtlTokenNotOneLine: a token file whose token an Authorization header
// cannot carry (two lines) is a usage error naming the file, without the
// token, and the server is not asked.
func TestCtlTokenNotOneLine(t *testing.T) {
	f := newFake(t)
	path := filepath.Join(t.TempDir(), "token")
	os.WriteFile(path, []byte("s3cret-token-0123456789\nsecond-s3cret\n"), 0o600)
	code, out, errOut := ctl("--server", f.addr(), "--token-file", path, "stats")
	if code != exitUsage || strings.Contains(out+errOut, "s3cret") || !strings.Contains(errOut, "--token-file: "+path+": the token holds a line break") {
		t.Errorf("a token of two lines: exit %d, out %q, stderr %q; want %d naming the file, not the token", code, out, errOut, exitUsage)
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("the server was asked %d times", n)
	}
}

// TestCtlDumpNotADump: a server that answers a dump with 200 and something
// other than a dump (a proxy's page) fails, and none of it is printed as
// the dump; text and JSON lines, as the endpoint sends them, are taken.
func TestCtlDumpNotADump(t *testing.T) {
	for _, tc := range []struct {
		contentType string
		ok          bool
	}{
		{"text/html; charset=utf-8", false},
		{"application/json", false},
		{"", false},
		{admin.ContentTypeText, true},
		{admin.ContentTypeJSONLines, true},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = []string{tc.contentType}
			w.Write([]byte("<html>sign in</html>\n"))
		}))
		code, out, errOut := ctl("--server", strings.TrimPrefix(srv.URL, "http://"), "dump")
		srv.Close()
		if tc.ok != (code == exitOK) || tc.ok != (out != "") || !tc.ok && !strings.Contains(errOut, "the reply is not a dump ("+tc.contentType+")") {
			t.Errorf("a dump of Content-Type %q: exit %d, out %q, stderr %q", tc.contentType, code, out, errOut)
		}
	}
}

// TestCtlRefusalNotJSON: a refusal that is not the endpoint's JSON (a
// proxy's error page) is shown with its status, quoted and cut short:
// not kilobytes of a page, nor the control bytes in it, on the terminal.
func TestCtlRefusalNotJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte("<html>\x1b[2J" + strings.Repeat("bad gateway ", 4<<10) + "</html>\n"))
	}))
	t.Cleanup(srv.Close)
	code, out, errOut := ctl("--server", strings.TrimPrefix(srv.URL, "http://"), "stats")
	if code != exitFailed || out != "" || !strings.Contains(errOut, `: 502 Bad Gateway: "<html>\x1b[2Jbad gateway bad gateway`) || len(errOut) > 400 {
		t.Errorf("a 502 page: exit %d, out %q, stderr of %d bytes %q", code, out, len(errOut), errOut[:min(len(errOut), 400)])
	}
}

// TestCtlDumpServerSilent: a server that takes the connection and never
// answers (a process that hangs) fails a dump once --timeout is out, as it
// fails the other commands; the dump's stream itself has no limit.
func TestCtlDumpServerSilent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	for _, cmd := range []string{"dump", "stats"} {
		code, out, errOut := ctl("--server", ln.Addr().String(), "--timeout", "50ms", cmd)
		if code != exitFailed || out != "" || !strings.Contains(errOut, ln.Addr().String()) {
			t.Errorf("%s of a server that never answers: exit %d, out %q, stderr %q; want %d", cmd, code, out, errOut, exitFailed)
		}
	}
}

// TestCtlErrorEscaped: a server's error, a refusal's or a partial flush's,
// is printed as it came when it prints, and quoted, its control characters
// escaped, when it holds one: a server, or a proxy in between, does not
// drive the operator's terminal.
func TestCtlErrorEscaped(t *testing.T) {
	for _, tc := range []struct{ sent, want string }{
		{`name: "a..b" is not a domain name`, `: 400 Bad Request: name: "a..b" is not a domain name` + "\n"},
		{"wrong\x1b[2J token", `: 400 Bad Request: "wrong\x1b[2J token"` + "\n"},
		{"wrong\u009b2J token", `: 400 Bad Request: "wrong\u009b2J token"` + "\n"},
		{"two\nlines", `: 400 Bad Request: "two\nlines"` + "\n"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(admin.Error{Error: tc.sent})
		}))
		code, _, errOut := ctl("--server", strings.TrimPrefix(srv.URL, "http://"), "stats")
		srv.Close()
		if code != exitFailed || !strings.HasSuffix(errOut, tc.want) {
			t.Errorf("a refusal saying %q: exit %d, stderr %q; want %d ending %q", tc.sent, code, errOut, exitFailed, tc.want)
		}
	}
	f := newFake(t)
	f.flushErr = "not applied\x1b[2J"
	code, _, errOut := ctl("--server", f.addr(), "flush", "www.example.org")
	if want := `but b: "not applied\x1b[2J"` + "\n"; code != exitFailed || !strings.HasSuffix(errOut, want) {
		t.Errorf("a partial flush saying %q: exit %d, stderr %q; want %d ending %q", f.flushErr, code, errOut, exitFailed, want)
	}
}
