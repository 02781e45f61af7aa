package adminserver

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/flush"
)

// blockingCache is a Cache whose flushes wait, once they have said they
// began, until released.
type blockingCache struct {
	recordingCache
	began   chan struct{}
	release chan struct{}
}

func (c *blockingCache) Flush(flush.Flush) (admin.Counts, error) {
	c.began <- struct{}{}
	<-c.release
	return admin.Counts{Success: 1}, nil
}

// flushUnderWay opens a listener on 127.0.0.1 with one block whose
// flushes wait, and starts a flush_all on it; once the flush has begun it
// returns the listener's address, where the client's outcome will come,
// the cache (to release the flush) and the block.
func flushUnderWay(t *testing.T) (string, chan string, *blockingCache, *adminBlock) {
	t.Helper()
	const key = "127.0.0.1:0" // the registry's key; the port is the kernel's
	c := &blockingCache{began: make(chan struct{}), release: make(chan struct{})}
	b := &adminBlock{inst: &adminInstance{cfg: adminConfig{addr: key, insecure: true}}, c: c, info: admin.Block{Name: "b"}}
	if err := admins.register(b); err != nil {
		t.Fatal(err)
	}
	admins.mu.Lock()
	addr := admins.servers[key].ln.Addr().String()
	admins.mu.Unlock()
	got := make(chan string, 1)
	go func() {
		resp, err := http.Post("http://"+addr+admin.Prefix+admin.OpFlushAll, "", nil)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- resp.Status + " " + string(body)
	}()
	<-c.began
	return addr, got, c, b
}

// TestAdminCloseDrains: a listener closed by a reload that drops or moves
// admin frees its address at once, so that a listener can open on it
// again, and lets a request under way (a long flush) finish and answer;
// one that outlasts the drain's deadline is cut.
func TestAdminCloseDrains(t *testing.T) {
	addr, got, c, b := flushUnderWay(t)
	admins.unregister(b)
	// The address is free at once: a reload that opens it again binds.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address of a listener closed, with a request under way: %v", err)
	}
	defer ln.Close()
	close(c.release)
	if reply := <-got; !strings.HasPrefix(reply, "200 OK ") || !strings.Contains(reply, `"op": "flush_all"`) {
		t.Errorf("a flush under way when its listener closed: %q, want its reply", reply)
	}

	// Past the deadline, the connection is cut.
	defer func(was time.Duration) { drainTimeout = was }(drainTimeout)
	drainTimeout = time.Millisecond
	_, got, c, b = flushUnderWay(t)
	admins.unregister(b)
	if reply := <-got; !strings.HasPrefix(reply, "error: ") {
		t.Errorf("a flush that outlasted the drain: %q, want the connection cut", reply)
	}
	close(c.release)
}
