package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/miekg/dns"
)

// testLameduck stops the binary with SIGTERM under health's lameduck, as
// Kubernetes stops a pod of deploy/kubernetes/coredns.yaml, and asks the
// front end during the lameduck: CoreDNS's servers answer until it is over,
// while the pod leaves its Service, and so must the front end, the admin
// endpoint, from which a new replica warms up, and the shared tier, through
// which flushes reach the replica.
func testLameduck(t *testing.T, bin, example string) {
	redis := testenv.StartRedis(t)
	clients := func() int { return strings.Count(redis.MustDo("CLIENT", "LIST"), "\n") - 1 } // less the one asking
	front, back, up, health := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("lameduck-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	corefile := strings.Replace(example, ".:1053 {\n", ".:1053 {\n    health 127.0.0.1:"+strconv.Itoa(health)+" {\n        lameduck 3s\n    }\n", 1)
	corefile = strings.Replace(corefile, "compactcache {\n", "compactcache {\n        frontend 127.0.0.1:"+strconv.Itoa(front)+"\n        admin "+admin+" {\n            token_file "+token+"\n        }\n        shared redis://"+redis.Addr+"\n", 1)
	corefile = strings.ReplaceAll(corefile, ":1053", ":"+strconv.Itoa(back))
	corefile = strings.ReplaceAll(corefile, ":1054", ":"+strconv.Itoa(up))
	if !strings.Contains(corefile, "lameduck 3s") || !strings.Contains(corefile, "frontend 127.0.0.1:") || !strings.Contains(corefile, "admin "+admin) {
		t.Fatal("Corefile.example: no .:1053 block with a compactcache block to add health and the front end to")
	}
	srv, addr := serve(t, bin, corefile, front)
	ask := func(network, name string) error {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		_, _, err := (&dns.Client{Net: network, Timeout: 2 * time.Second}).Exchange(m, addr)
		return err
	}
	if err := ask("udp", "www.example.org."); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); clients() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the shared tier did not connect")
		}
	}
	done := make(chan struct{})
	go func() { srv.cmd.Process.Wait(); close(done) }()
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(srv.out.String(), "Going into lameduck mode") {
		select {
		case <-done:
			t.Fatal("coredns exited before its lameduck")
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond)
	// A hit, and a miss the front end hands to the chain, over UDP and TCP.
	for _, network := range []string{"udp", "tcp"} {
		for _, name := range []string{"www.example.org.", "mail.example.org."} {
			if err := ask(network, name); err != nil {
				t.Errorf("%s %s during the lameduck: %v", network, name, err)
			}
		}
	}
	if conn, err := net.DialTimeout("tcp", admin, 2*time.Second); err != nil {
		t.Errorf("the admin endpoint during the lameduck: %v", err)
	} else {
		conn.Close()
	}
	if n := clients(); n == 0 {
		t.Error("the shared tier closed its connections before the lameduck was over")
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Error("coredns still running 20 s after SIGTERM")
	}
}
