package main

import (
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/miekg/dns"
)

// testFailedSwitch switches a running Corefile from the stock cache to
// compactcache with a front end on the clients' address, by SIGUSR1, in a
// reload that fails on a port another process holds: the running instance
// has no compactcache block to stop what the failed one opened, and the
// front end's sockets, unread in the address's SO_REUSEPORT group, took a
// share of the running server's queries.
func testFailedSwitch(t *testing.T, bin, example string) {
	stock := regexp.MustCompile(`compactcache\s*\{[^}]*\}`).ReplaceAllString(example, "cache")
	if stock == example {
		t.Fatal("Corefile.example: no compactcache block to replace")
	}
	front, back, up := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port

	stock = strings.ReplaceAll(stock, ":1053", ":"+strconv.Itoa(front))
	stock = strings.ReplaceAll(stock, ":1054", ":"+strconv.Itoa(up))
	// The new Corefile: the server block moves, the front end takes the
	// clients' address, and a block on the held port fails the reload.
	next := strings.Replace(example, "compactcache {\n", "compactcache {\n        frontend 127.0.0.1:"+strconv.Itoa(front)+"\n", 1)
	next = strings.ReplaceAll(next, ":1053", ":"+strconv.Itoa(back))
	next = strings.ReplaceAll(next, ":1054", ":"+strconv.Itoa(up))
	next += "\nexample.net:" + strconv.Itoa(heldPort) + " {\n    bind 127.0.0.1\n    whoami\n}\n"
	if !strings.Contains(next, "frontend 127.0.0.1:") {
		t.Fatal("Corefile.example: no compactcache block to add the front end to")
	}
	srv, addr := serve(t, bin, stock, front)
	if err := os.WriteFile(srv.conf, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(srv.out.String(), "Restart failed"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no failed reload 30 s after SIGUSR1")
		}
	}
	lost := 0
	const asked = 30
	for range asked {
		m := new(dns.Msg)
		m.SetQuestion("www.example.org.", dns.TypeA)
		if _, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr); err != nil {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("after the failed reload the running server answered %d of %d queries", asked-lost, asked)
	}
}
