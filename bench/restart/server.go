//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/admin"
	"github.com/miekg/dns"
)

// env is what the servers of a run share: the build, the work directory,
// the upstream and the ports. Every server the run restarts listens on the
// same address, as a restarted pod does.
type env struct {
	bin, work  string
	capacity   string
	upstream   *upstream
	dns, ready int // the restarted server's DNS and ready plugin ports
	peerDNS    int
	peerAdmin  int
	token      string // the token file of the peer's admin endpoint
	cpu, nice  int
	serial     int // names each server's files apart
}

func (e *env) dnsAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.dns)) }

// server is a CoreDNS process of the run.
type server struct {
	*harness.Proc
	started time.Time // when it was started
}

// serverCorefile is the restarted server's: compactcache, with extra in its
// block, in front of the upstream, and the ready plugin, which reports
// whether a warm-up is under way.
func (e *env) serverCorefile(extra string) string {
	return fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    ready 127.0.0.1:%d
    compactcache {
        capacity %s
%s    }
    forward . %s
}
`, e.dns, e.ready, e.capacity, extra, e.upstream.Addr())
}

// peerCorefile is the peer's, which a warm-up asks: loaded from a snapshot,
// its admin endpoint open with a token.
func (e *env) peerCorefile(snapshot string) string {
	return fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    compactcache {
        capacity %s
        snapshot %s
        admin 127.0.0.1:%d {
            token_file %s
        }
    }
    forward . %s
}
`, e.peerDNS, e.capacity, snapshot, e.peerAdmin, e.token, e.upstream.Addr())
}

// start runs the build with corefile, named name in the work directory.
func (e *env) start(name, corefile string) (*server, error) {
	return e.startBin(e.bin, name, corefile)
}

// startBin is start for the build bin.
func (e *env) startBin(bin, name, corefile string) (*server, error) {
	e.serial++
	started := time.Now()
	p, err := harness.Launch{CPU: e.cpu, Nice: e.nice}.CoreDNS(bin, filepath.Join(e.work, fmt.Sprintf("%02d-%s", e.serial, name)), corefile)
	if err != nil {
		return nil, err
	}
	return &server{Proc: p, started: started}, nil
}

// probe is a name outside the workload: the upstream does not count it.
var probe = dns.Question{Name: "probe.restart.invalid.", Qtype: dns.TypeA, Qclass: dns.ClassINET}

// firstAnswer asks addr until it answers and returns when the answer came:
// time zero of a restart, to within the 2 ms between asks.
func firstAnswer(s *server, addr string, limit time.Duration) (time.Time, error) {
	if _, err := harness.WaitDNS(context.Background(), s.Proc, addr, probe, limit, 2*time.Millisecond); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// The log lines of internal/snapshot's callers the run reads.
var (
	loadedLine  = regexp.MustCompile(`Snapshot \S+: (\d+) entries loaded in (\S+) from`)
	writtenLine = regexp.MustCompile(`Snapshot \S+: (\d+) entries written in (\S+)`)
	warmedLine  = regexp.MustCompile(`Warm-up of .* from \S+: (\d+) entries in (\S+),`)
	failedLine  = regexp.MustCompile(`\[(ERROR|WARNING)\] plugin/compactcache: .*`)
)

// timed is an operation a server logged: how many entries, how long.
type timed struct {
	entries int
	took    time.Duration
	seen    time.Time // when the run read the line
}

// perMillion is the operation's time scaled to a million entries.
func (t timed) perMillion() time.Duration {
	if t.entries == 0 {
		return 0
	}
	return time.Duration(float64(t.took) * 1e6 / float64(t.entries))
}

// findAll returns the operations re logs in text, each line's number of
// entries and its duration.
func findAll(re *regexp.Regexp, text []byte) []timed {
	var out []timed
	for _, m := range re.FindAllSubmatch(text, -1) {
		n, err1 := strconv.Atoi(string(m[1]))
		d, err2 := time.ParseDuration(string(m[2]))
		if err1 == nil && err2 == nil {
			out = append(out, timed{entries: n, took: d})
		}
	}
	return out
}

// logged waits up to limit for the server's log to hold a line re matches
// and returns the first; an error or warning of the plugin ends the wait.
func (s *server) logged(re *regexp.Regexp, limit time.Duration) (timed, error) {
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(s.Log)
		if err != nil {
			return timed{}, err
		}
		if all := findAll(re, b); len(all) > 0 {
			return all[0], nil
		}
		if m := failedLine.Find(b); m != nil {
			return timed{}, fmt.Errorf("%s: %s", s.Name, m)
		}
		if time.Now().After(deadline) {
			return timed{}, fmt.Errorf("%s: no line %q in %s within %v", s.Name, re, s.Log, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watchWrites reads the server's log as it grows, every few milliseconds,
// and notes each snapshot write: when the line came and how long the write
// took, so that the queries sent meanwhile can be picked out. It stops when
// stop is closed and returns the writes seen.
func (s *server) watchWrites(stop <-chan struct{}) <-chan []timed {
	out := make(chan []timed, 1)
	go func() {
		var writes []timed
		var pending []byte
		f, err := os.Open(s.Log)
		if err != nil {
			out <- nil
			return
		}
		defer f.Close()
		buf := make([]byte, 1<<16)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				out <- writes
				return
			case <-t.C:
			}
			n, err := f.Read(buf)
			if n == 0 || err != nil && err != io.EOF {
				continue
			}
			now := time.Now()
			pending = append(pending, buf[:n]...)
			end := bytes.LastIndexByte(pending, '\n')
			if end < 0 {
				continue
			}
			for _, w := range findAll(writtenLine, pending[:end]) {
				w.seen = now
				writes = append(writes, w)
			}
			pending = append(pending[:0], pending[end+1:]...)
		}
	}()
	return out
}

// readyAt polls the ready plugin from the server's start and returns when
// it first said ready; the zero time if it did not within limit.
func (e *env) readyAt(limit time.Duration) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		c := &http.Client{Timeout: 100 * time.Millisecond}
		u := fmt.Sprintf("http://127.0.0.1:%d/ready", e.ready)
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			if resp, err := c.Get(u); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					out <- time.Now()
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		out <- time.Time{}
	}()
	return out
}

// peerBlock is the name the peer's admin endpoint gives its block.
func (e *env) peerBlock() string {
	return fmt.Sprintf("dns://.:%d (bind 127.0.0.1)", e.peerDNS)
}

// relay serves the peer's admin endpoint on a port of its own, with the
// block a warm-up names renamed to the peer's. A warm-up asks for its own
// block's name, which the replicas of a Deployment share; here the peer
// must listen on another port than the restarted server, which names its
// block apart. The stream itself passes as the peer sends it.
func (e *env) relay() (addr string, stop func(), err error) {
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(e.peerAdmin))}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			q := r.In.URL.Query()
			if q.Has(admin.ParamBlock) {
				q.Set(admin.ParamBlock, e.peerBlock())
			}
			r.Out.URL.RawQuery = q.Encode()
		},
		FlushInterval: -1,
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: rp}
	var wg sync.WaitGroup
	wg.Go(func() { hs.Serve(l) })
	return l.Addr().String(), func() {
		hs.Shutdown(context.Background())
		wg.Wait()
	}, nil
}

// copyFile copies a snapshot, so that each server reads the same one.
func copyFile(dst, src string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
