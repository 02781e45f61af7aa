package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"

	"github.com/miekg/dns"
)

// The repository root, seen from this package's directory, where go test runs
// us. Corefile.example and the zone path inside it are relative to it.
const root = "../.."

// TestBinary builds the binary once and runs Corefile.example with it, as a
// user would: once as written (compactcache) and once with the stock cache in
// its place, so a failure that shows up only with compactcache is the plugin's
// and not the test's.
func TestBinary(t *testing.T) {
	bin := build(t)

	t.Run("plugins", func(t *testing.T) {
		out, err := run(t, 30*time.Second, bin, "-plugins")
		if err != nil {
			t.Fatalf("%s -plugins: %v\n%s", bin, err, out)
		}
		// caddy prints the names without the "dns." server-type prefix; older
		// versions printed it, accept both.
		for _, want := range []string{"cache", "compactcache"} {
			found := false
			for _, line := range strings.Fields(string(out)) {
				if line == want || line == "dns."+want {
					found = true
				}
			}
			if !found {
				t.Errorf("-plugins does not list %q:\n%s", want, out)
			}
		}
	})

	example, err := os.ReadFile(filepath.Join(root, "Corefile.example"))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("compactcache", func(t *testing.T) {
		if !strings.Contains(string(example), "compactcache") {
			t.Fatal("Corefile.example does not use compactcache")
		}
		smoke(t, bin, string(example))
	})
	t.Run("frontend", func(t *testing.T) {
		// The front end takes the clients' port; the server block moves
		// to another one, where only the front end's misses reach it.
		fe := strings.Replace(string(example), ".:1053 {", ".:1055 {", 1)
		fe = strings.Replace(fe, "compactcache {\n", "compactcache {\n        frontend 127.0.0.1:1053\n", 1)
		if !strings.Contains(fe, ".:1055 {") || !strings.Contains(fe, "frontend 127.0.0.1:1053") {
			t.Fatal("Corefile.example: no .:1053 block with a compactcache block to add the front end to")
		}
		smoke(t, bin, fe)
	})
	t.Run("admin", func(t *testing.T) { testAdmin(t, bin, string(example)) })
	t.Run("lameduck", func(t *testing.T) { testLameduck(t, bin, string(example)) })
	t.Run("failed_switch", func(t *testing.T) { testFailedSwitch(t, bin, string(example)) })
	t.Run("cache", func(t *testing.T) {
		stock := regexp.MustCompile(`compactcache\s*\{[^}]*\}`).ReplaceAllString(string(example), "cache")
		if stock == string(example) {
			t.Fatal("Corefile.example: no compactcache block to replace")
		}
		smoke(t, bin, stock)
	})
}

// goCommand returns the go command of the toolchain running the test: go
// test puts its GOROOT/bin first in the test's PATH.
func goCommand(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not found: %v", err)
	}
	return goCmd
}

// build compiles the binary with the go command of the toolchain running the
// test, so the binary and the test agree on the module and its versions.
func build(t *testing.T) string {
	t.Helper()
	goCmd := goCommand(t)
	bin := filepath.Join(t.TempDir(), "coredns")
	// A cold build of every CoreDNS plugin takes minutes on a small machine.
	if out, err := run(t, 20*time.Minute, goCmd, "build", "-o", bin, "."); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// run runs a command to completion, killing it after timeout.
func run(t *testing.T, timeout time.Duration, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second // Children that keep the output open.
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return out.Bytes(), fmt.Errorf("timed out after %s", timeout)
	}
}

// smoke starts the binary on corefile, with its ports 1053 and 1054 (and
// 1055 if used) moved to free ones, and checks the answers on 1053 against
// the zone file.
func smoke(t *testing.T, bin, corefile string) {
	ports := map[string]int{}
	used := map[int]bool{}
	for _, port := range []string{":1053", ":1054", ":1055"} {
		if strings.Count(corefile, port) == 0 {
			if port != ":1055" {
				t.Fatalf("Corefile.example has no %s", port)
			}
			continue
		}
		p := testenv.FreePort(t)
		for used[p] {
			p = testenv.FreePort(t)
		}
		used[p], ports[port] = true, p
		corefile = strings.ReplaceAll(corefile, port, ":"+strconv.Itoa(p))
	}
	front := ports[":1053"]
	srv, addr := serve(t, bin, corefile, front)

	zone := readZone(t, filepath.Join(root, "testdata", "db.example.org"))
	soa := zone.get("example.org.", dns.TypeSOA)
	ns := zone.get("example.org.", dns.TypeNS)
	big := zone.get("big.example.org.", dns.TypeTXT)
	if len(soa) != 1 || len(ns) == 0 || (&dns.Msg{Answer: big}).Len() <= 512 {
		t.Fatalf("testdata/db.example.org: want a SOA, NS and a TXT set over 512 bytes at big")
	}
	web := append(zone.get("web.example.org.", dns.TypeCNAME), zone.get("www.example.org.", dns.TypeA)...)

	tests := []struct {
		qname  string
		qtype  uint16
		rcode  int
		answer []dns.RR
		ns     []dns.RR
	}{
		{"www.example.org.", dns.TypeA, dns.RcodeSuccess, zone.get("www.example.org.", dns.TypeA), ns},
		{"WwW.ExAmPlE.oRg.", dns.TypeAAAA, dns.RcodeSuccess, zone.get("www.example.org.", dns.TypeAAAA), ns},
		{"example.org.", dns.TypeMX, dns.RcodeSuccess, zone.get("example.org.", dns.TypeMX), ns},
		{"example.org.", dns.TypeTXT, dns.RcodeSuccess, zone.get("example.org.", dns.TypeTXT), ns},
		{"big.example.org.", dns.TypeTXT, dns.RcodeSuccess, big, ns},
		{"web.example.org.", dns.TypeA, dns.RcodeSuccess, web, ns},
		{"_sip._udp.example.org.", dns.TypeSRV, dns.RcodeSuccess, zone.get("_sip._udp.example.org.", dns.TypeSRV), ns},
		{"10.rev.example.org.", dns.TypePTR, dns.RcodeSuccess, zone.get("10.rev.example.org.", dns.TypePTR), ns},
		{"nope.example.org.", dns.TypeA, dns.RcodeNameError, nil, soa},
		{"www.example.org.", dns.TypeMX, dns.RcodeSuccess, nil, soa}, // NODATA
	}

	// The first round fills the cache, the second is served from it, and
	// the third after a reload, from what the reload kept.
	for round := 1; round <= 3; round++ {
		if round == 3 {
			srv.reload(t)
		}
		for _, tc := range tests {
			for _, tr := range []struct {
				net  string
				edns bool
			}{{"udp", false}, {"udp", true}, {"tcp", false}} {
				name := fmt.Sprintf("round %d %s %s %s edns=%t", round, tr.net, tc.qname, dns.TypeToString[tc.qtype], tr.edns)
				req := new(dns.Msg)
				req.SetQuestion(tc.qname, tc.qtype)
				if tr.edns {
					req.SetEdns0(4096, false)
				}
				c := &dns.Client{Net: tr.net, Timeout: 5 * time.Second}
				resp, _, err := c.Exchange(req, addr)
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				if len(resp.Question) != 1 || resp.Question[0] != req.Question[0] {
					t.Errorf("%s: question %v, want it echoed as %v", name, resp.Question, req.Question[0])
				}
				if resp.Rcode != tc.rcode {
					t.Errorf("%s: rcode %s, want %s", name, dns.RcodeToString[resp.Rcode], dns.RcodeToString[tc.rcode])
				}
				if tr.edns && resp.IsEdns0() == nil {
					t.Errorf("%s: no OPT in the reply to a query with EDNS", name)
				}

				// Without EDNS a UDP reply is limited to 512 bytes: the
				// large set must come back truncated, with TC, and whatever
				// it holds must still be from the zone.
				if tr.net == "udp" && !tr.edns && (&dns.Msg{Answer: tc.answer}).Len() > 512 {
					if !resp.Truncated {
						t.Errorf("%s: TC not set on a %d-byte reply", name, resp.Len())
					}
					if err := sameRRs(resp.Answer, tc.answer, true); err != nil {
						t.Errorf("%s: answer: %v", name, err)
					}
					continue
				}
				if resp.Truncated {
					t.Errorf("%s: TC set", name)
				}
				if err := sameRRs(resp.Answer, tc.answer, false); err != nil {
					t.Errorf("%s: answer: %v", name, err)
				}
				if err := sameRRs(resp.Ns, tc.ns, false); err != nil {
					t.Errorf("%s: authority: %v", name, err)
				}
			}
		}
	}
}

// sameRRs reports whether got holds the records of want, names compared
// case-insensitively, with TTLs no larger than the zone's. With subset, got
// may hold fewer records.
func sameRRs(got, want []dns.RR, subset bool) error {
	used := make([]bool, len(want))
next:
	for _, g := range got {
		for i, w := range want {
			if !used[i] && dns.IsDuplicate(g, w) {
				used[i] = true
				if g.Header().Ttl > w.Header().Ttl {
					return fmt.Errorf("TTL %d above the zone's %d: %v", g.Header().Ttl, w.Header().Ttl, g)
				}
				continue next
			}
		}
		return fmt.Errorf("unexpected record %v; want %v", g, want)
	}
	if !subset && len(got) != len(want) {
		return fmt.Errorf("got %v, want %v", got, want)
	}
	return nil
}

// zone is a zone file's records by owner and type.
type zone map[string][]dns.RR

func (z zone) get(name string, qtype uint16) []dns.RR {
	return z[strings.ToLower(name)+"/"+dns.TypeToString[qtype]]
}

func readZone(t *testing.T, path string) zone {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := zone{}
	zp := dns.NewZoneParser(f, "example.org.", path)
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		k := strings.ToLower(rr.Header().Name) + "/" + dns.TypeToString[rr.Header().Rrtype]
		z[k] = append(z[k], rr)
	}
	if err := zp.Err(); err != nil {
		t.Fatal(err)
	}
	return z
}

// start runs the binary on conf from the repository root, where the zone
// path in Corefile.example points, and kills it when the test ends. Its
// output goes to the test log if the test fails.
func start(t *testing.T, bin, conf string) *server {
	t.Helper()
	cmd := exec.Command(bin, "-conf", conf)
	cmd.Dir = root
	out := &testenv.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("coredns (pid %d) did not exit after SIGKILL", cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("coredns output:\n%s", out.String())
		}
	})
	return &server{cmd, out, conf}
}

// server is a running binary, its output and its Corefile.
type server struct {
	cmd  *exec.Cmd
	out  *testenv.LogBuffer
	conf string
}

// serve writes corefile to a file of its own, runs the binary on it and
// waits until it answers on 127.0.0.1:port, which it returns.
func serve(t *testing.T, bin, corefile string, port int) (*server, string) {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := start(t, bin, conf)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	waitReady(t, addr)
	return srv, addr
}

// reload reloads the server as an operator does, with SIGUSR1, and waits
// until caddy says the reload is complete.
func (s *server) reload(t *testing.T) {
	t.Helper()
	done := strings.Count(s.out.String(), "Reloading complete")
	if err := s.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); strings.Count(s.out.String(), "Reloading complete") == done; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no reload 30 s after SIGUSR1")
		}
	}
}

// waitReady waits until the server at addr answers anything over UDP and TCP.
func waitReady(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: 500 * time.Millisecond}
		m := new(dns.Msg)
		m.SetQuestion("ns1.example.org.", dns.TypeA)
		for {
			_, _, err := c.Exchange(m, addr)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("coredns not answering on %s/%s: %v", addr, network, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
