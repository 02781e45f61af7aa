package frontend

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTCPPastInflightNotShed: a connection closed past inflight open
// connections, before a byte of a request is read, is no request the
// front end read, and shed (requests answered SERVFAIL past inflight) does
// not count it. It did, in the first block's series.
func TestTCPPastInflightNotShed(t *testing.T) {
	cache := newGatedCache(t)
	cache.once.Do(func() {}) // nothing held
	fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 1}, cache)
	fe.start(chainServer(t, "fe"))
	addr := fe.tcp[0].Addr().String()
	dialTCP(t, addr)
	waitWaiting(t, fe, 1)
	if _, err := readReply(dialTCP(t, addr)); err == nil {
		t.Fatal("a second connection answered by a front end of inflight 1")
	}
	if got := testutil.ToFloat64(fe.blocks[0].fm.Shed); got != 0 {
		t.Errorf("shed %v after a connection closed past inflight, want 0", got)
	}
}
