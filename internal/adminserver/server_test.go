package adminserver

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
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

// registerInsecure registers a block named b of c with an insecure
// admin listener on 127.0.0.1, and returns the listener's address and
// the block, which the caller unregisters.
func registerInsecure(t *testing.T, c Cache) (string, *adminBlock) {
	t.Helper()
	const key = "127.0.0.1:0" // the registry's key; the port is the kernel's
	b := &adminBlock{inst: &adminInstance{cfg: adminConfig{addr: key, insecure: true}}, c: c, info: admin.Block{Name: "b"}}
	if err := admins.register(b); err != nil {
		t.Fatal(err)
	}
	admins.mu.Lock()
	defer admins.mu.Unlock()
	return admins.servers[key].ln.Addr().String(), b
}

// flushUnderWay opens a listener on 127.0.0.1 with one block whose
// flushes wait, and starts a flush_all on it; once the flush has begun it
// returns the listener's address, where the client's outcome will come,
// the cache (to release the flush) and the block.
func flushUnderWay(t *testing.T) (string, chan string, *blockingCache, *adminBlock) {
	t.Helper()
	c := &blockingCache{began: make(chan struct{}), release: make(chan struct{})}
	addr, b := registerInsecure(t, c)
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

// streamingCache is a Cache whose snapshot writes until a write fails,
// and then says how it ended.
type streamingCache struct {
	recordingCache
	ended chan error
}

func (c *streamingCache) Snapshot(w io.Writer) (int, error) {
	chunk := make([]byte, 64<<10)
	for n := 0; ; n++ {
		if _, err := w.Write(chunk); err != nil {
			c.ended <- err
			return n, err
		}
	}
}

// TestAdminStalledReader: a client that asks for a snapshot and stops
// reading is cut off once a write outlasts writeTimeout, which ends the
// handler's walk of the store.
func TestAdminStalledReader(t *testing.T) {
	defer func(was time.Duration) { writeTimeout = was }(writeTimeout)
	writeTimeout = 50 * time.Millisecond
	c := &streamingCache{ended: make(chan error, 1)}
	addr, b := registerInsecure(t, c)
	defer admins.unregister(b)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The request, and then not a byte of the reply read.
	if _, err := io.WriteString(conn, "GET "+admin.Prefix+admin.OpSnapshot+"?block=b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.ended:
		if err == nil {
			t.Fatal("the snapshot to a stalled reader ended without an error")
		}
	case <-time.After(time.Minute): // a bound on the hang, not a measurement
		t.Fatal("the snapshot to a reader that stopped reading is still writing")
	}
}

// TestAdminRequestBody: a request that declares a body and never sends
// it gets its reply once readTimeout is out, and its connection is closed:
// the server reads the body to its end before it replies, and without a
// deadline a client, token or not, would hold the connection for good.
func TestAdminRequestBody(t *testing.T) {
	defer func(was time.Duration) { readTimeout = was }(readTimeout)
	readTimeout = 50 * time.Millisecond
	addr, b := registerInsecure(t, &recordingCache{})
	defer admins.unregister(b)
	for _, head := range []string{"Content-Length: 100", "Transfer-Encoding: chunked"} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// The request's head, and not a byte of the body it declares.
		if _, err := io.WriteString(conn, "POST "+admin.Prefix+admin.OpFlushAll+" HTTP/1.1\r\nHost: 127.0.0.1\r\n"+head+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(time.Minute)) // a bound on the hang, not a measurement
		reply, err := io.ReadAll(conn)
		if err != nil || !strings.HasPrefix(string(reply), "HTTP/1.1 200 ") {
			t.Errorf("%s and no body: %q, %v; want the reply, and the connection closed", head, reply, err)
		}
	}
}

// walkingCache is a Cache whose walks wait, once they have begun, until
// released.
type walkingCache struct {
	recordingCache
	release chan struct{}
}

func (c *walkingCache) Walk(func(entry.Entry), func() error) error {
	<-c.release
	return nil
}

// TestAdminDumpHeadAtOnce: a dump's reply begins before the walk has
// found an entry, so that a client bounding the wait for a reply to begin
// (compactcache-ctl's --timeout) does not give up on a store whose first
// entries are far into the walk.
func TestAdminDumpHeadAtOnce(t *testing.T) {
	c := &walkingCache{release: make(chan struct{})}
	addr, b := registerInsecure(t, c)
	defer admins.unregister(b)
	defer close(c.release)
	for _, format := range []string{admin.FormatText, admin.FormatJSON} {
		client := &http.Client{Timeout: time.Minute} // a bound on the hang, not a measurement
		resp, err := client.Get("http://" + addr + admin.Prefix + admin.OpDump + "?format=" + format)
		if err != nil {
			t.Fatalf("%s dump, its walk under way: %v; want its reply begun", format, err)
		}
		resp.Body.Close()
	}
}
