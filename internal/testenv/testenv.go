// Package testenv has what the tests share: a loopback port for a server to
// listen on, a buffer for its log, and records written as zone-file text.
package testenv

import (
	"github.com/miekg/dns"

	"bytes"
	"net"
	"strconv"
	"sync"
	"testing"
)

// FreePort returns a port on 127.0.0.1 that is free for both UDP and TCP at
// the time of the call. Another process may take it before the server does;
// the window is small and a clash fails the test loudly.
func FreePort(tb testing.TB) int {
	tb.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	tb.Fatal("no port free for both UDP and TCP on 127.0.0.1")
	return 0
}

// LogBuffer is a bytes.Buffer that a server writes its log to while the
// test reads it.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// MustRR returns the record s says in zone-file text, failing the test when
// it does not parse.
func MustRR(tb testing.TB, s string) dns.RR {
	tb.Helper()
	rr, err := dns.NewRR(s)
	if err != nil {
		tb.Fatalf("dns.NewRR(%q): %v", s, err)
	}
	return rr
}
