package main

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/miekg/dns"
)

// buildCtl builds compactcache-ctl, which lives in the plugin's module.
func buildCtl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "compactcache-ctl")
	if out, err := run(t, 5*time.Minute, goCommand(t), "build", "-o", bin, "github.com/compactcache/compactcache/cmd/compactcache-ctl"); err != nil {
		t.Fatalf("go build compactcache-ctl: %v\n%s", err, out)
	}
	return bin
}

// testAdmin runs the built binary on Corefile.example with the admin
// endpoint on, and the built tool against it, as an operator would.
func testAdmin(t *testing.T, bin string, example string) {
	ctl := buildCtl(t)
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("e2e-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	front, back := testenv.FreePort(t), testenv.FreePort(t)
	corefile := strings.Replace(example, "compactcache {\n", "compactcache {\n        admin "+adminAddr+" {\n            token_file "+token+"\n        }\n", 1)
	corefile = strings.ReplaceAll(corefile, ":1053", ":"+strconv.Itoa(front))
	corefile = strings.ReplaceAll(corefile, ":1054", ":"+strconv.Itoa(back))
	if !strings.Contains(corefile, "admin "+adminAddr) {
		t.Fatal("Corefile.example: no compactcache block to add admin to")
	}
	_, dnsAddr := serve(t, bin, corefile, front)
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"www.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeAAAA}, {"nope.example.org.", dns.TypeA}, {"example.org.", dns.TypeMX}} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		if _, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, dnsAddr); err != nil {
			t.Fatal(err)
		}
	}

	// ctl runs the tool and returns its exit status and output.
	ctlRun := func(args ...string) (int, string) {
		t.Helper()
		out, err := run(t, time.Minute, ctl, append([]string{"--server", adminAddr, "--token-file", token}, args...)...)
		code := 0
		if err != nil {
			ee, ok := err.(interface{ ExitCode() int })
			if !ok {
				t.Fatalf("compactcache-ctl %q: %v\n%s", args, err, out)
			}
			code = ee.ExitCode()
		}
		return code, string(out)
	}
	expect := func(code int, match string, args ...string) string {
		t.Helper()
		got, out := ctlRun(args...)
		if got != code || !regexp.MustCompile(match).MatchString(out) {
			t.Errorf("compactcache-ctl %s: exit %d\n%s\nwant exit %d matching %s", strings.Join(args, " "), got, out, code, match)
		}
		return out
	}

	expect(0, `(?m)^dns://\.:\d+ \(bind 127\.0\.0\.1\)\tzones=\.\tlisten=dns://127\.0\.0\.1:\d+$`, "blocks")
	expect(0, `(?m)^; www\.example\.org\. IN A flags=- ecs=- match=- rcode=NOERROR kind=success ttl=\d+ left=\d+ stale=no expired=no bytes=\d+ hits=0\nwww\.example\.org\.\t\d+\tIN\tA\t`, "lookup", "www.example.org", "A")
	expect(0, `(?m)\.entries\.success=4$`, "stats") // and waitReady's ns1.example.org
	dump := expect(0, `(?m)^; nope\.example\.org\. IN A .*rcode=NXDOMAIN kind=denial`, "dump")
	zp := dns.NewZoneParser(strings.NewReader(dump), "", "")
	n := 0
	for _, ok := zp.Next(); ok; _, ok = zp.Next() {
		n++
	}
	if zp.Err() != nil || n == 0 {
		t.Errorf("the dump does not read as a zone file: %d records, %v", n, zp.Err())
	}
	expect(0, `(?m)^\{"block":"dns://\.:\d+ \(bind 127\.0\.0\.1\)","name":"`, "dump", "--json")
	expect(0, `(?m)^ok dns://\.:\d+ \(bind 127\.0\.0\.1\): removed 2 entries \(2 success, 0 denial, 0 ECS lists\)`, "flush", "www.example.org")
	expect(0, `(?m): 0 entries$`, "lookup", "www.example.org")
	expect(0, `removed 1 entries \(0 success, 1 denial`, "flush_negative")
	expect(0, `removed 2 entries \(2 success`, "flush_zone", "example.org")
	expect(0, `removed 0 entries`, "flush_all")

	// Refusals: a bad name, a wrong token, a usage error.
	expect(1, `400 Bad Request: name: "a\.\.b" is not a domain name`, "flush", "a..b")
	expect(1, `404 Not Found: block: no block "nope"`, "--block", "nope", "stats")
	expect(2, `unknown command "wipe_cache"`, "wipe_cache")
	wrong := filepath.Join(dir, "wrong")
	os.WriteFile(wrong, []byte("not-the-token-0123456789"), 0o600)
	if out, err := run(t, time.Minute, ctl, "--server", adminAddr, "--token-file", wrong, "flush_all"); err == nil || !strings.Contains(string(out), "401 Unauthorized: wrong token") {
		t.Errorf("a wrong token: %v\n%s", err, out)
	}
}
