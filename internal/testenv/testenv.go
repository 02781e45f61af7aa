// Package testenv has what the tests share: a loopback port for a server to
// listen on, a buffer for its log, records written as zone-file text, an
// HTTP client, and a real redis-server started on the loopback.
package testenv

import (
	"bytes"
	"encoding/binary"
	"log"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// FreePort returns a port on 127.0.0.1 that is free for both UDP and TCP at
// the time of the call, and that it has not returned before in this
// process: a test that takes several before it starts the servers that
// listen on them (a Corefile's ready and prometheus) would otherwise be
// given one twice when the kernel hands out a port freed a moment ago.
// Another process may take it before the server does; the window is small
// and a clash fails the test loudly.
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
			if given.take(port) {
				return port
			}
		}
	}
	tb.Fatal("no port free for both UDP and TCP on 127.0.0.1")
	return 0
}

// given are the ports FreePort has returned.
var given = portSet{m: map[int]bool{}}

type portSet struct {
	mu sync.Mutex
	m  map[int]bool
}

// take adds port, reporting whether it was not there.
func (s *portSet) take(port int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[port] {
		return false
	}
	s.m[port] = true
	return true
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

// CaptureLog sends the standard logger, which CoreDNS's plugin/pkg/log
// writes to, to a buffer until the test ends. Tests that call it must not
// be parallel.
func CaptureLog(t testing.TB) *LogBuffer {
	buf := &LogBuffer{}
	prev := log.Writer()
	log.SetOutput(buf)
	t.Cleanup(func() { log.SetOutput(prev) })
	return buf
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

// UDPSockets returns how many UDP sockets are bound to addr, a numeric
// host:port, as /proc/net/udp and /proc/net/udp6 list them; -1 where they
// cannot be read. CoreDNS binds with SO_REUSEPORT, and Linux gives a socket
// that binds port 0 (or a port named) with it a port that another such
// socket of the same user holds: two tests' servers running at once then
// share a port, and each gets some of the other's queries. A test that
// starts a server counts its sockets to start it again elsewhere.
func UDPSockets(addr string) int {
	want, err := netip.ParseAddrPort(addr)
	if err != nil {
		return -1
	}
	n := 0
	for _, file := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		text, err := os.ReadFile(file)
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(string(text), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 1 {
				if got, ok := procAddrPort(f[1]); ok && got == want {
					n++
				}
			}
		}
	}
	return n
}

// procAddrPort reads a local_address of /proc/net/udp or udp6: the address
// as 32-bit words in hex, each in the host's byte order (little-endian on
// the machines this runs on), a colon, the port in hex.
func procAddrPort(s string) (netip.AddrPort, bool) {
	hexAddr, hexPort, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if !ok || err != nil || (len(hexAddr) != 8 && len(hexAddr) != 32) {
		return netip.AddrPort{}, false
	}
	var b [16]byte
	for w := range len(hexAddr) / 8 {
		v, err := strconv.ParseUint(hexAddr[8*w:8*w+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, false
		}
		binary.LittleEndian.PutUint32(b[4*w:], uint32(v))
	}
	a := netip.AddrFrom16(b)
	if len(hexAddr) == 8 {
		a = netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), true
}
