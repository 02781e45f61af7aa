package frontend

import (
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

func TestParse(t *testing.T) {
	tests := []struct {
		input string
		check func(*Config) bool
	}{
		{"frontend 127.0.0.1:53", func(f *Config) bool {
			return strings.Join(f.udp, ",") == "127.0.0.1:53" && strings.Join(f.tcp, ",") == "127.0.0.1:53" &&
				f.sockets >= 1 && f.inflight == defaultInflight && f.logEvery == 0 && !f.poller
		}},
		{"frontend 127.0.0.1:53 {\n wait poller\n }", func(f *Config) bool { return f.poller }},
		{"frontend 127.0.0.1:53 {\n wait thread\n }", func(f *Config) bool { return !f.poller }},
		{"frontend udp://[::1]:53 tcp://127.0.0.1:53 dns://:5353 {\n sockets 4\n inflight 10\n log 100\n }", func(f *Config) bool {
			return strings.Join(f.udp, ",") == "[::1]:53,:5353" && strings.Join(f.tcp, ",") == "127.0.0.1:53,:5353" &&
				f.sockets == 4 && f.inflight == 10 && f.logEvery == 100
		}},
	}
	for _, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		c.Next()
		f, err := Parse(c, c.RemainingArgs())
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if !tc.check(f) {
			t.Errorf("%q: parsed as %+v", tc.input, *f)
		}
	}
}

// TestLimitsOf: the front end's TCP connections get the server's limits,
// CoreDNS's defaults included, and miekg/dns's where a server leaves one
// unset.
func TestLimitsOf(t *testing.T) {
	defaults, err := dnsserver.NewServer("dns://127.0.0.1:53", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		srv  *dnsserver.Server
		want tcpLimits
	}{
		{"CoreDNS's defaults", defaults, tcpLimits{read: 3 * time.Second, idle: 10 * time.Second, queries: -1}},
		{"timeouts", &dnsserver.Server{ReadTimeout: time.Second, IdleTimeout: time.Minute, MaxTCPQueries: 2}, tcpLimits{read: time.Second, idle: time.Minute, queries: 2}},
		{"unset", &dnsserver.Server{}, tcpLimits{read: 2 * time.Second, idle: 8 * time.Second, queries: 128}},
	} {
		if got := limitsOf(tc.srv); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
