package frontend

import (
	"strings"
	"testing"

	"github.com/coredns/caddy"
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
